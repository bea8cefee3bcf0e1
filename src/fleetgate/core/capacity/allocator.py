"""One finite GPU pool shared by deployments: a pure ``decide(ctx) -> (allocation, state)``.

Shaped like the autoscalers (``core/autoscale``): the caller gathers each deployment's figures into an
:class:`AllocationContext`, calls :func:`decide` with the previous :class:`AllocatorState`, applies the
returned :class:`Allocation` (start, drain) and keeps the state for the next call. Nothing here reads a clock.

Per deployment: ``demand`` (its autoscaler's desired replicas), ``floor`` (the replicas backing what was sold
on it, :func:`floor_replicas`), ``gpus_per_replica``, ``weight``, ``held`` (replicas it runs or is starting,
not draining) and ``draining`` (on their way out, still on their GPUs). A deployment *wants*
``max(demand, floor)`` replicas.

The decision, in order:

1. **Floors first.** Every deployment gets its floor. If the floors do not fit (the pool shrank; config
   load refuses it otherwise), the floors themselves are shared by water-filling and nothing else is given.
2. **Fair target** (:func:`fair_shares`): the GPUs left are water-filled over demand above the floors,
   weighted max-min fair in GPUs: replica by replica, to the deployment whose level
   ``(replicas - floor) * gpus_per_replica / weight`` would be lowest after it, among those whose demand is
   unmet and whose replica fits, or fits once deployments further above it give up replicas (so small
   replicas cannot starve a deployment of large ones); until none does.
3. **Hysteresis.** A deployment keeps the replicas it holds and still wants (never below its floor), trimmed
   only where the floors need the GPUs; free GPUs are then water-filled as in 2. A deployment left below its
   fair target (someone else holds more than theirs) waits: only when one has been short for
   ``reclaim_after_s`` does the whole pool move to the fair target, taking replicas from those above theirs.
4. **Lend what is still idle** (``lend_idle_gpus``, on by default: the pool is fixed and paid for, an idle
   GPU earns nothing). The GPUs the demand-backed allocation leaves free are lent as warm headroom replicas
   to the deployments that give a ``max_replicas`` (a caller that gives none is lent nothing), never above
   it: first each keeps the lent replicas it already runs (no flapping; where they no longer fit, the one
   with the most headroom relative to its demand gives up one first), then replica by replica to the
   lowest ``(replicas + 1) / max(wants, 1)``: headroom in proportion to demand, so a burst of a few percent
   lands on warm replicas instead of waiting out a cold start. ``lent[d]`` counts them; they are part of
   ``replicas[d]``. A lent replica backs nothing: steps 1-3 never see it (held above what a deployment
   wants is not kept), so the moment a demand or a floor needs GPUs the lent replicas are the first taken,
   at once, without the reclaim hold, and no demand-backed replica is drained while a lent one could give
   way. When demand grows where a replica is lent, the lent replica becomes demand-backed without a restart.
5. **Drain, never kill.** ``drain[d] = held - replicas`` when positive: the shell drains that many (requests
   in flight finish; lent ones first, they carry least) and their GPUs go to the deployments with ``start``
   counts once free. ``start[d]`` is what may start now, in the GPUs free even counting those still
   draining; demand-backed starts before lent ones.

Invariants (``tests/property/test_capacity_allocator.py``):

- never above the pool: ``sum(replicas * gpus_per_replica) <= pool_gpus``, and the GPUs in use after the
  starts (held + draining + start) never exceed the pool when they did not before;
- never below a floor while the floors fit; the demand-backed replicas (``replicas - lent``) never above
  what a deployment wants, and all of them never above its ``max_replicas`` once it is lent any;
- work-conserving: while a deployment's demand is unmet, the GPUs free in the allocation are fewer than its
  ``gpus_per_replica``; with lending, while a deployment below its ``max_replicas`` could take one more,
  likewise;
- lent replicas are reclaimed first: the demand-backed allocation is exactly the one without lending, and
  the lent replicas only fill the GPUs it leaves free;
- max-min fair (the fair target, which the allocation equals with ``reclaim_after_s = 0`` and reaches
  after ``reclaim_after_s`` under constant inputs): while ``j``'s demand is unmet, taking enough replicas
  from any ``i`` (above its floor) to fit one more of ``j``'s would leave ``i``'s level at or below ``j``'s;
  with equal replica sizes and weights, levels above the floors differ by at most one replica;
- no flapping: under constant inputs, repeated decisions change the allocation at most twice (growing into
  free GPUs, then the reclaim) and never return to an allocation they left.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import Field

from fleetgate.core.autoscale.base import replicas_for
from fleetgate.core.plugins import PluginParams

#: Tolerance in level comparisons; bound on fair water-filling steps (each raises the levels: never reached).
EPS = 1e-9
_MAX_STEPS = 10_000_000


class AllocatorParams(PluginParams):
    """How long a deployment below its fair share waits before replicas are reclaimed for it, and whether
    GPUs left idle are lent as warm headroom."""

    reclaim_after_s: float = Field(
        default=60.0,
        ge=0,
        description="A deployment below its fair share for this long reclaims replicas from those above "
        "theirs (0: at once). Floors are never made to wait.",
    )
    lend_idle_gpus: bool = Field(
        default=True,
        description="Lend the GPUs left idle after floors and demand as warm headroom replicas (up to each "
        "deployment's max_replicas), the first taken back when a demand or a floor needs them. Uses more "
        "GPU-hours of a fixed pool; serves bursts without a cold start.",
    )


def floor_replicas(
    sold_mu_per_min: float, capacity_mu_per_min_per_replica: float, target_utilisation: float
) -> int:
    """Replicas that back ``sold_mu_per_min`` at the autoscaler's target utilisation:
    ``ceil(sold / (capacity per replica * target))``; 0 when nothing is sold."""
    return replicas_for(sold_mu_per_min, capacity_mu_per_min_per_replica, target_utilisation)


@dataclass(frozen=True, slots=True)
class DeploymentDemand:
    """One deployment's inputs to a decision (see the module docstring)."""

    name: str
    demand: int
    floor: int = 0
    gpus_per_replica: int = 1
    weight: float = 1.0
    held: int = 0
    draining: int = 0
    #: Most replicas it may run with lent headroom; ``None``: it is lent nothing.
    max_replicas: int | None = None

    def __post_init__(self) -> None:
        if min(self.demand, self.floor, self.held, self.draining) < 0:
            raise ValueError(f"{self.name}: demand, floor, held and draining must be >= 0")
        if self.max_replicas is not None and self.max_replicas < 0:
            raise ValueError(f"{self.name}: max_replicas must be >= 0")
        if self.gpus_per_replica < 1:
            raise ValueError(f"{self.name}: gpus_per_replica must be >= 1")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"{self.name}: weight must be finite and > 0")

    @property
    def wants(self) -> int:
        """Replicas it would run: its demand, never below its floor."""
        return max(self.demand, self.floor)


