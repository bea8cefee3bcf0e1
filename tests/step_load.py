"""A fixed-rate request load for the step-load autoscaling tests (the local provider's in
tests/integration/test_serve_control.py and the Kubernetes provider's in tests/kubernetes): every request sent
is awaited and must come back complete."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp


class Load:
    """Requests through the gateway at a fixed rate; every one must come back complete."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        self.url = url
        self.body = body
        self.sent = 0
        self.ok = 0
        self.failed: list[str] = []

    async def one(self, session: aiohttp.ClientSession) -> None:
        self.sent += 1
        try:
            async with session.post(self.url + "/v1/completions", json=self.body) as r:
                data = await r.json(content_type=None)
                if r.status == 200 and data.get("choices"):
                    self.ok += 1
                else:
                    self.failed.append(f"HTTP {r.status}: {str(data)[:200]}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.failed.append(repr(exc))

    async def drive(
        self,
        session: aiohttp.ClientSession,
        rps: float,
        seconds: float,
        until: Callable[[], bool] | None = None,
        then_s: float = 0.0,
    ) -> None:
        """``at_rate`` with this load's requests."""
        await at_rate(lambda: self.one(session), rps, seconds, until, then_s)


async def at_rate(
    one: Callable[[], Awaitable[None]],
    rps: float,
    seconds: float,
    until: Callable[[], bool] | None = None,
    then_s: float = 0.0,
) -> None:
    """Start ``one()`` at ``rps`` for ``seconds``; with ``until``, stop ``then_s`` after it first holds (the
    phase has shown what it is for) if that comes earlier. Every request started is awaited."""
    tasks = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if until is not None and until():
            end = min(end, time.monotonic() + then_s)
            until = None
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(1.0 / rps)
    await asyncio.gather(*tasks)
