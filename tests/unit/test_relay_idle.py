"""``gateway.continuation.relay``'s idle timeout (one timer re-armed lazily, not one per chunk)."""

from __future__ import annotations

import asyncio
import time

import pytest

from fleetgate.core.openai import StreamTracker
from fleetgate.gateway.continuation import relay


class _Upstream:
    """An upstream body: ``chunks`` at ``gap_s`` apart, then (``stall``) nothing more, else the end."""

    def __init__(self, chunks: list[bytes], gap_s: float, stall: bool) -> None:
        self.chunks = list(chunks)
        self.gap_s = gap_s
        self.stall = stall
        self.eof = False

    async def readany(self) -> bytes:
        if not self.chunks:
            if self.stall:
                await asyncio.sleep(3600)
            self.eof = True
            return b""
        await asyncio.sleep(self.gap_s)
        return self.chunks.pop(0)

    def at_eof(self) -> bool:
        return self.eof


class _Client:
    def __init__(self) -> None:
        self.data = b""

    async def write(self, data: bytes) -> None:
        self.data += data


def _events(n: int) -> list[bytes]:
    return [b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n' for _ in range(n)]


def test_chunks_closer_than_the_idle_timeout_never_time_out() -> None:
    async def main() -> bytes:
        client = _Client()
        # 8 chunks 0.1 s apart: 0.8 s in all, far beyond the 0.3 s idle timeout, but no gap reaches it
        await relay(client, _Upstream(_events(8), 0.1, stall=False), StreamTracker(), 0.3)  # type: ignore[arg-type]
        return client.data

    assert asyncio.run(main()).count(b"data:") == 8


def test_a_stall_times_out_about_idle_s_after_the_last_chunk() -> None:
    async def main() -> tuple[float, bytes]:
        client = _Client()
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await relay(client, _Upstream(_events(3), 0.1, stall=True), StreamTracker(), 0.4)  # type: ignore[arg-type]
        return time.monotonic() - t0, client.data

    elapsed, data = asyncio.run(main())
    assert data.count(b"data:") == 3
    assert 0.3 + 0.4 - 0.05 <= elapsed < 0.3 + 0.4 + 1.5  # 3 chunks, then the idle timeout (margin: load)


def test_an_outside_cancellation_stays_a_cancellation() -> None:
    async def main() -> None:
        task = asyncio.ensure_future(
            relay(_Client(), _Upstream(_events(1), 0.0, stall=True), StreamTracker(), 30.0)  # type: ignore[arg-type]
        )
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    asyncio.run(main())
