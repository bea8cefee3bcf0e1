"""The GPU pool loop under ``fleetgate serve``: gather -> ``core.capacity.decide`` -> scale the providers.

One ``PoolLoop`` per pool (``pools[]``) that deployments name. Every ``interval_s`` it reads, per
deployment, its autoscaler's desired replicas (the demand; the autoscaler loop of a pooled deployment only
decides, it never scales), its floor (the replicas backing the MU/min sold on it, read live from admission
so that reservations changed at run time count), and its replicas starting, running and draining from its
provider; calls the pure allocator and applies the answer through the provider's ``scale_to``: growing by
the starts the allocator allows (only into GPUs that are free, draining ones counted as taken), shrinking
to the allocation through the provider's drain path (routing stops, in-flight requests finish, then the
process stops) so that the GPUs of a reclaimed replica go to the deployment that needs them once drained.
A deployment without a pool keeps its own autoscaler loop, which scales it directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

from fleetgate.core.capacity import (
    Allocation,
    AllocationContext,
    AllocatorParams,
    AllocatorState,
    DeploymentDemand,
    decide,
    floor_replicas,
)
from fleetgate.providers.base import ReplicaProvider, ReplicaStatus

log = logging.getLogger("fleetgate.capacity")

#: MU/min sold on a deployment (the sum of its tenants' reservations), read at every decision.
SoldFn = Callable[[str], float]
#: The autoscaler's latest desired replicas of a deployment (``None``: it has not decided yet).
DesiredFn = Callable[[], int | None]


@dataclass(frozen=True, slots=True)
class PoolMemberPlan:
    """What the config says about one deployment in a pool (``control.pool_plans``)."""

    model: str
    gpus_per_replica: int
    capacity_mu_per_min: float  # per replica
    target_utilisation: float
    #: demand while it has no autoscaler (or before its first decision): the replicas asked for at start
    #: (``None``: those it holds, e.g. a Kubernetes Deployment's own count)
    replicas: int | None
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """One pool and its deployments, from the config."""

    name: str
    gpus: int
    members: tuple[PoolMemberPlan, ...]
    params: AllocatorParams = field(default_factory=AllocatorParams)

    def initial(self, sold: Mapping[str, float]) -> dict[str, int]:
        """Replicas each member starts with: what it asks for, floors first, within the pool."""
        demands = [
            DeploymentDemand(
                name=m.model,
                demand=m.replicas or 0,
                floor=self.floor(m, sold.get(m.model, 0.0)),
                gpus_per_replica=m.gpus_per_replica,
                weight=m.weight,
            )
            for m in self.members
        ]
        allocation, _ = decide(AllocationContext(0.0, self.gpus, demands, self.params))
        return {m.model: allocation.start[m.model] for m in self.members}

    @staticmethod
    def floor(member: PoolMemberPlan, sold_mu_per_min: float) -> int:
        return floor_replicas(sold_mu_per_min, member.capacity_mu_per_min, member.target_utilisation)


class PoolMetrics:
    """Per pool and deployment: GPUs, allocation, floor, demand and reclaimed replicas."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.gpus = Gauge("fleetgate_pool_gpus", "GPUs in the pool.", ["pool"], registry=registry)
        self.gpus_used = Gauge(
            "fleetgate_pool_gpus_used",
            "GPUs the pool's replicas occupy (running, starting and draining).",
            ["pool"],
            registry=registry,
        )
        self.allocated = Gauge(
            "fleetgate_pool_allocated_replicas",
            "Replicas the pool allocator gives the deployment.",
            ["pool", "deployment"],
            registry=registry,
        )
        self.floor = Gauge(
            "fleetgate_pool_floor_replicas",
            "Replicas backing the MU/min sold on the deployment (at its autoscaler's target utilisation).",
            ["pool", "deployment"],
            registry=registry,
        )
        self.demand = Gauge(
            "fleetgate_pool_demand_replicas",
            "Replicas the deployment's autoscaler wants.",
            ["pool", "deployment"],
            registry=registry,
        )
        self.held = Gauge(
            "fleetgate_pool_held_replicas",
            "Replicas the deployment runs or is starting (not draining).",
            ["pool", "deployment"],
            registry=registry,
        )
        self.reclaimed = Counter(
            "fleetgate_pool_reclaimed_replicas",
            "Replicas drained from the deployment while it still wanted them (given to another).",
            ["pool", "deployment"],
            registry=registry,
        )
        self.floors_fit = Gauge(
            "fleetgate_pool_floors_fit", "1 while the floors fit in the pool.", ["pool"], registry=registry
        )


@dataclass(slots=True)
class _Member:
    plan: PoolMemberPlan
    provider: ReplicaProvider
    desired: DesiredFn
    task: asyncio.Task[None] | None = None
    reclaimed: int = 0

    @property
    def applying(self) -> bool:
        return self.task is not None and not self.task.done()


@dataclass(frozen=True, slots=True)
class PoolView:
    """The last decision of a pool, for ``/admin/capacity`` (``inputs`` per deployment, ``allocation``)."""

    pool: str
    gpus: int
    inputs: tuple[DeploymentDemand, ...]
    allocation: Allocation
    reclaimed: Mapping[str, int]
    sold_mu_per_min: Mapping[str, float]


