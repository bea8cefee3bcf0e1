"""The simulator's fast paths give exactly what the plain code gives (speed work must not move results).

- ``SortedOutputHistory`` answers like ``core.units.OutputHistory`` (window, minimum, tenant eviction);
- ``frozen_builder`` objects equal the dataclass's own (classes it cannot build fall back to ``__init__``);
- ``CostProfile.cost`` (which skips terms that are exactly zero) equals the plain formula bit for bit;
- the dispatch gate's backlog (one pass over the snapshots) answers like the routable filter plus a scan;
- the engine model's macro *rebase* (a partly applied decode run continues without replanning) gives
  bit-identical times to replanning, and the KV block bookkeeping that the fast paths rely on holds.
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass

import pytest

from fleetgate.core.lifecycle import ReplicaLoad, SortedOutputHistory
from fleetgate.core.routing import build_policy
from fleetgate.core.routing.filters.affinity import AffinityFilter, AffinityParams
from fleetgate.core.routing.filters.routable import routable
from fleetgate.core.routing.fleetgate import FleetgatePolicy
from fleetgate.core.routing.rates import DecayingRates, ReplicaLoads
from fleetgate.core.types import HealthState, ReplicaSnapshot, RequestInfo, Usage
from fleetgate.core.units import LONG_INPUT_SCALE, CostProfile, OutputHistory
from fleetgate.sim.entities import SimReplica, engine_request, frozen_builder, request_info
from fleetgate.simengine.perfmodel import EngineModel, EngineRequest, PerfParams, StepResult, _new_result


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sorted_history_matches_output_history(seed: int) -> None:
    rng = random.Random(seed)
    ref = OutputHistory(window=16, min_samples=4, max_tenants=3)
    fast = SortedOutputHistory(window=16, min_samples=4, max_tenants=3)
    tenants = [f"t{i}" for i in range(5)]  # more tenants than kept: eviction is exercised
    for _ in range(3000):
        tenant = rng.choice(tenants)
        if rng.random() < 0.5:
            value = rng.choice([0, 1, 7, 7, 50, rng.randint(-3, 3000)])
            ref.observe(tenant, value)
            fast.observe(tenant, value)
        for t in tenants:
            assert fast.p90(t) == ref.p90(t)
            assert fast.quantile(t, 0.5) == ref.quantile(t, 0.5)
            assert fast.count(t) == ref.count(t)
        assert len(fast) == len(ref)


def test_frozen_builder_objects_equal_the_dataclass_own() -> None:
    a = request_info("r1", "m", "t", 100, 30, 1.5, (1, 2), 512, None, 3.0, True)
    b = RequestInfo(
        request_id="r1",
        model="m",
        tenant="t",
        input_tokens=100,
        estimated_output_tokens=30,
        cost_mu=1.5,
        prefix_hashes=(1, 2),
        prefix_block_tokens=512,
        session_key=None,
        arrival_s=3.0,
        stream=True,
    )
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b) and type(a) is RequestInfo
    with pytest.raises(AttributeError):
        a.cost_mu = 2.0  # type: ignore[misc]  # still frozen
    e = engine_request("r1", 100, 30, (1, 2), 0, 512, ())
    assert e == EngineRequest("r1", 100, 30, (1, 2), 0, 512)
    with_ids = engine_request("r2", 3, 1, (), 0, None, (5, 6, 7))  # the engine's own token ids (llama model)
    assert with_ids == EngineRequest("r2", 3, 1, (), 0, None, (5, 6, 7))
    snap = frozen_builder(ReplicaSnapshot, ("name", "health", "inflight_requests"))
    assert snap("a", HealthState.STARTING, 3) == ReplicaSnapshot(
        name="a", health=HealthState.STARTING, inflight_requests=3
    )
    usage = frozen_builder(Usage, ("prompt_tokens", "completion_tokens", "cached_tokens"))
    assert usage(10, 5, 2) == Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=2)


def test_frozen_builder_falls_back_to_init_when_it_cannot_bypass_it() -> None:
    @dataclass(frozen=True, slots=True)
    class Checked:
        x: int
        y: int = 0

        def __post_init__(self) -> None:
            if self.x < 0:
                raise ValueError("x must be >= 0")

    build = frozen_builder(Checked, ("x",))
    assert build(3) == Checked(3)
    with pytest.raises(ValueError):
        build(-1)  # the validation still runs


class _Replanning(EngineModel):
    """The engine without the rebase: every partly applied macro segment is replanned (the old path)."""

    def _apply_macro(self, seg, j, res):  # type: ignore[no-untyped-def]
        end = super()._apply_macro(seg, j, res)
        seg.changed = True  # disables the rebase in ``advance``
        return end


def _check_blocks(m: EngineModel) -> None:
    bt = m.params.block_tokens
    running = m._running
    assert m._used_blocks == sum(r.blocks for r in running)
    for r in running:
        assert r.blocks == -(-r.kv // bt)


def _drive(
    cls: type[EngineModel], seed: int, kv: int
) -> tuple[list[tuple[str, str, float]], tuple[int, ...]]:
    params = PerfParams(
        kv_capacity_tokens=kv,
        max_num_batched_tokens=256,
        max_num_seqs=12,
        prefix_cache_blocks=64,
        step_overhead_s=0.01,
        decode_s_per_kv_token=3e-6,
        prefill_s_per_token_sq=1e-8,
    )
    m = cls(params)
    rng = random.Random(seed)
    log: list[tuple[str, str, float]] = []

    def take(r: StepResult) -> None:
        log.extend(("first", k, v) for k, v in sorted(r.first_token.items()))
        log.extend(("done", k, v) for k, v in sorted(r.finished.items()))
        _check_blocks(m)

    t = 0.0
    for i in range(150):
        t += rng.expovariate(4.0)
        # Advance in small uneven steps so that macro segments are often applied part-way.
        for _ in range(rng.randint(0, 4)):
            take(m.advance(t - rng.random() * 0.2))
        take(m.advance(t))
        n_in, n_out = rng.randint(1, 400), rng.randint(1, 300)
        if m.fits(n_in, n_out):
            hashes = tuple(rng.randint(0, 3) * 100 + b for b in range(n_in // 16))
            m.submit(EngineRequest(f"r{i}", n_in, n_out, hashes), t)
        if rng.random() < 0.05 and i > 3:
            m.cancel(f"r{i - 3}", t)
            take(m.advance(t))
    while (nxt := m.next_event_time()) is not None:
        take(m.advance(nxt - 0.003))
        take(m.advance(nxt))
    s = m.stats()
    return log, (s.generation_tokens, s.preemptions, s.requests_finished, s.prefix_cache_hits)


@pytest.mark.parametrize(("seed", "kv"), [(1, 4096), (2, 4096), (3, 1024), (4, 1024), (5, 700)])
def test_macro_rebase_is_bit_identical_to_replanning(seed: int, kv: int) -> None:
    fast, fast_counts = _drive(EngineModel, seed, kv)
    slow, slow_counts = _drive(_Replanning, seed, kv)
    assert fast == slow  # exact float equality, not approx
    assert fast_counts == slow_counts
    assert fast_counts[2] > 50
    if kv <= 1024:
        assert fast_counts[1] > 0  # small KV caches preempt: those paths are covered too


def _backlog_reference(policy: FleetgatePolicy, replicas: list[ReplicaSnapshot], now: float) -> float:
    """The gate's backlog as first written: the routable filter (detector included), then a whole scan."""
    best = math.inf
    for r in routable(replicas, now, frozenset(), policy.outliers):
        if r.inflight_requests == 0:
            return 0.0
        st = policy.loads.reps.get(r.name)
        left = 0.0 if st is None else st[1] - now
        if left < best:
            best = left if left > 0.0 else 0.0
    return best


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_gate_backlog_one_pass_matches_filter_then_scan(seed: int) -> None:
    """``FleetgatePolicy.backlog_s`` (one pass, stops at the first idle or drained replica) answers like the
    routable filter followed by a scan, and leaves the outlier detector in the same state (its ``allows``
    moves an expired ejection to half-open)."""
    rng = random.Random(seed)
    names = [f"r{i}" for i in range(12)]
    fast = build_policy("fleetgate", {"gate": "on"})
    ref = build_policy("fleetgate", {"gate": "on"})
    assert isinstance(fast, FleetgatePolicy) and isinstance(ref, FleetgatePolicy)
    assert fast.outliers is not None and ref.outliers is not None
    healths = [HealthState.HEALTHY] * 6 + [HealthState.SUSPECT, HealthState.UNHEALTHY, HealthState.STARTING]
    now = 0.0
    blocked = 0
    for step in range(600):
        now += rng.random() * 0.4
        for _ in range(3):  # outcomes: r0-r3 fail mostly (ejected, then half-open after expiry)
            name = rng.choice(names)
            ok = rng.random() < (0.1 if name < "r4" else 0.9)
            fast.outliers.record(name, ok, now)
            ref.outliers.record(name, ok, now)
        blocked += bool(fast.outliers.blocking)
        if rng.random() < 0.5:  # a queue that ends before or after now (or none yet)
            end = now + rng.uniform(-1.0, 3.0)
            fast.loads.reps[name] = [0.0, end]
            ref.loads.reps[name] = [0.0, end]
        snaps = [
            ReplicaSnapshot(
                name=n,
                url=f"http://127.0.0.1:1/{n}",
                health=rng.choice(healths),
                draining=rng.random() < 0.1,
                ejected_until_s=now + 1.0 if rng.random() < 0.1 else 0.0,
                inflight_requests=0 if rng.random() < 0.05 else rng.randint(1, 9),
            )
            for n in names
            if rng.random() < 0.9
        ]
        assert fast.backlog_s(snaps, now) == _backlog_reference(ref, snaps, now), step
        # (the breakers' own fields: ``state()`` reads an expired ejection as half-open either way)
        assert {n: (b.state, b.trials_in_flight) for n, b in fast.outliers._replicas.items()} == {
            n: (b.state, b.trials_in_flight) for n, b in ref.outliers._replicas.items()
        }
        assert fast.outliers.blocking.keys() == ref.outliers.blocking.keys()
    assert blocked > 100  # the detector's path was taken


