"""A replica frozen with SIGSTOP (the whole process stops: no HTTP, no progress) is detected and restarted.

The simulated engine always runs; the llama.cpp variant runs when ``make llama-server tiny-model`` has built
the real engine (``make test`` builds it; skipped otherwise in a run by hand). Remediation goes through the
local process provider, which has to SIGKILL a stopped process (SIGTERM is not delivered until it is
continued). Both run side by side in one module fixture (see ``frozen``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from health_tools import wait_until
from prometheus_client import CollectorRegistry

from fleetgate.core.health import HealthPolicy
from fleetgate.core.types import HealthState
from fleetgate.engines.llama import llama_command_template, missing_llama_parts
from fleetgate.health import HealthMonitor
from fleetgate.providers.local import LocalProcessProvider, sim_engine_command
from real_engines import need_llama

pytestmark = pytest.mark.timeout(180)


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
        await wait_until(lambda: mon.state(name) == HealthState.HEALTHY, 30)
        os.killpg(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        out = await wait_until(lambda: not mon.routable(name), 30)
        await wait_until(lambda: mon.state(name) == HealthState.HEALTHY, 40)
        back = time.monotonic() - t0
        new = (await prov.list())[0]
        assert new.url == url and new.pid != pid
        return out, back
    finally:
        await mon.stop()


async def _sim_engine() -> tuple[float, float]:
    prov = LocalProcessProvider(
        model="fleetgate-sim", command=sim_engine_command(["--time-scale", "0.05"]), url_from_output=True,
        stop_timeout_s=1.0,
    )  # fmt: skip
    try:
        return await _freeze_detect_restart(prov, "fleetgate-sim", HealthPolicy())  # real defaults
    finally:
        await prov.stop_all()


async def _llama_server() -> tuple[float, float]:
    prov = LocalProcessProvider(
        model="tiny-llama", command=llama_command_template(), url_from_output=False, health_path="/health",
        stop_timeout_s=1.0,
    )  # fmt: skip
    try:
        return await _freeze_detect_restart(prov, "tiny-llama", HealthPolicy())  # real defaults
    finally:
        await prov.stop_all()


Outcome = tuple[float, float] | BaseException


@pytest.fixture(scope="module")
def frozen() -> dict[str, Outcome]:
    """Both freezes at once, each with its own provider and monitor: each waits ~16 s for the real defaults'
    verdict with next to nothing to do meanwhile, so side by side they take the time of one. The llama.cpp
    one runs when the engine is built (its test skips or fails by itself otherwise)."""
    scenarios = {"sim": _sim_engine}
    if not missing_llama_parts():
        scenarios["llama"] = _llama_server

    async def both() -> dict[str, Outcome]:
        done = await asyncio.gather(*(run() for run in scenarios.values()), return_exceptions=True)
        return dict(zip(scenarios, done, strict=True))

    return asyncio.run(both())


def _result(frozen: dict[str, Outcome], which: str) -> tuple[float, float]:
    outcome = frozen[which]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def test_sigstop_sim_engine_detected_and_restarted(frozen: dict[str, Outcome]) -> None:
    out, back = _result(frozen, "sim")
    assert back <= 30.0, (out, back)
    print(f"SIGSTOP sim engine: out of routing after {out:.1f} s, serving again after {back:.1f} s")


def test_sigstop_llama_server_detected_and_restarted(frozen: dict[str, Outcome]) -> None:
    need_llama()
    out, back = _result(frozen, "llama")
    assert back <= 30.0, (out, back)
    print(f"SIGSTOP llama-server: out of routing after {out:.1f} s, serving again after {back:.1f} s")
