"""Live autoscaling with the local process provider and real simulated-engine processes.

Load steps from 10 % to 90 % of the fleet's maximum capacity and back. The autoscaler loop (the real one, with
fleetgate's policy on shortened windows: the test takes about half a minute) must scale up on the step, scale
down only after the delay, and every request sent must complete: scale-down drains a replica (no new requests,
in-flight ones finish) before the provider stops it. The dispatcher here is a minimal least-loaded picker in
the test standing in for the gateway, which feeds the same ``DemandMeter``.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

import aiohttp
import pytest

from fleetgate.autoscaler import AutoscalerLoop, provider_counts
from fleetgate.core.autoscale import DemandMeter, build_autoscaler
from fleetgate.providers.base import ReplicaStatus
from fleetgate.providers.local import LocalProcessProvider, sim_engine_command
from step_load import at_rate

pytestmark = pytest.mark.timeout(240)

MODEL = "fleetgate-sim"
#: MU per replica per minute; each request costs 1 MU here: a replica is "full" at 2 requests/s, so the 90 %
#: step sends 7.2 requests/s and reaches the four replicas' worth of evidence in a few seconds
CAPACITY = 120.0
MAX_REPLICAS = 4


class Dispatcher:
    """Least-in-flight picking over running, non-draining replicas; drains on request of the provider."""

    def __init__(self, provider: LocalProcessProvider, meter: DemandMeter) -> None:
        self.provider = provider
        self.meter = meter
        self.inflight: Counter[str] = Counter()
        self.draining: set[str] = set()
        self.sent = 0
        self.ok = 0
        self.failed: list[str] = []
        self.served_by: Counter[str] = Counter()
        self.idle: dict[str, asyncio.Event] = {}

    async def drain(self, name: str, timeout_s: float) -> None:
        self.draining.add(name)
        if self.inflight[name] == 0:
            return
        event = self.idle.setdefault(name, asyncio.Event())
        await asyncio.wait_for(event.wait(), timeout_s)

    async def send(self, session: aiohttp.ClientSession) -> None:
        reps = [
            r
            for r in await self.provider.list()
            if r.status == ReplicaStatus.RUNNING and r.name not in self.draining
        ]
        if not reps:
            self.failed.append("no replica")
            return
        rep = min(reps, key=lambda r: (self.inflight[r.name], self.served_by[r.name]))
        self.inflight[rep.name] += 1
        self.sent += 1
        self.meter.start(1.0)
        try:
            body = {"model": MODEL, "prompt": "hello there", "max_tokens": 64}
            async with session.post(rep.url + "/v1/completions", json=body) as r:
                data = await r.json()
                if r.status == 200 and data.get("choices"):
                    self.ok += 1
                    self.served_by[rep.name] += 1
                else:
                    self.failed.append(f"{rep.name}: HTTP {r.status}")
        except aiohttp.ClientError as exc:
            self.failed.append(f"{rep.name}: {exc!r}")
        finally:
            self.inflight[rep.name] -= 1
            if self.inflight[rep.name] == 0 and rep.name in self.idle:
                self.idle[rep.name].set()
            self.meter.finish(1.0, 1.0, time.monotonic())


async def _drive(
    d: Dispatcher,
    session: aiohttp.ClientSession,
    rps: float,
    seconds: float,
    until: Callable[[], bool] | None = None,
    then_s: float = 0.0,
) -> None:
    """Dispatch at ``rps`` for ``seconds`` (``step_load.at_rate``: with ``until``, stop ``then_s`` after it
    first holds); every request sent is awaited."""
    await at_rate(lambda: d.send(session), rps, seconds, until, then_s)


async def test_step_up_then_down_loses_nothing() -> None:
    meter = DemandMeter(window_s=5.0)
    prov = LocalProcessProvider(
        model=MODEL,
        command=sim_engine_command(["--time-scale", "0.05"]),
        url_from_output=True,
        stop_timeout_s=2.0,
    )
    d = Dispatcher(prov, meter)
    prov.drain_hook = d.drain
    params = {
        "max_replicas": MAX_REPLICAS,
        "stable_window_s": 4.0,
        "panic_window_s": 1.0,
        "scale_down_delay_s": 6.0,
        "scale_up_cooldown_s": 4.0,
        "scale_down_interval_s": 1.0,
        "idle_to_min_s": 600.0,
    }
    loop = AutoscalerLoop(
        deployment=MODEL,
        autoscaler=build_autoscaler("fleetgate", params),
        meter=meter,
        counts=provider_counts(prov),
        target=prov,
        capacity_mu_per_min=CAPACITY,
        interval_s=0.5,
    )
    full_rps = MAX_REPLICAS * CAPACITY / 60.0
    try:
        await prov.scale_to(1)
        await loop.start()
        async with aiohttp.ClientSession() as session:
            await _drive(d, session, 0.1 * full_rps, 6.0)
            assert len(await prov.list()) == 1
            t_step = time.monotonic()

            def at_max() -> bool:
                return any(t >= t_step and n == MAX_REPLICAS for t, n, _, _ in loop.history)

            # 90 % until the fleet is at its maximum, then 5 s more on all four (at most 14 s)
            await _drive(d, session, 0.9 * full_rps, 14.0, until=at_max, then_s=5.0)
            ups = [(t, n) for t, n, _, _ in loop.history if t >= t_step and n > 1]
            assert ups, "no scale-up on the step to 90 %"
            assert max(n for _, n in ups) == MAX_REPLICAS
            t_drop = time.monotonic()

            def scaled_down() -> bool:
                return any(t >= t_drop and n < MAX_REPLICAS for t, n, _, _ in loop.history)

            # 10 % until the first scale-down, then 3 s more while the drained replica stops (at most 20 s)
            await _drive(d, session, 0.1 * full_rps, 20.0, until=scaled_down, then_s=3.0)
        await loop.stop()
        await loop.wait_applied()
        downs = [(t, n) for t, n, _, _ in loop.history if t >= t_drop and n < MAX_REPLICAS]
        assert downs, "no scale-down after the drop"
        assert downs[0][0] - t_drop >= params["scale_down_delay_s"] - 1.0, "scaled down before the delay"
        assert len(await prov.list()) < MAX_REPLICAS
        # Zero lost: every request sent got a complete answer, including on replicas that were drained.
        assert d.failed == [], d.failed[:5]
        assert d.ok == d.sent > 50
        assert len(d.served_by) >= 3
    finally:
        await loop.stop()
        await prov.stop_all()
