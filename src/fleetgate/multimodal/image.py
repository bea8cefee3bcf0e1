"""Decode, validate, resize and re-encode one image (runs inside a worker process; pure CPU, no I/O).

Checks first, always with Pillow reading only the header: format allow-list, and the pixel count, so a
decompression bomb is refused before a single pixel is decoded. Then the path chosen by measurement (see
docs/benchmarks.md): Pillow's ``thumbnail``, which lets the JPEG decoder scale by 1/2..1/8 while decoding
(``draft``), ``reduce``s other formats by whole factors, and finishes with one bicubic resample; 4x faster
than a full decode + Lanczos on a 1920x1440 photo, on par with libvips' shrink-on-load ``thumbnail`` (used
for JPEG with ``backend: vips|auto`` when pyvips is installed) and OpenCV's reduced decode.
``process_naive`` is the textbook version (full decode, one Lanczos resize), the benchmark baseline.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageOps, UnidentifiedImageError

_MIME = {
    "JPEG": "image/jpeg",
    "PNG": "image/png",
    "WEBP": "image/webp",
    "GIF": "image/gif",
    "BMP": "image/bmp",
}


class ImageError(Exception):
    """The image is unusable; the message says why and goes to the client in a 400."""


@dataclass(frozen=True, slots=True)
class ImageSpec:
    """Limits and target of one image (picklable: it travels to the worker with the bytes)."""

    max_edge: int = 336
    output_format: str = "jpeg"  # jpeg | png | webp | original
    jpeg_quality: int = 90
    max_pixels: int = 40_000_000
    max_bytes: int = 10 * 1024 * 1024
    allowed_formats: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
    backend: str = "pillow"  # pillow | vips | auto (vips and auto: pyvips for JPEG when installed)


_VIPS: Any = None


def vips_module() -> Any:
    """``pyvips`` when it and libvips load (the ``pyvips[binary]`` wheels), else ``None``. Cached."""
    global _VIPS
    if _VIPS is None:
        try:
            import pyvips

            _VIPS = pyvips
        except Exception:  # not installed, or libvips missing: Pillow does everything
            _VIPS = False
    return _VIPS or None


def _use_vips(spec: ImageSpec, source_format: str) -> bool:
    """pyvips only ever decodes JPEG here (its loader reports truncation with ``fail_on``; its PNG loader
    let a truncated file through in tests). Measured on par with Pillow's draft path (docs/benchmarks.md),
    so it is opt-in."""
    if spec.backend == "pillow" or source_format != "JPEG" or spec.output_format == "original":
        return False
    return vips_module() is not None


@dataclass(frozen=True, slots=True)
class ImageResult:
    """The processed image as a data URL, its final size and what came in."""

    data_url: str
    width: int
    height: int
    source_format: str
    source_width: int
    source_height: int


def decode_base64(payload: str | bytes, max_bytes: int) -> bytes:
    """Base64 (standard or URL-safe, padding optional) -> bytes, refusing anything above ``max_bytes``."""
    if len(payload) > (max_bytes * 4) // 3 + 8:
        raise ImageError(f"image data is larger than the limit of {max_bytes} bytes")
    text = payload.encode("ascii", "replace") if isinstance(payload, str) else payload
    text = text.strip()
    if b"-" in text or b"_" in text:
        text = text.replace(b"-", b"+").replace(b"_", b"/")
    missing = -len(text) % 4
    if missing:
        text += b"=" * missing
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"image data is not valid base64: {exc}") from exc


def _open_checked(raw: bytes, spec: ImageSpec) -> Image.Image:
    """Open lazily (header only) and check size, format and pixel count before decoding anything."""
    if not raw:
        raise ImageError("image data is empty")
    if len(raw) > spec.max_bytes:
        raise ImageError(f"image is {len(raw)} bytes, more than the limit of {spec.max_bytes} bytes")
    # Pillow's own guard would fire with a vaguer message; the check below reads the same header and is
    # authoritative (also refuses bombs Pillow lets through with only a warning).
    Image.MAX_IMAGE_PIXELS = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(raw))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"image has too many pixels (limit {spec.max_pixels}): {exc}") from exc
    except UnidentifiedImageError as exc:
        raise ImageError("cannot identify the image format: the data is corrupt or not an image") from exc
    except Exception as exc:
        raise ImageError(f"cannot read the image header: {exc.__class__.__name__}: {exc}") from exc
    fmt = img.format or "unknown"
    if fmt not in spec.allowed_formats:
        img.close()
        raise ImageError(f"unsupported image format {fmt}; allowed: {', '.join(spec.allowed_formats)}")
    width, height = img.size
    if width <= 0 or height <= 0:
        img.close()
        raise ImageError(f"image has an invalid size {width}x{height}")
    if width * height > spec.max_pixels:
        img.close()
        raise ImageError(
            f"image is {width}x{height} = {width * height} pixels, more than the limit of {spec.max_pixels} "
            "(refused before decoding)"
        )
    return img


def _encode(img: Image.Image, spec: ImageSpec, raw: bytes, source_format: str, resized: bool) -> str:
    fmt = spec.output_format
    if fmt == "original" and not resized:
        mime = _MIME.get(source_format, "application/octet-stream")
        return f"data:{mime};base64," + base64.b64encode(raw).decode("ascii")
    if fmt == "original":
        fmt = "png" if source_format in ("PNG", "GIF", "BMP") else "jpeg"
    out = io.BytesIO()
    if fmt == "jpeg":
        if img.mode != "RGB":
            img = _flatten(img)
        img.save(out, "JPEG", quality=spec.jpeg_quality)
    elif fmt == "webp":
        if img.mode not in ("RGB", "RGBA"):
            img = img.convert("RGBA" if "A" in img.getbands() else "RGB")
        img.save(out, "WEBP", quality=spec.jpeg_quality, method=0)
    else:
        if img.mode not in ("RGB", "RGBA", "L", "LA"):
            img = img.convert("RGBA" if img.info.get("transparency") is not None else "RGB")
        img.save(out, "PNG", compress_level=1)
    return f"data:image/{fmt};base64," + base64.b64encode(out.getbuffer()).decode("ascii")


def _flatten(img: Image.Image) -> Image.Image:
    """Any mode -> RGB; transparent pixels over white (what a viewer shows)."""
    if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return img.convert("RGB")


def _decode_error(exc: BaseException) -> ImageError:
    if isinstance(exc, MemoryError):
        return ImageError("image needs more memory to decode than a worker may use")
    if isinstance(exc, Image.DecompressionBombError):
        return ImageError(f"image has too many pixels: {exc}")
    return ImageError(f"image data is corrupt or truncated: {exc.__class__.__name__}: {exc}")


def _process_vips(raw: bytes, spec: ImageSpec, source_format: str, sw: int, sh: int) -> ImageResult:
    """Shrink-on-load decode + resize + encode in libvips (EXIF orientation applied by ``thumbnail``)."""
    pyvips = vips_module()
    try:
        thumb = pyvips.Image.thumbnail_buffer(
            raw, spec.max_edge, height=spec.max_edge, size="down", option_string="fail_on=truncated"
        )
        if thumb.hasalpha() and spec.output_format == "jpeg":
            thumb = thumb.flatten(background=[255] * (thumb.bands - 1))
        if thumb.interpretation not in ("srgb", "b-w", "rgb"):
            thumb = thumb.colourspace("srgb")
        if spec.output_format == "png":
            data = thumb.pngsave_buffer(compression=1)
        elif spec.output_format == "webp":
            data = thumb.webpsave_buffer(Q=spec.jpeg_quality)
        else:
            data = thumb.jpegsave_buffer(Q=spec.jpeg_quality)
        width, height = thumb.width, thumb.height
    except pyvips.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise ImageError(f"image data is corrupt or truncated: {first}") from exc
    url = f"data:image/{spec.output_format};base64," + base64.b64encode(data).decode("ascii")
    return ImageResult(url, width, height, source_format, sw, sh)


def process_image(payload: bytes | str, spec: ImageSpec) -> ImageResult:
    """The fast path: header checks, draft/reduce downscale, re-encode. ``str`` payloads are base64."""
    raw = decode_base64(payload, spec.max_bytes) if isinstance(payload, str) else payload
    img = _open_checked(raw, spec)
    source_format = img.format or "unknown"
    sw, sh = img.size
    if _use_vips(spec, source_format):
        img.close()
        return _process_vips(raw, spec, source_format, sw, sh)
    try:
        with img:
            # Pillow sets ``n_frames`` only on formats that can hold several frames (GIF, WebP, ...)
            if getattr(img, "n_frames", 1) > 1:
                img.seek(0)  # animations: the first frame
            resized = max(sw, sh) > spec.max_edge
            if resized:
                # draft() inside thumbnail: JPEG decodes straight to the smallest 1/2..1/8 scale that is
                # still >= the target, then one bicubic resample (reducing_gap=1: measured fastest, and a
                # 1-2x bicubic step after DCT scaling keeps the picture; see docs/benchmarks.md).
                img.thumbnail((spec.max_edge, spec.max_edge), Image.Resampling.BICUBIC, reducing_gap=1.0)
            else:
                img.load()
            out = ImageOps.exif_transpose(img) if img.getexif().get(0x0112, 1) != 1 else img
            data_url = _encode(out, spec, raw, source_format, resized or out is not img)
            width, height = out.size
    except ImageError:
        raise
    except Exception as exc:  # anything the decoders raise on hostile input
        raise _decode_error(exc) from exc
    return ImageResult(data_url, width, height, source_format, sw, sh)


def process_naive(payload: bytes | str, spec: ImageSpec) -> ImageResult:
    """Benchmark baseline: full-resolution decode, RGB conversion, one Lanczos resize, JPEG encode.

    Same checks as ``process_image`` (a baseline that accepts bombs would not be a fair comparison).
    """
    raw = decode_base64(payload, spec.max_bytes) if isinstance(payload, str) else payload
    img = _open_checked(raw, spec)
    source_format = img.format or "unknown"
    sw, sh = img.size
    try:
        with img:
            rgb = img.convert("RGB")
            scale = min(1.0, spec.max_edge / max(sw, sh))
            size = (max(1, round(sw * scale)), max(1, round(sh * scale)))
            out = rgb.resize(size, Image.Resampling.LANCZOS) if scale < 1.0 else rgb
            buf = io.BytesIO()
            out.save(buf, "JPEG", quality=spec.jpeg_quality)
    except Exception as exc:
        raise _decode_error(exc) from exc
    data_url = "data:image/jpeg;base64," + base64.b64encode(buf.getbuffer()).decode("ascii")
    return ImageResult(data_url, size[0], size[1], source_format, sw, sh)