@dataclass(frozen=True, slots=True)
class AllocatorState:
    """Since when each deployment has been below its fair target (name -> time), sorted by name."""

    short_since: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class AllocationContext:
    """Inputs of one decision: the time, the pool and every deployment in it (names unique)."""

    now_s: float
    pool_gpus: int
    deployments: Sequence[DeploymentDemand]
    params: AllocatorParams = field(default_factory=AllocatorParams)
    state: AllocatorState | None = None

    def __post_init__(self) -> None:
        if self.pool_gpus < 0:
            raise ValueError("pool_gpus must be >= 0")
        names = [d.name for d in self.deployments]
        if len(set(names)) != len(names):
            raise ValueError("deployment names must be unique")


@dataclass(frozen=True, slots=True)
class Allocation:
    """What each deployment may run (``replicas``), what it must drain and what it may start now.

    ``lent`` is the part of ``replicas`` that is idle GPUs lent as headroom (empty when nothing is lent):
    the first taken back. ``fair`` is the demand-backed fair target the allocation moves to once a reclaim
    is due; ``floors_fit`` is false when the floors alone exceed the pool (``floor_shortfall_gpus`` GPUs
    more would be needed).
    """

    replicas: Mapping[str, int]
    drain: Mapping[str, int]
    start: Mapping[str, int]
    fair: Mapping[str, int]
    floors_fit: bool
    floor_shortfall_gpus: int
    reclaimed: bool = False
    lent: Mapping[str, int] = field(default_factory=dict)

    def backed(self, name: str) -> int:
        """Replicas of ``name`` that back its demand or floor (``replicas`` less the lent ones)."""
        return self.replicas[name] - self.lent.get(name, 0)

    def gpus(self, deployments: Sequence[DeploymentDemand]) -> int:
        """GPUs the allocation gives out."""
        return sum(self.replicas[d.name] * d.gpus_per_replica for d in deployments)


def _gpus(counts: Mapping[str, int], deps: Sequence[DeploymentDemand]) -> int:
    return sum(counts[d.name] * d.gpus_per_replica for d in deps)


