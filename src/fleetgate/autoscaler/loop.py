"""The autoscaler control loop: gather inputs -> ``core.autoscale`` -> apply through a replica provider.

One ``AutoscalerLoop`` per deployment. Every ``interval_s`` it reads demand (``core.autoscale.DemandMeter``,
fed by the gateway), asks the provider how many replicas are ready and starting, calls the autoscaler's pure
``decide`` and, when the answer differs from the current target, calls ``scale_to``. It always exports the
desired-replica and utilisation gauges, so KEDA or the HPA can do the scaling instead (``apply=False``).

Wiring (composition root)::

    meter = DemandMeter()
    loop = AutoscalerLoop(
        deployment="m", autoscaler=build_autoscaler("fleetgate", params), meter=meter,
        counts=provider_counts, target=provider, capacity_mu_per_min=profile.capacity_mu_per_min,
        registry=registry,
    )
    await loop.start() ... await loop.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from fleetgate.core.autoscale import AutoscaleContext, ReportingAutoscaler
from fleetgate.providers.base import ReplicaCounts, ReplicaProvider, ReplicaStatus
from fleetgate.tasks import cancel_and_wait

log = logging.getLogger("fleetgate.autoscaler")


class ScaleTarget(Protocol):
    """What the loop needs from a replica provider (``providers.base.ReplicaProvider`` fits)."""

    async def scale_to(self, replicas: int) -> Any: ...


CountsFn = Callable[[], ReplicaCounts | Awaitable[ReplicaCounts]]


class AutoscalerMetrics:
    """Gauges KEDA/HPA can scale on, registered on the registry passed in (no global registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.desired = Gauge(
            "fleetgate_autoscaler_desired_replicas",
            "Replicas the autoscaler wants for the deployment.",
            ["deployment"],
            registry=registry,
        )
        self.utilisation = Gauge(
            "fleetgate_autoscaler_utilisation",
            "MU demand per minute (as the policy reads it) / MU capacity of ready replicas.",
            ["deployment"],
            registry=registry,
        )
        self.demand = Gauge(
            "fleetgate_autoscaler_demand_mu_per_minute",
            "MU demand per minute: settled in the last minute plus the in-flight term.",
            ["deployment"],
            registry=registry,
        )
        self.ready = Gauge(
            "fleetgate_autoscaler_ready_replicas", "Ready replicas seen.", ["deployment"], registry=registry
        )
        self.starting = Gauge(
            "fleetgate_autoscaler_starting_replicas",
            "Replicas still starting.",
            ["deployment"],
            registry=registry,
        )
        self.panic = Gauge(
            "fleetgate_autoscaler_panic", "1 while in panic mode.", ["deployment"], registry=registry
        )
        self.decisions = Counter(
            "fleetgate_autoscaler_scale_events_total",
            "Scale changes applied, by direction.",
            ["deployment", "direction"],
            registry=registry,
        )


def provider_counts(provider: ReplicaProvider, routable: Callable[[str], bool] | None = None) -> CountsFn:
    """Counts from a ``providers.base.ReplicaProvider``: ``list()`` statuses, optionally narrowed by health
    (``routable(name)``, e.g. ``HealthMonitor.routable``) so that unhealthy replicas count as not ready."""

    async def counts() -> ReplicaCounts:
        reps = await provider.list()
        live = [r for r in reps if r.status in (ReplicaStatus.RUNNING, ReplicaStatus.STARTING)]
        ready = [
            r for r in live if r.status == ReplicaStatus.RUNNING and (routable is None or routable(r.name))
        ]
        return ReplicaCounts(current=len(live), ready=len(ready), starting=len(live) - len(ready))

    return counts


class DemandSource(Protocol):
    """What the loop reads demand from: one gateway's ``DemandMeter``, or every gateway's
    (``providers.demand_share.SharedDemand``)."""

    @property
    def inflight_mu(self) -> float: ...

    @property
    def inflight_requests(self) -> int: ...

    def settled_mu_per_min(self, now_s: float) -> float: ...


class AutoscalerLoop:
    """Periodic autoscaling of one deployment."""

    def __init__(
        self,
        *,
        deployment: str,
        autoscaler: ReportingAutoscaler,
        meter: DemandSource,
        counts: CountsFn,
        target: ScaleTarget | None,
        capacity_mu_per_min: float,
        registry: CollectorRegistry | None = None,
        interval_s: float = 1.0,
        apply: bool = True,
        clock: Callable[[], float] = time.monotonic,
        metrics: AutoscalerMetrics | None = None,
        leading: Callable[[], bool] | None = None,
    ) -> None:
        """``leading``: with several gateways, whether this one is the deployment's elected leader; the loop
        steps (decides, exports, scales) only while it is (``providers.leader.LeaderElector.is_leader``)."""
        self.deployment = deployment
        self.autoscaler = autoscaler
        self.meter = meter
        self.counts = counts
        self.target = target
        self.capacity_mu_per_min = capacity_mu_per_min
        # ``metrics``: the gauges shared by every loop of one registry (a registry takes each name once)
        self.metrics = metrics or AutoscalerMetrics(registry if registry is not None else CollectorRegistry())
        self.interval_s = interval_s
        self.apply = apply and target is not None
        self.clock = clock
        self.leading = leading
        self.state: Any = None
        self.desired: int | None = None
        self.history: list[tuple[float, int, int, float]] = []  # (t, desired, ready, utilisation)
        self._task: asyncio.Task[None] | None = None
        self._apply_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"fleetgate-autoscaler-{self.deployment}")

    async def stop(self) -> None:
        for task in (self._task, self._apply_task):
            await cancel_and_wait(task)
        self._task = self._apply_task = None

    @property
    def applying(self) -> bool:
        """Whether a ``scale_to`` is still running (starting engines can take minutes)."""
        return self._apply_task is not None and not self._apply_task.done()

    async def wait_applied(self) -> None:
        """Wait for the scale change in flight, if any (tests, shutdown)."""
        if self._apply_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._apply_task)

    async def _apply(self, desired: int, direction: str) -> None:
        assert self.target is not None
        try:
            await self.target.scale_to(desired)
            self.metrics.decisions.labels(self.deployment, direction).inc()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("scale_to(%d) failed deployment=%s", desired, self.deployment)

    async def _run(self) -> None:
        while True:
            try:
                if self.leading is None or self.leading():
                    await self.step()
                elif self.desired is not None:
                    self.step_down()
            except asyncio.CancelledError:
                raise
            except Exception:  # keep scaling alive through a provider hiccup
                log.exception("autoscaler step failed deployment=%s", self.deployment)
            await asyncio.sleep(self.interval_s)

    async def _counts(self) -> ReplicaCounts:
        got = self.counts()
        if inspect.isawaitable(got):
            return await got
        return got

    def step_down(self) -> None:
        """Another gateway leads now: forget the policy state and drop this deployment's gauges, so that
        only the leader exports a decision."""
        self.state = None
        self.desired = None
        m = self.metrics
        for gauge in (m.desired, m.utilisation, m.demand, m.ready, m.starting, m.panic):
            with contextlib.suppress(KeyError):
                gauge.remove(self.deployment)

    async def step(self) -> int:
        """One decision; returns the desired count (applied when ``apply``)."""
        counts = await self._counts()
        now = self.clock()
        ctx = AutoscaleContext(
            now_s=now,
            current_replicas=counts.current,
            ready_replicas=counts.ready,
            starting_replicas=counts.starting,
            capacity_mu_per_min=self.capacity_mu_per_min,
            settled_mu_per_min=self.meter.settled_mu_per_min(now),
            inflight_mu=self.meter.inflight_mu,
            inflight_requests=self.meter.inflight_requests,
            policy_state=self.state,
        )
        desired, self.state = self.autoscaler.decide(ctx)
        # fleetgate's policy reports the demand it scaled on (its in-flight term); baselines the context's.
        summary = self.autoscaler.summary(ctx, self.state)
        demand = float(summary.demand_mu_per_min)
        util = float(summary.utilisation)
        m = self.metrics
        m.desired.labels(self.deployment).set(desired)
        m.utilisation.labels(self.deployment).set(util if math.isfinite(util) else 1e9)
        m.demand.labels(self.deployment).set(demand)
        m.ready.labels(self.deployment).set(counts.ready)
        m.starting.labels(self.deployment).set(counts.starting)
        m.panic.labels(self.deployment).set(1.0 if summary.panic else 0.0)
        self.history.append((now, desired, counts.ready, util))
        if len(self.history) > 10_000:
            del self.history[:5_000]
        if desired != counts.current:
            direction = "up" if desired > counts.current else "down"
            log.info(
                "autoscale deployment=%s %s %d -> %d demand=%.1fMU/min util=%.2f reason=%s",
                self.deployment,
                direction,
                counts.current,
                desired,
                demand,
                util,
                summary.reason,
            )
            if self.apply and self.target is not None and not self.applying:
                # In the background: the provider may wait minutes for engines to start, and decisions
                # (and the gauges KEDA reads) must keep flowing meanwhile. One change at a time.
                self._apply_task = asyncio.create_task(self._apply(desired, direction))
        self.desired = desired
        return desired