def _cost_formula(p: CostProfile, inp: float, out: float, cached: float, images: float) -> float:
    """``CostProfile.cost`` as the plain formula, every term added (the fast path skips exact zeros)."""
    i = max(int(inp), 0)
    c = min(max(int(cached), 0), i)
    o = max(float(out), 0.0)
    rate = p.alpha if p.image_mu_per_token is None else p.image_mu_per_token
    return (
        p.gamma
        + p.alpha * (i - c + p.cache_discount * c)
        + p.delta * (i - c) * i / LONG_INPUT_SCALE
        + p.beta * o
        + p.epsilon * o * (i + o / 2.0) / LONG_INPUT_SCALE
        + rate * max(int(images), 0)
    )


def test_cost_is_bit_identical_to_the_plain_formula() -> None:
    rng = random.Random(7)
    for _ in range(20_000):

        def coef() -> float:
            return rng.choice([0.0, 0.0, rng.random(), rng.random() * 1e-3, 1.0, 3.7])

        p = CostProfile(
            alpha=coef(),
            beta=coef(),
            gamma=coef(),
            delta=coef(),
            epsilon=coef(),
            image_mu_per_token=rng.choice([None, coef()]),
            cache_discount=rng.random(),
        )
        inp = rng.choice([0, 1, -5, rng.randint(0, 200_000), 17.0])
        out = rng.choice([0, 0.0, -1, rng.random() * 5000, rng.randint(0, 9000)])
        cached = rng.choice([0, -3, rng.randint(0, 300_000), 2.0])
        images = rng.choice([0, 0, -2, rng.randint(0, 5000), 3.0])
        got = p.cost(inp, out, cached_tokens=cached, image_tokens=images)  # type: ignore[arg-type]
        want = _cost_formula(p, inp, out, cached, images)
        assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want)


