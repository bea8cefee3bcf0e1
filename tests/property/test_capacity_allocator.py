"""Property tests of the GPU pool allocator's invariants (core/capacity/allocator.py, hypothesis)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgate.core.capacity import (
    Allocation,
    AllocationContext,
    AllocatorParams,
    AllocatorState,
    DeploymentDemand,
    decide,
    fair_shares,
    floor_replicas,
)

EPS = 1e-9


@st.composite
def pools(draw: st.DrawFn, floors_fit: bool | None = None) -> tuple[int, list[DeploymentDemand]]:
    """A pool and 1-5 deployments with demand, floors, replica sizes, weights and holdings."""
    n = draw(st.integers(min_value=1, max_value=5))
    deps = []
    for i in range(n):
        deps.append(
            DeploymentDemand(
                name=f"d{i}",
                demand=draw(st.integers(min_value=0, max_value=12)),
                floor=draw(st.integers(min_value=0, max_value=4)),
                gpus_per_replica=draw(st.sampled_from([1, 1, 2, 4, 8])),
                weight=draw(st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0])),
                held=draw(st.integers(min_value=0, max_value=10)),
                draining=draw(st.integers(min_value=0, max_value=2)),
            )
        )
    need = sum(d.floor * d.gpus_per_replica for d in deps)
    if floors_fit is True:
        pool = draw(st.integers(min_value=need, max_value=need + 64))
    elif floors_fit is False and need > 0:
        pool = draw(st.integers(min_value=0, max_value=need - 1))
    else:
        pool = draw(st.integers(min_value=0, max_value=96))
    return pool, deps


def _level(n: int, d: DeploymentDemand) -> float:
    return (n - d.floor) * d.gpus_per_replica / d.weight


def _free(pool: int, deps: list[DeploymentDemand], replicas: dict[str, int] | object) -> int:
    assert isinstance(replicas, dict)
    return pool - sum(replicas[d.name] * d.gpus_per_replica for d in deps)


reclaim_times = st.sampled_from([0.0, 30.0, 120.0])


def _assert_moves_fit(alloc: Allocation, pool: int, deps: list[DeploymentDemand]) -> None:
    """What drains and starts takes each deployment from what it holds to its allocation, and starts only
    in GPUs that are physically free."""
    for d in deps:
        assert alloc.drain[d.name] == max(0, d.held - alloc.replicas[d.name])
        assert alloc.start[d.name] <= max(0, alloc.replicas[d.name] - d.held)
    used_before = sum((d.held + d.draining) * d.gpus_per_replica for d in deps)
    used_after = used_before + sum(alloc.start[d.name] * d.gpus_per_replica for d in deps)
    assert used_after <= max(pool, used_before)


@settings(max_examples=400, deadline=None)
@given(case=pools(), reclaim_after_s=reclaim_times, now=st.floats(min_value=0, max_value=1e6))
def test_never_above_the_pool_nor_above_what_a_deployment_wants(
    case: tuple[int, list[DeploymentDemand]], reclaim_after_s: float, now: float
) -> None:
    pool, deps = case
    alloc, _ = decide(AllocationContext(now, pool, deps, AllocatorParams(reclaim_after_s=reclaim_after_s)))
    replicas = dict(alloc.replicas)
    assert _free(pool, deps, replicas) >= 0
    assert alloc.gpus(deps) <= pool
    for d in deps:
        assert 0 <= replicas[d.name] <= d.wants
    _assert_moves_fit(alloc, pool, deps)


@settings(max_examples=400, deadline=None)
@given(case=pools(floors_fit=True), reclaim_after_s=reclaim_times)
def test_floors_are_kept_while_they_fit(
    case: tuple[int, list[DeploymentDemand]], reclaim_after_s: float
) -> None:
    pool, deps = case
    alloc, _ = decide(AllocationContext(5.0, pool, deps, AllocatorParams(reclaim_after_s=reclaim_after_s)))
    assert alloc.floors_fit and alloc.floor_shortfall_gpus == 0
    for d in deps:
        assert alloc.replicas[d.name] >= d.floor


@settings(max_examples=300, deadline=None)
@given(case=pools(floors_fit=False))
def test_floors_that_do_not_fit_are_reported_and_nothing_goes_above_them(
    case: tuple[int, list[DeploymentDemand]],
) -> None:
    pool, deps = case
    need = sum(d.floor * d.gpus_per_replica for d in deps)
    alloc, _ = decide(AllocationContext(0.0, pool, deps))
    if need <= pool:  # no floors drawn at all
        return
    assert not alloc.floors_fit
    assert alloc.floor_shortfall_gpus == need - pool
    assert alloc.gpus(deps) <= pool
    for d in deps:
        assert alloc.replicas[d.name] <= d.floor


@settings(max_examples=400, deadline=None)
@given(case=pools(floors_fit=True), reclaim_after_s=reclaim_times)
def test_work_conserving_no_gpu_idle_while_demand_is_unmet(
    case: tuple[int, list[DeploymentDemand]], reclaim_after_s: float
) -> None:
    pool, deps = case
    alloc, _ = decide(AllocationContext(0.0, pool, deps, AllocatorParams(reclaim_after_s=reclaim_after_s)))
    free = _free(pool, deps, dict(alloc.replicas))
    for d in deps:
        if alloc.replicas[d.name] < d.wants:
            assert free < d.gpus_per_replica, (d, free)


@settings(max_examples=400, deadline=None)
@given(case=pools(floors_fit=True))
def test_weighted_max_min_fair_above_the_floors(case: tuple[int, list[DeploymentDemand]]) -> None:
    pool, deps = case
    alloc, _ = decide(AllocationContext(0.0, pool, deps, AllocatorParams(reclaim_after_s=0.0)))
    replicas = dict(alloc.replicas)
    assert replicas == fair_shares(pool, deps)
    free = _free(pool, deps, replicas)
    for j in deps:
        nj = replicas[j.name]
        if nj >= j.wants:
            continue
        for i in deps:
            ni = replicas[i.name]
            if i is j or ni <= i.floor:
                continue
            # no move of i's replicas to make room for one more of j's keeps i above j's level
            k = -(-(j.gpus_per_replica - free) // i.gpus_per_replica)
            if 0 < k <= ni - i.floor:
                assert _level(ni - k, i) <= _level(nj, j) + EPS, (i, ni, j, nj, free)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=6),
    demands=st.lists(st.integers(min_value=0, max_value=20), min_size=6, max_size=6),
    pool=st.integers(min_value=0, max_value=60),
    size=st.sampled_from([1, 2, 4]),
)
def test_equal_sizes_and_weights_differ_by_at_most_one_replica(
    n: int, demands: list[int], pool: int, size: int
) -> None:
    deps = [DeploymentDemand(f"d{i}", demand=demands[i], gpus_per_replica=size) for i in range(n)]
    shares = fair_shares(pool, deps)
    unmet = [shares[d.name] for d in deps if shares[d.name] < d.demand]
    if unmet:
        assert all(shares[d.name] <= min(unmet) + 1 for d in deps), (shares, demands[:n])


def test_small_replicas_do_not_starve_a_deployment_of_large_ones() -> None:
    small = DeploymentDemand("small", demand=100, gpus_per_replica=1)
    large = DeploymentDemand("large", demand=100, gpus_per_replica=4)
    assert fair_shares(5, [small, large]) == {"small": 1, "large": 1}  # not 5 and 0
    assert fair_shares(8, [small, large]) == {"small": 4, "large": 1}


def _run(pool: int, deps: list[DeploymentDemand], reclaim_after_s: float, steps: int) -> list[dict[str, int]]:
    """Repeated decisions every 10 s under constant inputs, the shell applying each at once."""
    params = AllocatorParams(reclaim_after_s=reclaim_after_s)
    state: AllocatorState | None = None
    seen = []
    for k in range(steps):
        alloc, state = decide(AllocationContext(10.0 * k, pool, deps, params, state))
        seen.append(dict(alloc.replicas))
        deps = [dataclasses.replace(d, held=alloc.replicas[d.name], draining=0) for d in deps]
    return seen


def _assert_no_flapping(seen: list[dict[str, int]]) -> None:
    """Under constant inputs the allocation changes at most twice, and never back to one it left."""
    changes = [k for k in range(1, len(seen)) if seen[k] != seen[k - 1]]
    assert len(changes) <= 2, seen
    distinct = [seen[0]] + [seen[k] for k in changes]
    assert all(distinct.count(a) == 1 for a in distinct), distinct


@settings(max_examples=300, deadline=None)
@given(case=pools(), reclaim_after_s=reclaim_times)
def test_no_flapping_under_constant_inputs(
    case: tuple[int, list[DeploymentDemand]], reclaim_after_s: float
) -> None:
    pool, deps = case
    seen = _run(pool, deps, reclaim_after_s, steps=int(reclaim_after_s / 10) + 6)
    _assert_no_flapping(seen)
    assert seen[-1] == fair_shares(pool, deps)  # the hold has passed: the fair target, and it stays


def test_a_held_replica_waits_out_the_hold_then_moves_to_the_starved_deployment() -> None:
    a = DeploymentDemand("a", demand=4, held=4)
    b = DeploymentDemand("b", demand=2, held=0)
    params = AllocatorParams(reclaim_after_s=60.0)
    alloc, state = decide(AllocationContext(0.0, 4, [a, b], params))
    assert dict(alloc.replicas) == {"a": 4, "b": 0} and dict(alloc.fair) == {"a": 2, "b": 2}
    assert not alloc.reclaimed and state.short_since == (("b", 0.0),)
    alloc, state = decide(AllocationContext(59.0, 4, [a, b], params, state))
    assert dict(alloc.replicas) == {"a": 4, "b": 0}
    alloc, state = decide(AllocationContext(60.0, 4, [a, b], params, state))
    assert alloc.reclaimed and dict(alloc.replicas) == {"a": 2, "b": 2}
    assert dict(alloc.drain) == {"a": 2, "b": 0}
    assert dict(alloc.start) == {"a": 0, "b": 0}  # a's replicas still hold the GPUs until drained
    a = dataclasses.replace(a, held=2, draining=2)
    alloc, state = decide(AllocationContext(70.0, 4, [a, b], params, state))
    assert dict(alloc.replicas) == {"a": 2, "b": 2} and dict(alloc.start) == {"a": 0, "b": 0}
    a = dataclasses.replace(a, draining=0)
    alloc, state = decide(AllocationContext(80.0, 4, [a, b], params, state))
    assert dict(alloc.start) == {"a": 0, "b": 2}


def test_a_floor_is_honoured_at_once_without_waiting() -> None:
    a = DeploymentDemand("a", demand=4, held=4)
    b = DeploymentDemand("b", demand=0, floor=3, held=0)
    alloc, _ = decide(AllocationContext(0.0, 4, [a, b], AllocatorParams(reclaim_after_s=600.0)))
    assert dict(alloc.replicas) == {"a": 1, "b": 3} and dict(alloc.drain) == {"a": 3, "b": 0}


def test_weights_and_replica_sizes_share_gpus() -> None:
    a = DeploymentDemand("a", demand=100, gpus_per_replica=1, weight=1.0)
    b = DeploymentDemand("b", demand=100, gpus_per_replica=4, weight=3.0)
    alloc, _ = decide(AllocationContext(0.0, 16, [a, b], AllocatorParams(reclaim_after_s=0.0)))
    assert dict(alloc.replicas) == {"a": 4, "b": 3}  # 4 GPUs against 12: weights 1 to 3


def test_floor_replicas_at_the_target_utilisation() -> None:
    assert floor_replicas(0.0, 100.0, 0.7) == 0
    assert floor_replicas(140.0, 100.0, 0.7) == 2  # exactly two replicas at 70 %
    assert floor_replicas(141.0, 100.0, 0.7) == 3


@settings(max_examples=300, deadline=None)
@given(case=pools(floors_fit=True), reclaim_after_s=reclaim_times)
def test_a_lagging_shell_sees_the_fair_target_held_from_the_reclaim_on(
    case: tuple[int, list[DeploymentDemand]], reclaim_after_s: float
) -> None:
    """The shell drains for one step before the GPUs free up and starts only the ``start`` counts: from the
    first reclaim on the allocation stays the fair target (no second wait, no trading back)."""
    pool, deps = case
    if sum((d.held + d.draining) * d.gpus_per_replica for d in deps) > pool:
        return  # a shell never runs more than its pool
    params = AllocatorParams(reclaim_after_s=reclaim_after_s)
    fair = fair_shares(pool, deps)
    state: AllocatorState | None = None
    reclaimed_at = None
    for k in range(int(reclaim_after_s / 10) + 12):
        alloc, state = decide(AllocationContext(10.0 * k, pool, deps, params, state))
        if alloc.reclaimed and reclaimed_at is None:
            reclaimed_at = k
        if reclaimed_at is not None:
            assert dict(alloc.replicas) == fair, (k, dict(alloc.replicas), fair)
        deps = [
            dataclasses.replace(
                d,
                held=d.held - alloc.drain[d.name] + alloc.start[d.name],
                draining=alloc.drain[d.name],  # the previous step's draining replicas are gone now
            )
            for d in deps
        ]
        assert sum((d.held + d.draining) * d.gpus_per_replica for d in deps) <= pool
    assert {d.name: d.held for d in deps} == dict(alloc.replicas)  # the shell has caught up


def test_a_demand_blip_shorter_than_the_hold_moves_no_replica() -> None:
    a = DeploymentDemand("a", demand=4, held=4)
    params = AllocatorParams(reclaim_after_s=60.0)
    state: AllocatorState | None = None
    for k in range(30):  # b wants 2 replicas every other 10 s step: never short for 60 s on end
        b = DeploymentDemand("b", demand=2 if k % 2 else 0, held=0)
        alloc, state = decide(AllocationContext(10.0 * k, 4, [a, b], params, state))
        assert dict(alloc.replicas) == {"a": 4, "b": 0} and not alloc.reclaimed


def test_empty_pool_and_no_deployments() -> None:
    alloc, state = decide(AllocationContext(0.0, 0, []))
    assert dict(alloc.replicas) == {} and alloc.floors_fit and state == AllocatorState()
    d = DeploymentDemand("a", demand=3, floor=1, held=2)
    alloc, _ = decide(AllocationContext(0.0, 0, [d]))
    assert dict(alloc.replicas) == {"a": 0} and dict(alloc.drain) == {"a": 2}
    assert not alloc.floors_fit and alloc.floor_shortfall_gpus == 1


def test_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match="gpus_per_replica"):
        DeploymentDemand("a", demand=1, gpus_per_replica=0)
    with pytest.raises(ValueError, match="weight"):
        DeploymentDemand("a", demand=1, weight=0.0)
    with pytest.raises(ValueError, match=">= 0"):
        DeploymentDemand("a", demand=-1)
    with pytest.raises(ValueError, match="unique"):
        AllocationContext(0.0, 4, [DeploymentDemand("a", 1), DeploymentDemand("a", 1)])


# ------------------------------------------------------------------------------------------ lending


@st.composite
def lending_pools(draw: st.DrawFn) -> tuple[int, list[DeploymentDemand]]:
    """As :func:`pools` (floors that fit), each deployment given a ``max_replicas`` or none."""
    pool, deps = draw(pools(floors_fit=True))
    out = []
    for d in deps:
        cap = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=24)))
        out.append(dataclasses.replace(d, max_replicas=cap))
    return pool, out


def _no_lending(params: AllocatorParams) -> AllocatorParams:
    return params.model_copy(update={"lend_idle_gpus": False})


@settings(max_examples=400, deadline=None)
@given(case=lending_pools(), reclaim_after_s=reclaim_times, now=st.floats(min_value=0, max_value=1e6))
def test_lending_stays_in_the_pool_and_under_max_replicas(
    case: tuple[int, list[DeploymentDemand]], reclaim_after_s: float, now: float
) -> None:
    pool, deps = case
    alloc, _ = decide(AllocationContext(now, pool, deps, AllocatorParams(reclaim_after_s=reclaim_after_s)))
    assert alloc.gpus(deps) <= pool
    for d in deps:
        lent = alloc.lent[d.name]
        assert 0 <= alloc.backed(d.name) <= d.wants
        if d.max_replicas is None:
            assert lent == 0
        elif lent > 0:
            assert alloc.replicas[d.name] <= d.max_replicas
    _assert_moves_fit(alloc, pool, deps)


@settings(max_examples=400, deadline=None)
@given(case=lending_pools(), reclaim_after_s=reclaim_times)
def test_lent_replicas_only_fill_what_the_demand_backed_allocation_leaves(
    case: tuple[int, list[DeploymentDemand]], reclaim_after_s: float
) -> None:
    """Lent replicas are the first reclaimed: the demand-backed allocation (and the reclaim state) is
    exactly the one without lending, so lending never drains a replica that backs demand."""
    pool, deps = case
    params = AllocatorParams(reclaim_after_s=reclaim_after_s)
    state = AllocatorState((("d0", 0.0),))  # d0 may be due for a reclaim
    on, s_on = decide(AllocationContext(100.0, pool, deps, params, state))
    off, s_off = decide(AllocationContext(100.0, pool, deps, _no_lending(params), state))
    assert {d.name: on.backed(d.name) for d in deps} == dict(off.replicas)
    assert s_on == s_off and on.reclaimed == off.reclaimed and dict(on.fair) == dict(off.fair)
    assert all(v == 0 for v in off.lent.values())
    for d in deps:
        assert on.drain[d.name] <= off.drain[d.name]  # lending only keeps replicas, never takes one


@settings(max_examples=400, deadline=None)
@given(case=lending_pools(), reclaim_after_s=reclaim_times)
def test_no_gpu_idle_while_demand_is_unmet_or_a_deployment_could_take_headroom(
    case: tuple[int, list[DeploymentDemand]], reclaim_after_s: float
) -> None:
    pool, deps = case
    alloc, _ = decide(AllocationContext(0.0, pool, deps, AllocatorParams(reclaim_after_s=reclaim_after_s)))
    free = _free(pool, deps, dict(alloc.replicas))
    for d in deps:
        n = alloc.replicas[d.name]
        if n < d.wants or (d.max_replicas is not None and n < d.max_replicas):
            assert free < d.gpus_per_replica, (d, free, dict(alloc.replicas))


@settings(max_examples=300, deadline=None)
@given(case=lending_pools(), reclaim_after_s=reclaim_times)
def test_lending_does_not_flap_under_constant_inputs(
    case: tuple[int, list[DeploymentDemand]], reclaim_after_s: float
) -> None:
    pool, deps = case
    _assert_no_flapping(_run(pool, deps, reclaim_after_s, steps=int(reclaim_after_s / 10) + 6))


def test_idle_gpus_are_lent_in_proportion_to_demand() -> None:
    a = DeploymentDemand("a", demand=6, held=6, max_replicas=100)
    b = DeploymentDemand("b", demand=2, held=2, max_replicas=100)
    c = DeploymentDemand("c", demand=2, held=2)  # no max_replicas: lent nothing
    alloc, _ = decide(AllocationContext(0.0, 18, [a, b, c]))
    assert dict(alloc.lent) == {"a": 6, "b": 2, "c": 0}
    assert dict(alloc.replicas) == {"a": 12, "b": 4, "c": 2} and dict(alloc.start) == {"a": 6, "b": 2, "c": 0}
    capped = dataclasses.replace(a, max_replicas=8)
    alloc, _ = decide(AllocationContext(0.0, 18, [capped, b, c]))
    assert dict(alloc.lent) == {"a": 2, "b": 6, "c": 0}  # a stops at its max_replicas, b takes the rest


def test_a_lent_replica_is_taken_back_at_once_and_becomes_backed_where_demand_grows() -> None:
    params = AllocatorParams(reclaim_after_s=600.0)  # a demand-backed replica would wait 10 minutes
    a = DeploymentDemand("a", demand=2, held=6, max_replicas=16)  # 4 of them lent
    b = DeploymentDemand("b", demand=2, held=2, max_replicas=16)
    alloc, state = decide(AllocationContext(0.0, 8, [a, b], params))
    assert dict(alloc.lent) == {"a": 4, "b": 0} and not alloc.drain["a"]  # kept where they run: no flap
    # b's demand grows by 3: a's lent replicas give way at once, no hold, b starts once they are drained
    b = dataclasses.replace(b, demand=5)
    alloc, state = decide(AllocationContext(10.0, 8, [a, b], params, state))
    assert dict(alloc.replicas) == {"a": 3, "b": 5} and dict(alloc.lent) == {"a": 1, "b": 0}
    assert dict(alloc.drain) == {"a": 3, "b": 0} and dict(alloc.start) == {"a": 0, "b": 0}
    assert not alloc.reclaimed and state.short_since == ()
    a = dataclasses.replace(a, held=3, draining=3)
    alloc, state = decide(AllocationContext(20.0, 8, [a, b], params, state))
    assert dict(alloc.start) == {"a": 0, "b": 0}  # the GPUs are still draining
    a = dataclasses.replace(a, draining=0)
    alloc, state = decide(AllocationContext(30.0, 8, [a, b], params, state))
    assert dict(alloc.start) == {"a": 0, "b": 3}
    # a's own demand grows into its lent replica: it is now backed, nothing starts or drains
    a = dataclasses.replace(a, demand=3)
    b = dataclasses.replace(b, held=5)
    alloc, _ = decide(AllocationContext(40.0, 8, [a, b], params, state))
    assert dict(alloc.replicas) == {"a": 3, "b": 5} and dict(alloc.lent) == {"a": 0, "b": 0}
    assert dict(alloc.drain) == {"a": 0, "b": 0} and dict(alloc.start) == {"a": 0, "b": 0}


def test_lending_can_be_turned_off() -> None:
    a = DeploymentDemand("a", demand=2, held=2, max_replicas=16)
    alloc, _ = decide(AllocationContext(0.0, 8, [a], AllocatorParams(lend_idle_gpus=False)))
    assert dict(alloc.replicas) == {"a": 2} and dict(alloc.lent) == {"a": 0}
