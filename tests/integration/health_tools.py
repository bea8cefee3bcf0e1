"""Helpers shared by the health tests on real processes (simulated engines and llama-server)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from fleetgate.core.health import HealthPolicy
from fleetgate.health import HealthMonitor

#: Health settings fast enough for a test to see a fault detected and remediated in seconds.
FAST = HealthPolicy(
    probe_idle_s=1.0,
    probe_timeout_s=1.0,
    suspect_probe_interval_s=0.3,
    progress_grace_s=2.0,
    starting_probe_interval_s=0.2,
    startup_timeout_s=30.0,
)


async def closed_loop_client(
    session: aiohttp.ClientSession,
    mon: HealthMonitor,
    name: str,
    url: str,
    stop: asyncio.Event,
    body: dict[str, Any],
) -> int:
    """Send ``body`` to ``url``'s completions endpoint back to back until ``stop``, feeding each outcome to
    ``mon`` as the gateway would; the number of 200 answers."""
    done = 0
    while not stop.is_set():
        try:
            async with session.post(url + "/v1/completions", json=body) as r:
                await r.read()
                mon.observe_request(name, r.status < 500)
                done += r.status == 200
        except aiohttp.ClientError:
            mon.observe_request(name, False)
            await asyncio.sleep(0.1)
    return done


async def wait_until(cond: Callable[[], bool], within_s: float, step: float = 0.05) -> float:
    """Wait until ``cond()``; returns the seconds it took (fails the test on timeout)."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > within_s:
            raise AssertionError(f"condition not met within {within_s} s")
        await asyncio.sleep(step)
    return time.monotonic() - start