def test_sim_replica_counters_follow_replica_load() -> None:
    """``SimReplica.begin``/``end`` (written out) keep the counters exactly as ``ReplicaLoad``'s own, and mark
    the snapshot for rebuilding."""
    rng = random.Random(5)
    ref = ReplicaLoad()
    sink: list[SimReplica] = []
    rep = SimReplica(0, "r0", None, 100.0)  # type: ignore[arg-type]
    rep.sink = sink
    rep.dirty = False
    fields = ("inflight_requests", "inflight_mu", "completed", "failed", "consecutive_failures")
    fields += ("last_success_s",)
    held: list[float] = []
    for step in range(5000):
        if held and rng.random() < 0.5:
            cost = held.pop(rng.randrange(len(held)))
            ok = rng.random() < 0.9
            ref.end(cost, ok, float(step))
            rep.end(cost, ok, float(step))
        else:
            cost = rng.choice([0.0, rng.random(), rng.random() * 1e3, 1e-12])
            held.append(cost)
            ref.begin(cost)
            rep.begin(cost)
        assert [getattr(rep, f) for f in fields] == [getattr(ref, f) for f in fields]
        assert rep.dirty and sink == [rep]
        rep.dirty = False
        sink.clear()


def test_decaying_rates_add_rate_is_add_then_rate() -> None:
    rng = random.Random(9)
    a: DecayingRates[int] = DecayingRates(60.0)
    b: DecayingRates[int] = DecayingRates(60.0)
    now = 0.0
    for _ in range(20_000):
        now += rng.random() * rng.choice([0.01, 1.0, 400.0])  # some steps cross the rebase point
        key = rng.randrange(20)
        amount = rng.choice([0.0, rng.random(), rng.random() * 1e3, -rng.random()])
        a.add(key, amount, now)
        want = a.rate(key, now)
        assert b.add_rate(key, amount, now) == want
        assert a.values == b.values and a.base == b.base