def _water_fill(
    pool_gpus: int,
    deps: Sequence[DeploymentDemand],
    start: Mapping[str, int],
    base: Mapping[str, int],
    ceiling: Mapping[str, int],
) -> dict[str, int]:
    """From ``start``, one replica at a time to the deployment whose level ``(n - base) * g / w`` is lowest
    after it, among those below ``ceiling`` whose replica fits in what is free; until none does."""
    out = dict(start)
    free = pool_gpus - _gpus(out, deps)
    by_name = {d.name: d for d in deps}

    def key(d: DeploymentDemand) -> tuple[float, float, str]:
        level = (out[d.name] - base[d.name]) * d.gpus_per_replica / d.weight
        return (level + d.gpus_per_replica / d.weight, level, d.name)

    heap = [key(d) for d in deps if out[d.name] < ceiling[d.name]]
    heapq.heapify(heap)
    while heap:
        name = heapq.heappop(heap)[2]
        dep = by_name[name]
        if dep.gpus_per_replica > free:
            continue  # free only shrinks: it never fits again in this fill
        out[name] += 1
        free -= dep.gpus_per_replica
        if out[name] < ceiling[name]:
            heapq.heappush(heap, key(dep))
    return out


def _level(counts: Mapping[str, int], base: Mapping[str, int], d: DeploymentDemand) -> float:
    return (counts[d.name] - base[d.name]) * d.gpus_per_replica / d.weight


def _preempt(
    free: int,
    deps: Sequence[DeploymentDemand],
    out: Mapping[str, int],
    base: Mapping[str, int],
    taker: DeploymentDemand,
) -> tuple[dict[str, int], int] | None:
    """Make room for one replica of ``taker`` by taking replicas (above their base) from the deployments
    highest above it, each left above ``taker``'s current level; ``None`` when that cannot free enough.
    Every such move raises the sorted vector of levels, so repeating it terminates."""
    trial, low = dict(out), _level(out, base, taker)
    while free < taker.gpus_per_replica:
        donors = [
            d
            for d in deps
            if d.name != taker.name
            and trial[d.name] > base[d.name]
            and _level(trial, base, d) - d.gpus_per_replica / d.weight > low + EPS
        ]
        if not donors:
            return None
        top = max(donors, key=lambda d: (_level(trial, base, d), d.name))
        trial[top.name] -= 1
        free += top.gpus_per_replica
    return trial, free


def _fair_fill(
    pool_gpus: int, deps: Sequence[DeploymentDemand], base: Mapping[str, int], ceiling: Mapping[str, int]
) -> dict[str, int]:
    """Water-filling above ``base`` that replicas of different sizes cannot starve: one replica at a time
    to the lowest resulting level whose replica fits, or fits after :func:`_preempt`; until none does.

    At the end no deployment below its ceiling can take replicas from another and stay below it: for
    ``j`` unmet, taking enough of ``i``'s replicas for one of ``j``'s would leave ``i`` at or below ``j``'s
    level (locally max-min optimal; with equal sizes and weights, levels differ by at most one replica).
    """
    out = dict(base)
    free = pool_gpus - _gpus(out, deps)
    for _ in range(_MAX_STEPS):
        order = sorted(
            (d for d in deps if out[d.name] < ceiling[d.name]),
            key=lambda d: (
                _level(out, base, d) + d.gpus_per_replica / d.weight,
                _level(out, base, d),
                d.name,
            ),
        )
        for dep in order:
            if dep.gpus_per_replica <= free:
                out[dep.name] += 1
                free -= dep.gpus_per_replica
                break
            moved = _preempt(free, deps, out, base, dep)
            if moved is not None:
                out, free = moved
                out[dep.name] += 1
                free -= dep.gpus_per_replica
                break
        else:
            return out
    return out  # not reached: every step raises the sorted levels, and there are finitely many


def _floors(pool_gpus: int, deps: Sequence[DeploymentDemand]) -> tuple[dict[str, int], bool, int]:
    """Each deployment's guaranteed base: its floor, or its water-filled share of the floors when they do
    not fit; whether they fit, and the GPUs missing."""
    need = sum(d.floor * d.gpus_per_replica for d in deps)
    floors = {d.name: d.floor for d in deps}
    if need <= pool_gpus:
        return floors, True, 0
    zero = {d.name: 0 for d in deps}
    return _fair_fill(pool_gpus, deps, zero, floors), False, need - pool_gpus


def fair_shares(pool_gpus: int, deps: Sequence[DeploymentDemand]) -> dict[str, int]:
    """The fair target, holdings ignored: floors first, then weighted max-min water-filling above them."""
    base, fit, _ = _floors(pool_gpus, deps)
    if not fit:
        return base
    return _fair_fill(pool_gpus, deps, base, {d.name: d.wants for d in deps})


