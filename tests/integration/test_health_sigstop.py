"""A replica frozen with SIGSTOP (the whole process stops: no HTTP, no progress) is detected and restarted.

The simulated engine always runs; the llama.cpp variant runs when ``make llama-server tiny-model`` has built
the real engine (``make test`` builds it; skipped otherwise in a run by hand). Remediation goes through the
local process provider, which has to SIGKILL a stopped process (SIGTERM is not delivered until it is
continued).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from fleetgate.core.health import HealthPolicy
from fleetgate.core.types import HealthState
from fleetgate.health import HealthMonitor
from fleetgate.providers.local import LocalProcessProvider, sim_engine_command
from real_engines import need_llama

pytestmark = pytest.mark.timeout(180)


async def _wait(cond: Callable[[], bool], within_s: float) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > within_s:
            raise AssertionError(f"condition not met within {within_s} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def _freeze_detect_restart(
    prov: LocalProcessProvider, model: str, policy: HealthPolicy
) -> tuple[float, float]:
    reps = await prov.scale_to(1)
    name, url, pid = reps[0].name, reps[0].url, reps[0].pid
    assert pid is not None
    mon = HealthMonitor(
        model=model, policy=policy, registry=CollectorRegistry(), remediator=prov, scrape_interval_s=1.0
    )
    mon.set_replicas({name: url})
    await mon.start()
    try:
        await _wait(lambda: mon.state(name) == HealthState.HEALTHY, 30)
        os.killpg(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        out = await _wait(lambda: not mon.routable(name), 30)
        await _wait(lambda: mon.state(name) == HealthState.HEALTHY, 40)
        back = time.monotonic() - t0
        new = (await prov.list())[0]
        assert new.url == url and new.pid != pid
        return out, back
    finally:
        await mon.stop()


async def test_sigstop_sim_engine_detected_and_restarted() -> None:
    prov = LocalProcessProvider(
        model="fleetgate-sim", command=sim_engine_command(["--time-scale", "0.05"]), url_from_output=True,
        stop_timeout_s=1.0,
    )  # fmt: skip
    try:
        out, back = await _freeze_detect_restart(prov, "fleetgate-sim", HealthPolicy())  # real defaults
        assert back <= 30.0, (out, back)
        print(f"SIGSTOP sim engine: out of routing after {out:.1f} s, serving again after {back:.1f} s")
    finally:
        await prov.stop_all()


async def test_sigstop_llama_server_detected_and_restarted() -> None:
    from fleetgate.engines.llama import llama_command_template

    need_llama()
    prov = LocalProcessProvider(
        model="tiny-llama", command=llama_command_template(), url_from_output=False, health_path="/health",
        stop_timeout_s=1.0,
    )  # fmt: skip
    try:
        out, back = await _freeze_detect_restart(prov, "tiny-llama", HealthPolicy())  # real defaults
        assert back <= 30.0, (out, back)
        print(f"SIGSTOP llama-server: out of routing after {out:.1f} s, serving again after {back:.1f} s")
    finally:
        await prov.stop_all()
