"""The worker process pool: real worker processes, crashes and overruns replaced, loop never blocked."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import time
from collections.abc import AsyncIterator

import pytest
from PIL import Image

from fleetgate.multimodal.image import ImageError, ImageResult, ImageSpec
from fleetgate.multimodal.pool import WorkerCrashedError, WorkerPool


def _jpeg(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 200, 30)).save(buf, "JPEG")
    return buf.getvalue()


@pytest.fixture
async def pool() -> AsyncIterator[WorkerPool]:
    p = WorkerPool(2, task_timeout_s=3.0, memory_mb=1024)
    await p.start()
    try:
        yield p
    finally:
        await p.close()


async def test_processes_images(pool: WorkerPool) -> None:
    result = await pool.run("image", _jpeg(1000, 500), ImageSpec(max_edge=200))
    assert isinstance(result, ImageResult) and (result.width, result.height) == (200, 100)
    assert len(pool.pids()) == 2 and os.getpid() not in pool.pids()


async def test_bad_image_is_an_image_error_and_worker_survives(pool: WorkerPool) -> None:
    pids = pool.pids()
    with pytest.raises(ImageError, match="cannot identify"):
        await pool.run("image", b"junk", ImageSpec())
    assert pool.pids() == pids
    assert pool.stats.image_errors == 1


async def test_dead_worker_is_replaced_and_request_told(pool: WorkerPool) -> None:
    before = set(pool.pids())
    with pytest.raises(WorkerCrashedError, match=r"died \(exit code 7\).*replaced"):
        await pool.run("_crash", 7, None)
    after = set(pool.pids())
    assert len(after) == 2 and len(after - before) == 1
    assert pool.stats.crashes == 1 and pool.stats.restarts == 1
    results = await asyncio.gather(
        *(pool.run("image", _jpeg(300, 300), ImageSpec(max_edge=100)) for _ in range(6))
    )
    assert all(r.width == 100 for r in results)


async def test_killed_by_signal(pool: WorkerPool) -> None:
    task = asyncio.create_task(pool.run("_sleep", 2.0, None))
    await asyncio.sleep(0.3)
    victim = pool.pids()[0]
    os.kill(victim, signal.SIGKILL)
    others = pool.pids()[1:]
    for pid in others:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerCrashedError, match="signal 9"):
        await task
    result = await pool.run("image", _jpeg(50, 50), ImageSpec())
    assert result.width == 50


async def test_overrun_task_is_stopped_and_replaced() -> None:
    pool = WorkerPool(1, task_timeout_s=0.3)
    try:
        with pytest.raises(WorkerCrashedError, match=r"longer than 0\.3 s"):
            await pool.run("_sleep", 5.0, None)
        assert pool.stats.timeouts == 1
        assert (await pool.run("image", _jpeg(20, 20), ImageSpec())).width == 20
    finally:
        await pool.close()


async def test_event_loop_stays_free_while_workers_busy(pool: WorkerPool) -> None:
    """A 50 ms ticker keeps ticking on time while both workers decode large images."""
    big = _jpeg(4000, 3000)
    lags: list[float] = []

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        for _ in range(15):
            t = loop.time()
            await asyncio.sleep(0.02)
            lags.append(loop.time() - t - 0.02)

    work = asyncio.gather(*(pool.run("naive", big, ImageSpec()) for _ in range(4)))
    await asyncio.gather(ticker(), work)
    assert max(lags) < 0.2, lags


async def test_cancelled_request_does_not_lose_the_worker(pool: WorkerPool) -> None:
    task = asyncio.create_task(pool.run("_sleep", 0.3, None))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    start = time.monotonic()
    results = await asyncio.gather(*(pool.run("image", _jpeg(30, 30), ImageSpec()) for _ in range(4)))
    assert len(results) == 4 and time.monotonic() - start < 5


async def test_large_payloads_cross_the_pipe_whole(pool: WorkerPool) -> None:
    """Multi-MB tasks and replies are written and read in many partial chunks by the event loop (the
    socket buffer holds far less): each arrives whole and in order, several at once."""
    import base64
    import random

    rng = random.Random(3)
    noisy = Image.frombytes("RGB", (1200, 900), rng.randbytes(1200 * 900 * 3))
    buf = io.BytesIO()
    noisy.save(buf, "PNG")
    payload = base64.b64encode(buf.getvalue()).decode()  # ~4 MB of base64 text
    assert len(payload) > 3_000_000
    spec = ImageSpec(max_edge=1200, output_format="png", max_bytes=8 * 1024 * 1024)
    results = await asyncio.gather(*(pool.run("image", payload, spec) for _ in range(3)))
    for result in results:
        assert (result.width, result.height) == (1200, 900)
        assert len(result.data_url) > 1_000_000  # the reply is large too
    assert len({r.data_url for r in results}) == 1
