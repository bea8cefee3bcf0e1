"""Fault suite on real simulated-engine processes: the prober detects, removes, restarts and re-admits.

Each test starts real ``fleetgate engine sim`` processes through the local process provider (the same one the
runtime uses), injects a fault with ``POST /admin/fault`` and watches the ``HealthMonitor`` remediate through
the provider (kill + restart on the same address). One test uses the real default settings (about 20-30 s);
the others use shorter timings to keep the suite fast.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from health_tools import FAST, wait_until
from prometheus_client import CollectorRegistry

from fleetgate.core.health import HealthPolicy, Transition
from fleetgate.core.types import HealthState
from fleetgate.health import HealthMonitor
from fleetgate.providers.local import LocalProcessProvider, sim_engine_command

pytestmark = pytest.mark.timeout(180)

MODEL = "fleetgate-sim"


@pytest.fixture
async def provider() -> AsyncIterator[LocalProcessProvider]:
    prov = LocalProcessProvider(
        model=MODEL,
        command=sim_engine_command(["--time-scale", "0.05"]),
        url_from_output=True,
        stop_timeout_s=2.0,
    )
    try:
        yield prov
    finally:
        await prov.stop_all()


async def _replicas(prov: LocalProcessProvider, n: int) -> dict[str, str]:
    reps = await prov.scale_to(n)
    return {r.name: r.url for r in reps}


async def _fault(url: str, kind: str, value: float | None = None) -> None:
    body: dict[str, object] = {"kind": kind}
    if value is not None:
        body["value"] = value
    async with aiohttp.ClientSession() as s, s.post(url + "/admin/fault", json=body) as r:
        assert r.status == 200, await r.text()


async def _complete(url: str, max_tokens: int = 4) -> int:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": max_tokens}) as r,
    ):
        await r.read()
        return r.status


def _monitor(prov: LocalProcessProvider, reg: CollectorRegistry, policy: HealthPolicy) -> HealthMonitor:
    return HealthMonitor(
        model=MODEL,
        policy=policy,
        registry=reg,
        remediator=prov,
        scrape_interval_s=1.0,
        initial_state=HealthState.STARTING,
    )


async def test_hang_with_real_defaults(provider: LocalProcessProvider) -> None:
    """health 200 but no progress: detected, out of routing, restarted and serving again in <= 30 s."""
    reg = CollectorRegistry()
    urls = await _replicas(provider, 2)
    mon = _monitor(provider, reg, HealthPolicy())  # the real defaults
    transitions: list[Transition] = []
    mon.add_listener(transitions.append)
    mon.set_replicas(urls)
    await mon.start()
    try:
        await wait_until(lambda: all(mon.state(n) == HealthState.HEALTHY for n in urls), 20)
        victim, other = sorted(urls)
        old_pid = next(r.pid for r in await provider.list() if r.name == victim)
        await _fault(urls[victim], "hang")
        t0 = time.monotonic()
        out = await wait_until(lambda: not mon.routable(victim), 30)
        back = await wait_until(lambda: mon.state(victim) == HealthState.HEALTHY, 30 - out + 0.5) + out
        total = time.monotonic() - t0
        assert total <= 30.0, f"hang took {total:.1f} s to recover (out of routing after {out:.1f} s)"
        assert back <= 30.0
        # Restarted on the same address by a new process, which serves real requests.
        reps = {r.name: r for r in await provider.list()}
        assert reps[victim].url == urls[victim] and reps[victim].pid != old_pid
        assert await _complete(urls[victim]) == 200
        # The healthy neighbour was never touched.
        assert all(t.replica != other or t.new == HealthState.HEALTHY for t in transitions)
        kinds = [t.new for t in transitions if t.replica == victim]
        assert kinds[-3:] == [HealthState.UNHEALTHY, HealthState.RESTARTING, HealthState.HEALTHY]
        assert (
            reg.get_sample_value(
                "fleetgate_health_remediations_total",
                {
                    "replica": victim,
                    "action": "restart",
                    "reason": "probe_timeout_no_progress",
                    "result": "ok",
                },
            )
            == 1.0
        )
        assert reg.get_sample_value("fleetgate_health_state", {"replica": victim, "state": "healthy"}) == 1.0
        print(f"hang: out of routing after {out:.1f} s, serving again after {back:.1f} s")
    finally:
        await mon.stop()


@pytest.mark.parametrize(("kind", "value"), [("crash", None), ("error_rate", 1.0)])
async def test_crash_and_error_rate_are_restarted(
    provider: LocalProcessProvider, kind: str, value: float | None
) -> None:
    reg = CollectorRegistry()
    urls = await _replicas(provider, 1)
    (name,) = urls
    mon = _monitor(provider, reg, FAST)
    mon.set_replicas(urls)
    await mon.start()
    try:
        await wait_until(lambda: mon.state(name) == HealthState.HEALTHY, 20)
        await _fault(urls[name], kind, value)
        await wait_until(lambda: not mon.routable(name), 15)
        await wait_until(lambda: mon.state(name) == HealthState.HEALTHY, 30)
        assert await _complete(urls[name]) == 200
        reasons = [t.reason for t in mon.events if t.new == HealthState.UNHEALTHY]
        expected = "refused" if kind == "crash" else "http_500"
        assert any(expected in r for r in reasons), reasons
    finally:
        await mon.stop()


async def test_error_rate_seen_by_real_requests(provider: LocalProcessProvider) -> None:
    """The gateway's view (failed real requests) takes a replica out even before any probe runs."""
    urls = await _replicas(provider, 1)
    (name,) = urls
    mon = _monitor(
        provider, CollectorRegistry(), HealthPolicy(probe_idle_s=60.0, starting_probe_interval_s=0.2)
    )
    mon.set_replicas(urls)
    await mon.start()
    try:
        await wait_until(lambda: mon.state(name) == HealthState.HEALTHY, 20)
        await _fault(urls[name], "error_rate", 0.8)
        for _ in range(20):
            status = await _complete(urls[name])
            mon.observe_request(name, status < 500)
            if not mon.routable(name):
                break
        assert not mon.routable(name)
        assert any("error_rate" in t.reason for t in mon.events)
        await wait_until(lambda: mon.state(name) == HealthState.HEALTHY, 30)
    finally:
        await mon.stop()