def _keep(
    pool_gpus: int,
    deps: Sequence[DeploymentDemand],
    base: Mapping[str, int],
    wants: Mapping[str, int],
    fair: Mapping[str, int],
) -> dict[str, int]:
    """What each deployment holds and still wants, at least its base; trimmed (the one furthest above its
    fair target first) where the bases need the GPUs."""
    keep = {d.name: max(base[d.name], min(d.held, wants[d.name])) for d in deps}
    while _gpus(keep, deps) > pool_gpus:
        over = [d for d in deps if keep[d.name] > max(base[d.name], fair[d.name])]
        if not over:  # cannot happen: sum(fair) fits and fair >= base
            break
        top = max(over, key=lambda d: ((keep[d.name] - base[d.name]) * d.gpus_per_replica / d.weight, d.name))
        keep[top.name] -= 1
    return keep


def _lend(
    pool_gpus: int, deps: Sequence[DeploymentDemand], backed: Mapping[str, int], wants: Mapping[str, int]
) -> dict[str, int]:
    """Headroom replicas in the GPUs ``backed`` leaves free: those already running kept (trimmed, the most
    headroom per demand first, where they no longer fit), then the lowest ``(n + 1) / max(wants, 1)``
    first, up to each ``max_replicas``; until no replica fits."""
    room = {d.name: max(0, (d.max_replicas or 0) - backed[d.name]) for d in deps}
    lent = {d.name: min(room[d.name], max(0, d.held - backed[d.name])) for d in deps}
    free = pool_gpus - _gpus(backed, deps)

    def ratio(d: DeploymentDemand, extra: int) -> tuple[float, str]:
        return ((backed[d.name] + lent[d.name] + extra) / max(1, wants[d.name]), d.name)

    while _gpus(lent, deps) > free:
        top = max((d for d in deps if lent[d.name] > 0), key=lambda d: ratio(d, 0))
        lent[top.name] -= 1
    free -= _gpus(lent, deps)
    by_name = {d.name: d for d in deps}
    heap = [ratio(d, 1) for d in deps if lent[d.name] < room[d.name]]
    heapq.heapify(heap)
    while heap:
        name = heapq.heappop(heap)[1]
        dep = by_name[name]
        if dep.gpus_per_replica > free:
            continue  # free only shrinks
        lent[name] += 1
        free -= dep.gpus_per_replica
        if lent[name] < room[name]:
            heapq.heappush(heap, ratio(dep, 1))
    return lent


def _starts(
    pool_gpus: int,
    deps: Sequence[DeploymentDemand],
    replicas: Mapping[str, int],
    lent: Mapping[str, int],
) -> dict[str, int]:
    """Replicas each may start now: toward its allocation, within the GPUs free counting draining ones,
    the lowest fill ratio first; demand-backed replicas before lent ones."""
    free = pool_gpus - sum((d.held + d.draining) * d.gpus_per_replica for d in deps)
    start = {d.name: 0 for d in deps}
    for goal in ({n: replicas[n] - lent[n] for n in replicas}, replicas):
        order = sorted(
            (d for d in deps if goal[d.name] > d.held + start[d.name]),
            key=lambda d: ((d.held + start[d.name]) / goal[d.name], d.name),
        )
        for dep in order:
            n = min(goal[dep.name] - dep.held - start[dep.name], max(0, free) // dep.gpus_per_replica)
            start[dep.name] += n
            free -= n * dep.gpus_per_replica
    return start


def decide(ctx: AllocationContext) -> tuple[Allocation, AllocatorState]:
    """The replicas each deployment may run, what to drain and start, and the state for the next call."""
    deps = list(ctx.deployments)
    pool = ctx.pool_gpus
    base, fit, shortfall = _floors(pool, deps)
    fair = fair_shares(pool, deps)
    wants = {d.name: d.wants if fit else base[d.name] for d in deps}  # floors that do not fit: nothing more
    replicas = _water_fill(pool, deps, _keep(pool, deps, base, wants, fair), base, wants)
    before = dict((ctx.state or AllocatorState()).short_since)
    short = {n: before.get(n, ctx.now_s) for n in sorted(replicas) if replicas[n] < fair[n]}
    # A due deployment stays in ``short`` until its holdings catch up, so the next decisions keep the fair
    # target while the shell drains and starts, instead of waiting out the hold again.
    reclaimed = any(ctx.now_s - t >= ctx.params.reclaim_after_s for t in short.values())
    if reclaimed:
        replicas = dict(fair)
    if fit and ctx.params.lend_idle_gpus:
        lent = _lend(pool, deps, replicas, wants)
    else:
        lent = {d.name: 0 for d in deps}
    replicas = {n: replicas[n] + lent[n] for n in replicas}
    drain = {d.name: max(0, d.held - replicas[d.name]) for d in deps}
    allocation = Allocation(
        replicas=replicas,
        drain=drain,
        start=_starts(pool, deps, replicas, lent),
        fair=fair,
        floors_fit=fit,
        floor_shortfall_gpus=shortfall,
        reclaimed=reclaimed,
        lent=lent,
    )
    return allocation, AllocatorState(tuple(short.items()))
