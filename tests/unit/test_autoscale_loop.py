"""The asyncio autoscaler loop and the demand meter, with an in-memory provider (no processes here; the
live local-provider run is in the integration tests)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from fleetgate.autoscaler import AutoscalerLoop, ReplicaCounts
from fleetgate.core.autoscale import DemandMeter, build_autoscaler


def test_demand_meter_window_and_inflight() -> None:
    m = DemandMeter(window_s=60.0)
    m.start(10.0)
    m.start(5.0)
    assert m.inflight_mu == 15.0 and m.inflight_requests == 2
    m.finish(10.0, 12.0, now_s=100.0)
    assert m.inflight_mu == 5.0 and m.inflight_requests == 1
    assert m.settled_mu_per_min(100.5) == pytest.approx(12.0)
    m.finish(5.0, 3.0, now_s=130.0)
    assert m.settled_mu_per_min(130.0) == pytest.approx(15.0)
    assert m.settled_mu_per_min(161.0) == pytest.approx(3.0)  # the first one left the window
    assert m.settled_mu_per_min(200.0) == 0.0
    half = DemandMeter(window_s=30.0)
    half.finish(0.0, 30.0, now_s=1.0)
    assert half.settled_mu_per_min(1.0) == pytest.approx(60.0)  # per-minute rate


class MemoryProvider:
    """Replicas become ready ``start_s`` after being asked for (like engines with a cold start)."""

    def __init__(self, replicas: int, start_s: float) -> None:
        self.target = replicas
        self.ready = replicas
        self.start_s = start_s
        self.calls: list[int] = []

    async def scale_to(self, replicas: int) -> None:
        self.calls.append(replicas)
        self.target = replicas
        if replicas < self.ready:
            self.ready = replicas
            return
        await asyncio.sleep(self.start_s)
        self.ready = self.target

    def counts(self) -> ReplicaCounts:
        return ReplicaCounts(current=self.target, ready=self.ready, starting=self.target - self.ready)


async def test_loop_scales_in_background_and_exports_gauges() -> None:
    reg = CollectorRegistry()
    meter = DemandMeter()
    prov = MemoryProvider(1, start_s=0.3)
    clock = {"t": 0.0}
    loop = AutoscalerLoop(
        deployment="m",
        autoscaler=build_autoscaler("fleetgate", {"max_replicas": 10}),
        meter=meter,
        counts=prov.counts,
        target=prov,
        capacity_mu_per_min=100.0,
        registry=reg,
        clock=lambda: clock["t"],
    )
    for _ in range(5):
        meter.start(100.0)  # 500 MU in flight: ceil(500 / 70) = 8 replicas at 70 %
    for _ in range(10):
        clock["t"] += 1.0
        await loop.step()  # never blocks on the slow start
        await asyncio.sleep(0)
    assert prov.calls and max(prov.calls) == 8
    assert loop.applying or prov.ready == 8
    await loop.wait_applied()
    assert prov.ready == 8
    assert reg.get_sample_value("fleetgate_autoscaler_desired_replicas", {"deployment": "m"}) == 8
    assert reg.get_sample_value("fleetgate_autoscaler_demand_mu_per_minute", {"deployment": "m"}) == 500
    util = reg.get_sample_value("fleetgate_autoscaler_utilisation", {"deployment": "m"})
    assert util is not None and util > 0
    await loop.stop()


async def test_keda_mode_only_exports() -> None:
    reg = CollectorRegistry()
    meter = DemandMeter()
    meter.start(300.0)
    loop = AutoscalerLoop(
        deployment="m",
        autoscaler=build_autoscaler("fleetgate"),
        meter=meter,
        counts=lambda: ReplicaCounts(1, 1, 0),
        target=None,
        capacity_mu_per_min=100.0,
        registry=reg,
    )
    assert await loop.step() == 5
    assert reg.get_sample_value("fleetgate_autoscaler_desired_replicas", {"deployment": "m"}) == 5


async def test_loop_runs_periodically_and_stops() -> None:
    prov = MemoryProvider(2, start_s=0.0)
    loop = AutoscalerLoop(
        deployment="m",
        autoscaler=build_autoscaler("static", {"replicas": 3}),
        meter=DemandMeter(),
        counts=prov.counts,
        target=prov,
        capacity_mu_per_min=100.0,
        interval_s=0.01,
    )
    await loop.start()
    await asyncio.sleep(0.1)
    await loop.stop()
    assert prov.target == 3 and len(loop.history) >= 3
