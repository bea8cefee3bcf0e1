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
import inspect
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

from fleetgate.autoscaler.loop import CountsFn
from fleetgate.core.capacity import (
    Allocation,
    AllocationContext,
    AllocatorParams,
    AllocatorState,
    DeploymentDemand,
    decide,
    floor_replicas,
)
from fleetgate.gateway.admission import Admission
from fleetgate.periodic import Periodic
from fleetgate.providers.base import ReplicaCounts, ReplicaProvider, ReplicaStatus
from fleetgate.tasks import cancel_and_wait

log = logging.getLogger("fleetgate.capacity")

#: Decisions a pool loop remembers for the ``/ui`` picture (15 minutes at one per second).
HISTORY_POINTS = 900

#: MU/min sold on a deployment (the sum of its tenants' reservations), read at every decision.
SoldFn = Callable[[str], float]
#: MU/min settled on a deployment over the last minute (the capacity ledger's ``used``).
UsedFn = Callable[[str], float]
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
    #: most replicas it may run with idle GPUs lent as warm headroom (its autoscaler's ``max_replicas``;
    #: ``None``: it is lent nothing, e.g. a fixed count)
    max_replicas: int | None = None


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


class LentReplicas:
    """Per deployment, the lent replicas of the pool's last decision, for its autoscaler to leave out.

    A lent replica backs no demand: the autoscaler of a pooled deployment must size it from the replicas
    that do (as the simulator does), else it would read the warm headroom as its own and keep it. The
    provider's live count is narrowed by what the last decision said: ``held - backed`` of the replicas it
    holds now, at most the lent count (those still starting count once they hold a GPU).
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int]] = {}  # model -> (backed, lent)

    def record(self, model: str, backed: int, lent: int) -> None:
        self._last[model] = (backed, lent)

    def of(self, model: str, held: int) -> int:
        """Of the ``held`` replicas of ``model`` now, how many are lent."""
        backed, lent = self._last.get(model, (held, 0))
        return max(0, min(lent, held - backed))

    def counts(self, model: str, counts: CountsFn) -> CountsFn:
        """``counts`` with the lent replicas taken out of current and ready."""

        async def narrowed() -> ReplicaCounts:
            got = counts()
            c = await got if inspect.isawaitable(got) else got
            lent = self.of(model, c.current)
            current = c.current - lent
            ready = min(c.ready, current)
            return ReplicaCounts(current=current, ready=ready, starting=max(0, current - ready))

        return narrowed


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
        self.lent = Gauge(
            "fleetgate_pool_lent_replicas",
            "Replicas of the deployment running on idle GPUs lent as warm headroom (the first taken back).",
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
        self.floor_gpus = Gauge(
            "fleetgate_pool_floor_gpus",
            "GPUs the floors of the pool's deployments need (what was sold, at target utilisation).",
            ["pool"],
            registry=registry,
        )
        per_dep = ["pool", "deployment"]
        self.capacity = Gauge(
            "fleetgate_pool_capacity_mu_per_minute",
            "MU/min the deployment's replicas in the pool serve (held replicas x MU/min per replica).",
            per_dep,
            registry=registry,
        )
        self.sold = Gauge(
            "fleetgate_pool_sold_mu_per_minute",
            "MU/min reserved on the deployment (the sum of its tenants' reservations).",
            per_dep,
            registry=registry,
        )
        self.guaranteed = Gauge(
            "fleetgate_pool_guaranteed_mu_per_minute",
            "MU/min the pool guarantees the deployment: its floor replicas the pool can hold x MU/min per "
            "replica x target utilisation (below sold only when the floors do not fit).",
            per_dep,
            registry=registry,
        )
        self.used = Gauge(
            "fleetgate_pool_used_mu_per_minute",
            "MU/min settled on the deployment over the last minute (by every gateway sharing a Redis "
            "store; else by this one).",
            per_dep,
            registry=registry,
        )
        self.headroom = Gauge(
            "fleetgate_pool_headroom_mu_per_minute",
            "Capacity minus used MU/min of the deployment.",
            per_dep,
            registry=registry,
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

    plan: PoolPlan
    inputs: tuple[DeploymentDemand, ...]
    allocation: Allocation
    reclaimed: Mapping[str, int]
    sold_mu_per_min: Mapping[str, float]
    used_mu_per_min: Mapping[str, float]

    def guaranteed(self, member: PoolMemberPlan, d: DeploymentDemand) -> float:
        """MU/min the pool backs on ``d``: the floor replicas it can hold at the target utilisation."""
        held_floor = min(d.floor, self.allocation.replicas[d.name])
        return held_floor * member.capacity_mu_per_min * member.target_utilisation

    def report(self, tenants: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, object]:
        """Per pool and deployment (and tenant, given ``tenants``: deployment -> tenant -> used MU/min):
        capacity (GPUs, replicas, MU/min), sold, guaranteed, used, headroom, reclaimed replicas."""
        deps = []
        for member, d in zip(self.plan.members, self.inputs, strict=True):
            capacity = d.held * member.capacity_mu_per_min
            used = self.used_mu_per_min.get(d.name, 0.0)
            deps.append(
                {
                    "deployment": d.name,
                    "gpus_per_replica": d.gpus_per_replica,
                    "gpus": (d.held + d.draining) * d.gpus_per_replica,
                    "replicas": d.held,
                    "draining_replicas": d.draining,
                    "demand_replicas": d.demand,
                    "floor_replicas": d.floor,
                    "allocated_replicas": self.allocation.replicas[d.name],
                    "lent_replicas": self.allocation.lent.get(d.name, 0),
                    "capacity_mu_per_min_per_replica": member.capacity_mu_per_min,
                    "capacity_mu_per_min": capacity,
                    "sold_mu_per_min": self.sold_mu_per_min.get(d.name, 0.0),
                    "guaranteed_mu_per_min": self.guaranteed(member, d),
                    "used_mu_per_min": used,
                    "headroom_mu_per_min": capacity - used,
                    "reclaimed_replicas": self.reclaimed.get(d.name, 0),
                    "tenants": [
                        {"tenant": t, "used_mu_per_min": mu}
                        for t, mu in sorted((tenants or {}).get(d.name, {}).items())
                    ],
                }
            )

        def total(key: str) -> float:
            return math.fsum(float(str(dep[key])) for dep in deps)

        return {
            "pool": self.plan.name,
            "gpus": self.plan.gpus,
            "gpus_used": sum((d.held + d.draining) * d.gpus_per_replica for d in self.inputs),
            "floor_gpus": sum(d.floor * d.gpus_per_replica for d in self.inputs),
            "floors_fit": self.allocation.floors_fit,
            "floor_shortfall_gpus": self.allocation.floor_shortfall_gpus,
            "capacity_mu_per_min": total("capacity_mu_per_min"),
            "sold_mu_per_min": total("sold_mu_per_min"),
            "guaranteed_mu_per_min": total("guaranteed_mu_per_min"),
            "used_mu_per_min": total("used_mu_per_min"),
            "headroom_mu_per_min": total("headroom_mu_per_min"),
            "reclaimed_replicas": sum(self.reclaimed.values()),
            "lent_replicas": sum(self.allocation.lent.values()),
            "deployments": deps,
        }


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
        used: UsedFn | None = None,
        metrics: PoolMetrics | None = None,
        lent: LentReplicas | None = None,
    ) -> None:
        """``leading``: with several gateways, whether this one leads the pool (it then allocates; the
        others only route). ``used``: MU/min settled per deployment (the capacity ledger's); ``metrics``:
        the gauges shared by every pool of one registry; ``lent``: where each decision's lent replicas go
        (for the members' autoscalers)."""
        self.plan = plan
        self.leading = leading
        self.members = [_Member(m, providers[m.model], desired.get(m.model, _none)) for m in plan.members]
        self.sold = sold
        self.used = used or _nothing_used
        self.metrics = metrics or PoolMetrics(registry if registry is not None else CollectorRegistry())
        self.lent = lent or LentReplicas()
        self.interval_s = interval_s
        self.clock = clock
        self.state: AllocatorState | None = None
        self.last: PoolView | None = None
        #: one point per decision, for the ``/ui`` picture: (time, capacity, sold, used MU/min, GPUs used)
        self.history: deque[tuple[float, float, float, float, int]] = deque(maxlen=HISTORY_POINTS)
        self._loop = Periodic(f"pool-{plan.name}", self._tick, interval_s)
        self.metrics.gpus.labels(plan.name).set(plan.gpus)

    def recent(self, now: float) -> list[dict[str, float]]:
        """The remembered decisions, oldest first, ``t`` in seconds before ``now`` (negative)."""
        return [
            {
                "t": t - now,
                "capacity_mu_per_min": c,
                "sold_mu_per_min": s,
                "used_mu_per_min": u,
                "gpus_used": g,
            }
            for t, c, s, u, g in self.history
        ]

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        """Stop deciding (a decision under way finishes), then cancel the scale changes in flight."""
        await self._loop.stop()
        for m in self.members:
            await cancel_and_wait(m.task)
            m.task = None

    async def wait_applied(self) -> None:
        """Wait for the scale changes in flight (tests, shutdown)."""
        for m in self.members:
            if m.task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(m.task)

    async def _tick(self) -> None:
        if self.leading is None or self.leading():  # with several gateways, only the pool's leader decides
            await self.step()

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
                    max_replicas=m.plan.max_replicas,
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
            m_.lent.labels(plan.name, name).set(allocation.lent.get(name, 0))
            self.lent.record(name, allocation.backed(name), allocation.lent.get(name, 0))
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
        self.last = view = PoolView(
            plan=plan,
            inputs=tuple(inputs),
            allocation=allocation,
            reclaimed={m.plan.model: m.reclaimed for m in self.members},
            sold_mu_per_min={m.plan.model: self.sold(m.plan.model) for m in self.members},
            used_mu_per_min={m.plan.model: self.used(m.plan.model) for m in self.members},
        )
        m_.floor_gpus.labels(plan.name).set(sum(d.floor * d.gpus_per_replica for d in inputs))
        self.history.append(
            (
                self.clock(),
                math.fsum(
                    d.held * m.plan.capacity_mu_per_min for m, d in zip(self.members, inputs, strict=True)
                ),
                math.fsum(view.sold_mu_per_min.values()),
                math.fsum(view.used_mu_per_min.values()),
                sum((d.held + d.draining) * d.gpus_per_replica for d in inputs),
            )
        )
        for member, d in zip(self.members, inputs, strict=True):
            capacity = d.held * member.plan.capacity_mu_per_min
            used = view.used_mu_per_min[d.name]
            m_.capacity.labels(plan.name, d.name).set(capacity)
            m_.sold.labels(plan.name, d.name).set(view.sold_mu_per_min[d.name])
            m_.guaranteed.labels(plan.name, d.name).set(view.guaranteed(member.plan, d))
            m_.used.labels(plan.name, d.name).set(used)
            m_.headroom.labels(plan.name, d.name).set(capacity - used)
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


def admission_used(admission: Admission, model: str) -> float:
    """MU/min settled on ``model`` over the capacity ledger's window (fleet-wide with a shared store; 0
    when admission does not track it)."""
    for row in admission.capacity_overview() or ():
        if row.get("deployment") == model:
            return float(row.get("used_mu_per_min") or 0.0)
    return 0.0


def admission_sold(admission: Admission, model: str) -> float:
    """MU/min reserved on ``model`` by the tenants admission knows now (run-time changes included)."""
    return math.fsum(t.reserved_mu_per_min.get(model, 0.0) for t in admission.tenant_summaries())


def _none() -> int | None:
    return None


def _nothing_used(model: str) -> float:
    return 0.0


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
    used: UsedFn | None = None,
    lent: LentReplicas | None = None,
) -> dict[str, PoolLoop]:
    """One loop per pool whose deployments all have a provider the gateway manages (``leading[pool]``:
    whether this gateway leads it, with several gateways; ``used``: MU/min settled per deployment)."""
    if not plans:
        return {}
    shared = PoolMetrics(registry)  # one set of gauges for every pool (a registry takes each name once)
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
            used=used,
            metrics=shared,
            lent=lent,
        )
        for plan in plans
        if plan.members and all(m.model in providers for m in plan.members)
    }