class PoolLoop:
    """Periodic allocation of one pool among its deployments, applied through their providers."""

    def __init__(
        self,
        plan: PoolPlan,
        providers: Mapping[str, ReplicaProvider],
        desired: Mapping[str, DesiredFn],
        sold: SoldFn,
        *,
        registry: CollectorRegistry | None = None,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        leading: Callable[[], bool] | None = None,
    ) -> None:
        """``leading``: with several gateways, whether this one leads the pool (it then allocates; the
        others only route)."""
        self.plan = plan
        self.leading = leading
        self.members = [_Member(m, providers[m.model], desired.get(m.model, _none)) for m in plan.members]
        self.sold = sold
        self.metrics = PoolMetrics(registry if registry is not None else CollectorRegistry())
        self.interval_s = interval_s
        self.clock = clock
        self.state: AllocatorState | None = None
        self.last: PoolView | None = None
        self._task: asyncio.Task[None] | None = None
        self.metrics.gpus.labels(plan.name).set(plan.gpus)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"fleetgate-pool-{self.plan.name}")

    async def stop(self) -> None:
        tasks = [self._task, *(m.task for m in self.members)]
        for task in tasks:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = None
        for m in self.members:
            m.task = None

    async def wait_applied(self) -> None:
        """Wait for the scale changes in flight (tests, shutdown)."""
        for m in self.members:
            if m.task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(m.task)

    async def _run(self) -> None:
        while True:
            try:
                if self.leading is None or self.leading():
                    await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # keep allocating through a provider hiccup
                log.exception("pool step failed pool=%s", self.plan.name)
            await asyncio.sleep(self.interval_s)

    async def _inputs(self) -> list[DeploymentDemand]:
        out = []
        for m in self.members:
            infos = await m.provider.list()
            held = sum(1 for r in infos if r.status in (ReplicaStatus.RUNNING, ReplicaStatus.STARTING))
            draining = sum(1 for r in infos if r.status == ReplicaStatus.DRAINING)
            desired = m.desired()
            out.append(
                DeploymentDemand(
                    name=m.plan.model,
                    demand=_demand(desired, m.plan.replicas, held),
                    floor=PoolPlan.floor(m.plan, self.sold(m.plan.model)),
                    gpus_per_replica=m.plan.gpus_per_replica,
                    weight=m.plan.weight,
                    held=held,
                    draining=draining,
                )
            )
        return out

    async def step(self) -> Allocation:
        """One decision, applied (each deployment's change in the background, one at a time)."""
        inputs = await self._inputs()
        plan = self.plan
        allocation, self.state = decide(
            AllocationContext(self.clock(), plan.gpus, inputs, plan.params, self.state)
        )
        m_ = self.metrics
        m_.floors_fit.labels(plan.name).set(1.0 if allocation.floors_fit else 0.0)
        m_.gpus_used.labels(plan.name).set(sum((d.held + d.draining) * d.gpus_per_replica for d in inputs))
        for member, d in zip(self.members, inputs, strict=True):
            name = d.name
            m_.allocated.labels(plan.name, name).set(allocation.replicas[name])
            m_.floor.labels(plan.name, name).set(d.floor)
            m_.demand.labels(plan.name, name).set(d.demand)
            m_.held.labels(plan.name, name).set(d.held)
            if member.applying:
                continue
            target = self._target(d, allocation)
            if target is None:
                continue
            if target < d.held and d.wants > target:
                taken = d.held - max(target, 0)
                member.reclaimed += taken
                m_.reclaimed.labels(plan.name, name).inc(taken)
            log.info(
                "pool=%s deployment=%s %d -> %d (demand %d, floor %d, allocation %d%s)",
                plan.name,
                name,
                d.held,
                target,
                d.demand,
                d.floor,
                allocation.replicas[name],
                ", reclaimed" if target < d.held and d.wants > target else "",
            )
            member.task = asyncio.create_task(self._scale(member, target))
        self.last = PoolView(
            pool=plan.name,
            gpus=plan.gpus,
            inputs=tuple(inputs),
            allocation=allocation,
            reclaimed={m.plan.model: m.reclaimed for m in self.members},
            sold_mu_per_min={m.plan.model: self.sold(m.plan.model) for m in self.members},
        )
        return allocation

    @staticmethod
    def _target(d: DeploymentDemand, allocation: Allocation) -> int | None:
        """The count to scale to now: down to the allocation (drained), or up by the starts allowed."""
        if allocation.drain[d.name] > 0:
            return allocation.replicas[d.name]
        if allocation.start[d.name] > 0:
            return d.held + allocation.start[d.name]
        return None

    async def _scale(self, member: _Member, replicas: int) -> None:
        try:
            await member.provider.scale_to(replicas)
        except asyncio.CancelledError:
            raise
        except Exception:
            plan = self.plan
            log.exception("scale_to(%d) failed pool=%s deployment=%s", replicas, plan.name, member.plan.model)


def _none() -> int | None:
    return None


def _demand(desired: int | None, configured: int | None, held: int) -> int:
    if desired is not None:
        return max(0, desired)
    return held if configured is None else configured


def pool_loops(
    plans: Sequence[PoolPlan],
    providers: Mapping[str, ReplicaProvider],
    desired: Mapping[str, DesiredFn],
    sold: SoldFn,
    *,
    registry: CollectorRegistry,
    interval_s: float,
    clock: Callable[[], float],
    leading: Mapping[str, Callable[[], bool]] | None = None,
) -> dict[str, PoolLoop]:
    """One loop per pool whose deployments all have a provider the gateway manages (``leading[pool]``:
    whether this gateway leads it, with several gateways)."""
    return {
        plan.name: PoolLoop(
            plan,
            providers,
            desired,
            sold,
            registry=registry,
            interval_s=interval_s,
            clock=clock,
            leading=(leading or {}).get(plan.name),
        )
        for plan in plans
        if plan.members and all(m.model in providers for m in plan.members)
    }
