"""Fuzz: random bytes and mutated real images never crash the pipeline; a worker is never lost for good."""

from __future__ import annotations

import asyncio
import dataclasses
import io
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from fleetgate.multimodal.image import ImageError, ImageResult, ImageSpec, process_image, vips_module
from fleetgate.multimodal.pool import WorkerCrashedError, WorkerPool

SPEC = ImageSpec(max_edge=64, max_pixels=4_000_000, max_bytes=1_000_000)


def _seeds() -> list[bytes]:
    out = []
    img = Image.linear_gradient("L").resize((96, 80)).convert("RGB")
    for fmt in ("JPEG", "PNG", "WEBP", "GIF", "BMP"):
        buf = io.BytesIO()
        img.save(buf, fmt)
        out.append(buf.getvalue())
    return out


SEEDS = _seeds()


@st.composite
def mutated_images(draw: st.DrawFn) -> bytes:
    """A real image with some bytes flipped, a slice cut out, or garbage appended."""
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 8))):
        pos = draw(st.integers(0, len(data) - 1))
        data[pos] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        a = draw(st.integers(0, len(data)))
        b = draw(st.integers(a, len(data)))
        del data[a:b]
    data += draw(st.binary(max_size=64))
    return bytes(data)


payloads = st.one_of(st.binary(max_size=2048), mutated_images())


BACKENDS = ["pillow", "vips"] if vips_module() is not None else ["pillow"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads, st.sampled_from(BACKENDS))
def test_in_process_only_image_errors(data: bytes, backend: str) -> None:
    try:
        result = process_image(data, dataclasses.replace(SPEC, backend=backend))
    except ImageError as exc:
        assert str(exc)
    else:
        assert isinstance(result, ImageResult) and max(result.width, result.height) <= 64


@pytest.fixture(scope="module")
def pool_loop() -> Iterator[tuple[asyncio.AbstractEventLoop, WorkerPool]]:
    loop = asyncio.new_event_loop()
    pool = WorkerPool(2, task_timeout_s=10.0, memory_mb=1024)
    loop.run_until_complete(pool.start())
    try:
        yield loop, pool
    finally:
        loop.run_until_complete(pool.close())
        loop.close()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads)
def test_pool_survives_fuzz(pool_loop: tuple[asyncio.AbstractEventLoop, WorkerPool], data: bytes) -> None:
    loop, pool = pool_loop
    try:
        loop.run_until_complete(pool.run("image", data, SPEC))
    except (ImageError, WorkerCrashedError):
        pass
    # Whatever the input did, the pool still has its workers and serves a good image next.
    good = loop.run_until_complete(pool.run("image", SEEDS[0], SPEC))
    assert good.width == 64
    assert len(pool.pids()) == 2