async def _load(url: str, stop: asyncio.Event, concurrency: int, max_tokens: int) -> int:
    done = 0

    async def worker(s: aiohttp.ClientSession) -> None:
        nonlocal done
        while not stop.is_set():
            body = {"model": MODEL, "prompt": "x " * 2000, "max_tokens": max_tokens}
            try:
                async with s.post(url + "/v1/completions", json=body) as r:
                    await r.read()
                    done += r.status == 200
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(worker(s) for _ in range(concurrency)))
    return done


async def test_busy_replica_with_timed_out_probes_is_never_killed() -> None:
    """Saturated engine, a probe timeout so short every probe fails: /metrics progress keeps it alive."""
    prov = LocalProcessProvider(
        model=MODEL,
        command=sim_engine_command(["--time-scale", "1"]),
        url_from_output=True,
        stop_timeout_s=2.0,
    )
    try:
        urls = await _replicas(prov, 1)
        (name,) = urls
        policy = HealthPolicy(
            probe_idle_s=0.5,
            probe_timeout_s=0.001,  # every probe times out
            suspect_probe_interval_s=0.2,
            progress_grace_s=3.0,
            starting_probe_interval_s=0.2,
        )
        mon = _monitor(prov, CollectorRegistry(), policy)
        mon.set_replicas(urls)
        mon.tracker(name).state = HealthState.HEALTHY  # type: ignore[union-attr]  # skip start-up: probes fail
        stop = asyncio.Event()
        load = asyncio.create_task(_load(urls[name], stop, concurrency=16, max_tokens=200))
        await asyncio.sleep(1.0)
        await mon.start()
        await asyncio.sleep(12.0)
        stop.set()
        done = await load
        await mon.stop()
        rh = mon.tracker(name)
        assert rh is not None and rh.consecutive_failures >= 0
        failed_probes = [t for t in mon.events if "probe_timeout" in t.reason]
        assert failed_probes, "probes should have timed out (the test would prove nothing otherwise)"
        assert not [t for t in mon.events if t.new in (HealthState.UNHEALTHY, HealthState.RESTARTING)]
        assert done > 0
    finally:
        await prov.stop_all()


async def test_slow_replica_is_suspect_not_killed(provider: LocalProcessProvider) -> None:
    urls = await _replicas(provider, 1)
    (name,) = urls
    policy = HealthPolicy(
        probe_idle_s=0.5, probe_timeout_s=5.0, slow_probe_s=0.15, suspect_probe_interval_s=0.3,
        starting_probe_interval_s=0.2,
    )  # fmt: skip
    mon = _monitor(provider, CollectorRegistry(), policy)
    mon.set_replicas(urls)
    await mon.start()
    try:
        await wait_until(lambda: mon.state(name) == HealthState.HEALTHY, 20)
        await _fault(urls[name], "slow", 3000.0)  # a 1-token probe: ~12 ms -> ~0.5 s
        await wait_until(lambda: mon.state(name) == HealthState.SUSPECT, 15)
        await asyncio.sleep(3.0)
        assert mon.routable(name)
        assert not [t for t in mon.events if t.new in (HealthState.UNHEALTHY, HealthState.RESTARTING)]
        await _fault(urls[name], "none")
        await wait_until(lambda: mon.state(name) == HealthState.HEALTHY, 10)
    finally:
        await mon.stop()
