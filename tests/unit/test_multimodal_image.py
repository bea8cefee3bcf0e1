"""Image decode/validate/resize/re-encode (the worker-side code, called in-process here)."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import pytest
from PIL import Image

from fleetgate.multimodal.image import (
    ImageError,
    ImageSpec,
    _use_vips,
    decode_base64,
    process_image,
    process_naive,
    vips_module,
)


def encode(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def gradient(w: int, h: int, mode: str = "RGB") -> Image.Image:
    img = Image.linear_gradient("L").resize((w, h))
    return img.convert(mode) if mode != "L" else img


def png_with_size(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` but whose pixel data is a few bytes (a bomb)."""
    raw = encode(Image.new("L", (4, 4)), "PNG")
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    patched = struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk) & 0xFFFFFFFF)
    return raw[:8] + patched + raw[8 + 8 + 13 + 4 :]


def data_image(url: str) -> Image.Image:
    head, _, payload = url.partition(",")
    assert head.startswith("data:image/") and head.endswith(";base64")
    return Image.open(io.BytesIO(base64.b64decode(payload)))


SPEC = ImageSpec(max_edge=336, max_pixels=5_000_000, max_bytes=4_000_000)
HAS_VIPS = vips_module() is not None
BACKENDS = [
    "pillow",
    pytest.param("vips", marks=pytest.mark.skipif(not HAS_VIPS, reason="pyvips not installed")),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_jpeg_backends_agree(backend: str) -> None:
    """Both decoders give the same size, orientation handling and errors for JPEG input."""
    spec = ImageSpec(max_edge=336, backend=backend)
    src = gradient(1600, 1200)
    raw = encode(src, "JPEG", quality=95)
    result = process_image(raw, spec)
    assert (result.width, result.height) == (336, 252) and result.source_format == "JPEG"
    out = data_image(result.data_url).convert("L")
    ref = src.convert("L").resize((336, 252))
    diff = sum(abs(a - b) for a, b in zip(out.tobytes(), ref.tobytes(), strict=True)) / (336 * 252)
    assert diff < 4.0
    exif = Image.Exif()
    exif[0x0112] = 6
    rotated = process_image(encode(gradient(400, 200), "JPEG", exif=exif), spec)
    assert rotated.height > rotated.width
    with pytest.raises(ImageError, match="corrupt or truncated"):
        process_image(raw[: len(raw) // 2], spec)
    cmyk = process_image(encode(Image.new("CMYK", (500, 400), (0, 0, 0, 0)), "JPEG"), spec)
    assert data_image(cmyk.data_url).mode == "RGB"


def test_auto_backend_uses_vips_only_for_jpeg() -> None:
    assert _use_vips(ImageSpec(backend="auto"), "JPEG") is HAS_VIPS
    assert not _use_vips(ImageSpec(backend="auto"), "PNG")
    assert not _use_vips(ImageSpec(backend="pillow"), "JPEG")
    assert not _use_vips(ImageSpec(), "JPEG")  # Pillow by default
    assert not _use_vips(ImageSpec(output_format="original"), "JPEG")


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "GIF", "BMP"])
def test_large_image_is_resized_to_max_edge(fmt: str) -> None:
    raw = encode(gradient(1200, 800), fmt)
    result = process_image(raw, SPEC)
    assert (result.width, result.height) == (336, 224)
    assert (result.source_width, result.source_height, result.source_format) == (1200, 800, fmt)
    out = data_image(result.data_url)
    assert out.format == "JPEG" and out.size == (336, 224)


def test_small_image_keeps_its_size_and_base64_input_works() -> None:
    raw = encode(gradient(100, 60), "PNG")
    result = process_image(base64.b64encode(raw).decode(), SPEC)
    assert (result.width, result.height) == (100, 60)


def test_draft_path_keeps_content() -> None:
    """The draft/reduce fast path must give (nearly) the same picture as a full decode + Lanczos."""
    src = gradient(2000, 1000)
    raw = encode(src, "JPEG", quality=95)
    fast = data_image(process_image(raw, SPEC).data_url).convert("L")
    slow = data_image(process_naive(raw, SPEC).data_url).convert("L")
    assert fast.size == slow.size
    diff = sum(abs(a - b) for a, b in zip(fast.tobytes(), slow.tobytes(), strict=True)) / (
        fast.width * fast.height
    )
    assert diff < 3.0


def test_png_output_and_original_output() -> None:
    raw = encode(gradient(50, 40, "RGBA"), "PNG")
    png = process_image(raw, ImageSpec(output_format="png"))
    assert png.data_url.startswith("data:image/png;base64,")
    original = process_image(raw, ImageSpec(output_format="original"))
    assert original.data_url == "data:image/png;base64," + base64.b64encode(raw).decode()
    big = process_image(encode(gradient(1000, 500), "PNG"), ImageSpec(output_format="original", max_edge=100))
    assert big.data_url.startswith("data:image/png;base64,") and big.width == 100


def test_alpha_flattened_for_jpeg() -> None:
    img = Image.new("RGBA", (20, 20), (0, 0, 0, 0))
    out = data_image(process_image(encode(img, "PNG"), SPEC).data_url).convert("RGB")
    pixel = out.getpixel((10, 10))
    assert isinstance(pixel, tuple) and pixel[0] > 240  # transparent -> white, not black


def test_exif_orientation_applied() -> None:
    img = gradient(400, 200)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    raw = encode(img, "JPEG", exif=exif)
    result = process_image(raw, SPEC)
    assert result.height > result.width


def test_decompression_bomb_refused_from_header() -> None:
    bomb = png_with_size(100_000, 100_000)
    with pytest.raises(ImageError, match=r"100000x100000 .*refused before decoding"):
        process_image(bomb, SPEC)


def test_real_bomb_refused() -> None:
    bomb = encode(Image.new("L", (4000, 4000)), "PNG")  # 16 MP that compresses to a few KB
    assert len(bomb) < 100_000
    with pytest.raises(ImageError, match="more than the limit of 1000000"):
        process_image(bomb, ImageSpec(max_pixels=1_000_000))
    with pytest.raises(ImageError, match="more than the limit"):
        process_naive(bomb, ImageSpec(max_pixels=1_000_000))


def test_unsupported_format() -> None:
    raw = encode(gradient(30, 30), "TIFF")
    with pytest.raises(ImageError, match="unsupported image format TIFF; allowed: JPEG, PNG"):
        process_image(raw, SPEC)


def test_corrupt_and_truncated() -> None:
    with pytest.raises(ImageError, match="cannot identify the image format"):
        process_image(b"definitely not an image", SPEC)
    raw = encode(gradient(800, 800), "JPEG")
    with pytest.raises(ImageError, match="corrupt or truncated"):
        process_image(raw[: len(raw) // 3], SPEC)
    png = encode(gradient(300, 300), "PNG")
    with pytest.raises(ImageError, match="corrupt or truncated"):
        process_image(png[: len(png) // 2], SPEC)


def test_empty_and_oversized_bytes() -> None:
    with pytest.raises(ImageError, match="empty"):
        process_image(b"", SPEC)
    with pytest.raises(ImageError, match="more than the limit of 10 bytes"):
        process_image(encode(gradient(10, 10), "PNG"), ImageSpec(max_bytes=10))
    with pytest.raises(ImageError, match="larger than the limit"):
        process_image("A" * 1000, ImageSpec(max_bytes=100))


def test_base64_variants() -> None:
    data = bytes(range(256))
    assert decode_base64(base64.b64encode(data).decode(), 1000) == data
    assert decode_base64(base64.urlsafe_b64encode(data).decode().rstrip("="), 1000) == data
    with pytest.raises(ImageError, match="not valid base64"):
        decode_base64("@@@@", 1000)