def test_new_step_result_is_the_dataclass_own() -> None:
    """``advance``'s cheap constructor fills every field as ``StepResult(start=..., end=...)`` does."""
    got = _new_result(1.5, 2.5)
    assert got == StepResult(start=1.5, end=2.5) and type(got) is StepResult
    assert got.finished is not _new_result(1.5, 2.5).finished  # fresh containers each time


def _maintain_reference(f: AffinityFilter, now: float, cap_rate: float) -> None:
    """``AffinityFilter.maintain`` as written before its per-key shortcuts (every check on every key)."""
    aff = f.assign
    present = {r.name for r in f.present}
    members = [r.name for r in f.members]
    member_set = set(members)
    n = len(members) or 1
    ttl_edge = now - f.key_ttl_s
    kscale = f.key_rates.scale(now)
    kvals = f.key_rates.values
    for name in [m for m in f.loads.reps if m not in present]:
        f.loads.discard(name)
    for key, state in list(aff.keys.items()):
        if state.last_seen < ttl_edge:
            aff.forget(key)
            f.key_rates.discard(key)
            continue
        for name in [m for m in state.subset if m not in present]:
            aff.drop_member(key, name)
        kr = kvals.get(key, 0.0) * kscale
        while aff.should_shrink(kr, cap_rate, len(state.subset)):
            aff.shrink(key)
        if len(state.subset) < aff.min_subset and members:
            aff.grow(key, member_set, n, min(aff.min_subset, n))
    if members:
        f.rebalance(now, members, cap_rate)


def _affinity_state(f: AffinityFilter) -> tuple[object, ...]:
    aff = f.assign
    keys = [(k, list(s.subset), s.last_seen, dict(s.rank)) for k, s in aff.keys.items()]
    return (keys, dict(aff.slots), aff.total_slots, {k: set(v) for k, v in aff.replica_keys.items()},
            {k: list(v) for k, v in f.loads.reps.items()}, dict(f.key_rates.values), aff.moves)  # fmt: skip


@pytest.mark.parametrize("churn", [True, False])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_affinity_maintain_matches_the_plain_loop(seed: int, churn: bool) -> None:
    """Expiry, departed replicas (``churn``), cooled and hot keys, regrowth: the same subsets and counters,
    in the same order."""
    rng = random.Random(seed)
    params = AffinityParams(key="tenant", min_subset=2, key_ttl_s=30.0, hot_share=0.05)
    loads = ReplicaLoads(60.0)
    f = AffinityFilter(params, loads, DecayingRates(60.0))
    fleet = [f"r{i}" for i in range(12)]
    now = 0.0
    for step in range(3000):
        now += rng.random() * 0.5
        event = rng.random() if churn else 1.0
        if event < 0.01 and len(fleet) > 3:
            fleet.remove(rng.choice(fleet))  # a replica leaves
        elif event < 0.02:
            fleet.append(f"r{12 + step}")  # one joins
        snaps = [ReplicaSnapshot(name) for name in fleet]
        f.observe(snaps, snaps, True)
        req = RequestInfo(request_id=f"q{step}", model="m", tenant=f"t{int(rng.paretovariate(1.2)) % 60}")
        replica = rng.choice(fleet)
        cost = rng.random() * rng.choice([1.0, 50.0])
        f.subset(req, snaps)
        f.record(req, replica, now, cost, 1.5)
        loads.add(replica, cost, now)
        if step % 40 == 39:
            ref = copy.deepcopy(f)
            f.maintain(now, 1.5)
            _maintain_reference(ref, now, 1.5)
            assert _affinity_state(f) == _affinity_state(ref)
