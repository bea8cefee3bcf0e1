"""fleetgate's default policy and its parts: workload keys, bounded-load affinity, decaying rates."""

from __future__ import annotations

import math
import random
import sys
from collections import Counter
from pathlib import Path

import pytest

from fleetgate.core.routing import build_policy
from fleetgate.core.routing.affinity import BoundedLoadAffinity
from fleetgate.core.routing.fleetgate import FleetgatePolicy
from fleetgate.core.routing.keys import KeyFunction, mix64, str_hash64
from fleetgate.core.routing.pipeline import PickContext, StageBase
from fleetgate.core.routing.rates import DecayingRates, ReplicaLoads
from fleetgate.core.types import HealthState, ReplicaSnapshot, RequestInfo
from fleetgate.profiles import load_profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from session_affinity import SESSION9_DEFAULTS


def fleet(n: int, **kw: object) -> list[ReplicaSnapshot]:
    return [ReplicaSnapshot(f"r{i}", **kw) for i in range(n)]  # type: ignore[arg-type]


def request(i: int, hashes: tuple[int, ...] = (), **kw: object) -> RequestInfo:
    base: dict[str, object] = {
        "input_tokens": max(len(hashes), 1) * 512,
        "prefix_hashes": hashes,
        "prefix_block_tokens": 512,
        "cost_mu": 1.0,
    }
    base.update(kw)
    return RequestInfo(request_id=f"q{i}", model="m", **base)  # type: ignore[arg-type]


PROFILE = load_profile("llama2-70b-h100-tp4")  # the deployment's cost profile, loaded outside core


def policy(**params: object) -> FleetgatePolicy:
    p = build_policy("fleetgate", params, profile=PROFILE)
    assert isinstance(p, FleetgatePolicy)
    return p


# -- keys ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "a", "b", "same"),
    [
        ("prefix", {"prefix_hashes": (1, 2, 3)}, {"prefix_hashes": (1, 2, 4)}, True),  # first 1024 tokens
        ("prefix", {"prefix_hashes": (1, 2)}, {"prefix_hashes": (1, 3)}, False),
        ("prefix", {"prefix_hashes": (1,)}, {"prefix_hashes": (1,), "tenant": "x"}, True),
        ("prefix", {"session_key": "s1"}, {"session_key": "s1", "tenant": "x"}, True),  # no prefix: session
        ("session", {"session_key": "s1", "prefix_hashes": (1, 2)}, {"session_key": "s1"}, True),
        ("session", {"session_key": "s1"}, {"session_key": "s2"}, False),
        ("tenant", {"tenant": "t1", "prefix_hashes": (1, 2)}, {"tenant": "t1", "prefix_hashes": (3,)}, True),
        ("tenant", {"tenant": "t1"}, {"tenant": "t2"}, False),
    ],
)
def test_workload_keys(kind: str, a: dict[str, object], b: dict[str, object], same: bool) -> None:
    fn = KeyFunction(kind, key_prefix_tokens=1024)
    ra = RequestInfo(request_id="a", model="m", prefix_block_tokens=512, **a)  # type: ignore[arg-type]
    rb = RequestInfo(request_id="b", model="m", prefix_block_tokens=512, **b)  # type: ignore[arg-type]
    assert (fn(ra) == fn(rb)) is same


def test_hashes_are_stable_across_processes() -> None:
    # Fixed values: Python's randomised hash() would change them from run to run.
    assert str_hash64("tenant") == int.from_bytes(
        __import__("hashlib").blake2b(b"tenant", digest_size=8).digest(), "big"
    )
    assert mix64(0) == 0xE220A8397B1DCDAF
    assert len({mix64(i) >> 60 for i in range(64)}) > 8  # small ids spread over the ring


# -- rates -----------------------------------------------------------------------------------------------


def test_decaying_rates() -> None:
    r: DecayingRates[str] = DecayingRates(tau_s=10.0)
    r.add("a", 10.0, 0.0)
    assert r.rate("a", 0.0) == pytest.approx(1.0)
    assert r.rate("a", 10.0) == pytest.approx(math.exp(-1.0))
    r.add("a", 10.0, 1000.0)  # far later: rebases, stays finite
    assert r.rate("a", 1000.0) == pytest.approx(1.0, rel=1e-6)
    r.shift("a", "b", 0.5, 1000.0)
    assert r.rate("a", 1000.0) == pytest.approx(0.5) and r.rate("b", 1000.0) == pytest.approx(0.5)


def test_replica_loads() -> None:
    loads = ReplicaLoads(tau_s=10.0)
    loads.add("a", 10.0, 0.0)
    loads.add("b", 30.0, 0.0)
    assert loads.rate("a", 0.0) == pytest.approx(1.0)
    assert loads.total * loads.scale(0.0) == pytest.approx(4.0)
    loads.queue("a", 2.0, 1.0)
    loads.queue("a", 2.0, 1.5)  # behind the first: drains at 5.0
    assert loads.reps["a"][1] == pytest.approx(5.0)
    loads.queue("a", 1.0, 9.0)  # the queue had drained
    assert loads.reps["a"][1] == pytest.approx(10.0)
    loads.shift("b", "a", 1.0, 0.0)
    assert loads.rate("a", 0.0) == pytest.approx(2.0) and loads.rate("b", 0.0) == pytest.approx(2.0)
    loads.add("a", 10.0, 10_000.0)  # rebases, stays finite
    assert loads.rate("a", 10_000.0) == pytest.approx(1.0, rel=1e-6)
    loads.discard("a")
    assert loads.total * loads.scale(10_000.0) == pytest.approx(loads.rate("b", 10_000.0))


# -- bounded-load affinity -------------------------------------------------------------------------------


def test_bounded_load_holds_for_many_keys() -> None:
    aff = BoundedLoadAffinity(bound_eps=0.25, min_subset=2)
    names = {f"r{i}" for i in range(10)}
    aff.ensure_ring(names)
    for k in range(2000):
        key = mix64(k)
        aff.commit(key, aff.walk(key, names, len(names), 2), 0.0)
    bound = math.ceil(1.25 * aff.total_slots / len(names))
    assert aff.total_slots == 4000
    assert max(aff.slots.values()) <= bound
    assert all(len(set(st.subset)) == 2 for st in aff.keys.values())


def test_adding_a_replica_moves_few_keys() -> None:
    aff = BoundedLoadAffinity(min_subset=1, bound_eps=10.0)  # loose bound: pure consistent hashing
    names = {f"r{i}" for i in range(8)}
    aff.ensure_ring(names)
    keys = [mix64(k) for k in range(1000)]
    before = {k: aff.walk(k, names, 8, 1)[0] for k in keys}
    aff.ensure_ring({"r8"})
    after = {k: aff.walk(k, names | {"r8"}, 9, 1)[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(after[k] == "r8" for k in moved)  # keys only move to the newcomer
    assert 0.03 < len(moved) / len(keys) < 0.25  # about 1/9 of them


def test_subset_size_follows_key_rate() -> None:
    aff = BoundedLoadAffinity(min_subset=2, hot_share=0.5, max_subset=6)
    assert aff.desired_size(0.1, 1.0, 16) == 2
    assert aff.desired_size(1.6, 1.0, 16) == 4
    assert aff.desired_size(100.0, 1.0, 16) == 6
    assert aff.desired_size(100.0, 1.0, 3) == 3
    assert aff.should_shrink(0.5, 1.0, 4)  # 0.5 < 0.7 * 3 * 0.5
    assert not aff.should_shrink(1.2, 1.0, 4)
    assert not aff.should_shrink(0.0, 1.0, 2)  # never below the minimum


# -- fleetgate policy -----------------------------------------------------------------------------------


def test_conversation_sticks_to_the_replica_with_its_prefix() -> None:
    p = policy()
    rng = random.Random(0)
    replicas = fleet(8)
    first = request(0, (1, 2, 3))
    d0 = p.pick(first, replicas, 0.0, rng)
    p.on_dispatch(first, d0.replica, 0.0)
    for i in range(1, 6):
        r = request(i, (1, 2, 3, *range(10, 10 + i)))
        d = p.pick(r, replicas, 100.0 * i, rng)  # idle fleet: only the cache differs
        p.on_dispatch(r, d.replica, 100.0 * i)
        assert d.replica == d0.replica
        assert d.scores["cached_blocks"] >= 3


def test_a_busy_cache_holder_loses_to_an_idle_replica() -> None:
    p = policy()
    rng = random.Random(0)
    replicas = fleet(4)
    for i in range(30):  # 30 long prompts queued on the holder within one second
        r = request(i, (1, 2, 3, 1000 + i), input_tokens=8000)
        p.on_dispatch(r, "r0", 0.0)
    d = p.pick(request(99, (1, 2, 3, 4)), replicas, 1.0, rng)
    assert d.replica != "r0"
    assert d.scores["est_ttft_s"] < 5.0


@pytest.mark.parametrize(
    ("bound", "fresh", "spills"),
    [(None, 1, True), (6.0, 1, True), (3.0, 1, False), (3.0, 9, True)],
)
def test_cache_leader_spills_only_onto_a_replica_with_a_short_queue(
    bound: float | None, fresh: int, spills: bool
) -> None:
    """``spill_max_wait_s``: the holder of 3 blocks of the prompt (about 15 s of prefill queued) would
    spill to a replica with about 5 s queued (faster by more than 1.5x + 0.5 s), unless that queue times the
    share of the prompt the holder has (3/4: about 3.6 s) exceeds the bound; with 9 fresh blocks the holder
    has only a quarter of the prompt (like a shared template) and spills as before. A loose load guard
    keeps the guard out of it."""
    p = policy(spill_max_wait_s=bound, cached_load_bound=10.0, guard_exempt_ratio=0.1, key="context")
    rng = random.Random(0)
    replicas = fleet(4)
    for i in range(30):
        p.on_dispatch(request(i, (1, 2, 3, 1000 + i), input_tokens=8000), "r0", 0.0)
    for j in (1, 2, 3):
        for i in range(10):
            p.on_dispatch(request(100 * j + i, (50 + 100 * j + i,), input_tokens=8000), f"r{j}", 0.0)
    d = p.pick(request(999, (1, 2, 3, *range(5000, 5000 + fresh))), replicas, 0.0, rng)
    assert (d.replica != "r0") == spills
    assert d.reason == ("fleetgate:spill" if spills else "fleetgate:affinity")


def test_estimated_ttft_counts_uncached_prefill_and_queue() -> None:
    p = policy()
    r = request(0, (1, 2, 3, 4), input_tokens=2048)
    p.on_dispatch(request(1, (1, 2, 3)), "r1", 0.0)
    p.on_complete(request(1, (1, 2, 3)), "r1", 1.0, 0.0, True)  # finished: no decode interference left
    replicas = [
        ReplicaSnapshot("r0", capacity_mu_per_min=60.0),
        ReplicaSnapshot("r1", capacity_mu_per_min=60.0),
    ]
    d = p.pick(r, replicas, 1000.0, random.Random(0))
    assert d.replica == "r1"
    full = p.estimate.prefill_mu(r)
    # r1 holds 3 of 4 blocks: a quarter of the prefill at full price plus the discounted rest (1 MU/s).
    expected = full * 0.25 + full * 0.75 * p.estimate.cache_discount
    assert d.scores["est_ttft_s"] == pytest.approx(expected)


def test_engine_waiting_queue_is_respected() -> None:
    """A replica whose engine is short of KV memory (full cache, a long waiting queue: thrashing) is
    avoided even if the fluid model thinks it is idle."""
    p = policy()
    p.on_dispatch(request(1, (1, 2, 3)), "r0", 0.0)
    thrashing = {"inflight_requests": 50, "inflight_mu": 100.0, "engine_waiting": 45, "engine_running": 5}
    replicas = [ReplicaSnapshot("r0", engine_kv_usage=0.98, **thrashing), ReplicaSnapshot("r1")]  # type: ignore[arg-type]
    d = p.pick(request(2, (1, 2, 3, 4)), replicas, 500.0, random.Random(0))
    assert d.replica == "r1"
    # The same queue with free KV memory is ordinary FCFS queueing, which the fluid queue already models
    # (it drained long ago here): the cached replica keeps the request.
    q = policy()
    q.on_dispatch(request(1, (1, 2, 3)), "r0", 0.0)
    replicas = [ReplicaSnapshot("r0", engine_kv_usage=0.3, **thrashing), ReplicaSnapshot("r1")]  # type: ignore[arg-type]
    assert q.pick(request(2, (1, 2, 3, 4)), replicas, 500.0, random.Random(0)).replica == "r0"
    # ``engine_queue: false`` ignores the scrape altogether.
    o = policy(engine_queue=False)
    o.on_dispatch(request(1, (1, 2, 3)), "r0", 0.0)
    replicas = [ReplicaSnapshot("r0", engine_kv_usage=0.98, **thrashing), ReplicaSnapshot("r1")]  # type: ignore[arg-type]
    assert o.pick(request(2, (1, 2, 3, 4)), replicas, 500.0, random.Random(0)).replica == "r0"


def test_affinity_never_forces_an_unhealthy_or_excluded_replica() -> None:
    p = policy()
    rng = random.Random(0)
    first = request(0, (7, 8, 9))
    d0 = p.pick(first, fleet(4), 0.0, rng)
    p.on_dispatch(first, d0.replica, 0.0)
    sick = [
        ReplicaSnapshot(r.name, health=HealthState.UNHEALTHY) if r.name == d0.replica else r for r in fleet(4)
    ]
    for i in range(20):
        d = p.pick(request(i + 1, (7, 8, 9, i)), sick, 1.0 + i, rng)
        assert d.replica != d0.replica
    retry = p.pick(request(50, (7, 8, 9)), fleet(4), 30.0, rng, frozenset({d0.replica}))
    assert retry.replica != d0.replica


def test_hot_key_spreads_over_a_growing_subset_and_shrinks_when_cool() -> None:
    p = policy(hot_share=0.5, key_ttl_s=10_000)
    rng = random.Random(0)
    replicas = fleet(8)
    key = p.affinity.key_fn(request(0, (5, 6)))
    now = 0.0
    used: Counter[str] = Counter()
    for i in range(3000):  # one key at ~4 replicas' worth of MU per second
        now += 0.15
        r = request(i, (5, 6, 1_000_000 + i), cost_mu=1.0)
        d = p.pick(r, replicas, now, rng)
        p.on_dispatch(r, d.replica, now)
        used[d.replica] += 1
    state = p.affinity.assign.keys[key]
    assert len(state.subset) >= 4
    assert len(used) >= 4
    # It cools down: one request a minute for an hour.
    for i in range(60):
        now += 60.0
        r = request(10_000 + i, (5, 6, 2_000_000 + i), cost_mu=1.0)
        d = p.pick(r, replicas, now, rng)
        p.on_dispatch(r, d.replica, now)
    assert len(p.affinity.assign.keys[key].subset) == p.affinity.assign.min_subset


def test_idle_keys_expire() -> None:
    p = policy(key_ttl_s=100.0, rebalance_interval_s=10.0)
    rng = random.Random(0)
    for i in range(50):
        r = request(i, (i, i + 1000))
        p.on_dispatch(r, p.pick(r, fleet(4), float(i), rng).replica, float(i))
    assert len(p.affinity.assign.keys) == 50
    late = request(999, (99_999, 1))
    p.on_dispatch(late, p.pick(late, fleet(4), 500.0, rng).replica, 500.0)
    p.on_dispatch(late, "r0", 511.0)
    assert len(p.affinity.assign.keys) == 1
    assert p.affinity.assign.total_slots == sum(len(s.subset) for s in p.affinity.assign.keys.values())


def test_departed_replicas_leave_subsets() -> None:
    p = policy(rebalance_interval_s=1.0)
    rng = random.Random(0)
    for i in range(100):
        r = request(i, (i, i + 1000))
        p.on_dispatch(r, p.pick(r, fleet(6), 0.0, rng).replica, 0.0)
    small = fleet(3)
    for t in (1.0, 2.5):
        r = request(1000 + int(t), (1, 2))
        p.on_dispatch(r, p.pick(r, small, t, rng).replica, t)
    names = {r.name for r in small}
    for st in p.affinity.assign.keys.values():
        assert set(st.subset) <= names and len(st.subset) == 2


def test_rebalance_moves_few_keys_from_an_overloaded_replica() -> None:
    p = policy(rebalance_band=0.15, load_bound=100.0)
    names = [f"r{i}" for i in range(4)]
    p.affinity.assign.ensure_ring(names)
    now = 100.0
    tau = p.loads.tau_s
    key_rates = {"r0": [3.0, 3.0] + [1.0] * 10, "r1": [1.0] * 8, "r2": [1.0] * 8, "r3": [1.0] * 8}
    k = 0
    hot = []
    for name, rates in key_rates.items():
        for rate in rates:
            p.affinity.assign.commit(k, [name], now)
            p.key_rates.add(k, rate * tau, now)  # rate MU/s, expressed as decayed MU
            p.loads.add(name, rate * tau, now)
            if rate > 1.0:
                hot.append(k)
            k += 1
    moved = p.affinity.rebalance(now, names)
    assert moved == 2  # the two big keys, not six small ones
    assert all(p.affinity.assign.keys[h].subset != ["r0"] for h in hot)
    rates_after = [p.loads.rate(n, now) for n in names]
    assert max(rates_after) <= 1.15 * sum(rates_after) / 4
    assert p.affinity.assign.moves == 2


def test_seeded_runs_are_identical() -> None:
    def run() -> list[str]:
        p = policy()
        rng = random.Random(11)
        out = []
        for i in range(300):
            r = request(i, (i % 7, i % 13, i), cost_mu=0.5 + (i % 5))
            replicas = [ReplicaSnapshot(f"r{j}", inflight_requests=(i + j) % 4) for j in range(6)]
            d = p.pick(r, replicas, i * 0.3, rng)
            p.on_dispatch(r, d.replica, i * 0.3)
            if i % 3 == 0:
                p.on_complete(r, d.replica, i * 0.3 + 1.0, 0.4, True)
            out.append(d.replica)
        return out

    assert run() == run()


def test_params_are_validated() -> None:
    with pytest.raises(ValueError):
        policy(load_bound=0.5)
    with pytest.raises(ValueError, match="load_signal: Extra inputs are not permitted"):
        policy(load_signal="window")  # removed with its negative result (docs/routing.md)
    assert policy(key="session").affinity.key_fn.kind == "session"


# -- sequence slots, uncached spill ---------------------------------------------------


def test_replica_near_its_sequence_slot_limit_is_avoided() -> None:
    p = policy(max_running=4, slot_fraction=1.0, slot_wait_s=1.0, spill_factor_new=1.0)
    replicas = fleet(2)
    for i in range(4):  # r0 is full: 4 tiny requests in flight
        p.on_dispatch(request(i, input_tokens=1, cost_mu=0.001), "r0", 0.0)
    assert p.inflight("r0") == 4
    d = p.pick(request(10, input_tokens=1, cost_mu=0.001), replicas, 0.0, random.Random(0))
    assert d.replica == "r1"
    for i in range(4):
        p.on_complete(request(i, input_tokens=1, cost_mu=0.001), "r0", 1.0, 0.001, True)
    assert p.inflight("r0") == 0
    assert p.estimate._busy == {}


def test_slot_penalty_grows_with_requests_over_the_threshold() -> None:
    p = policy(max_running=8, slot_fraction=0.5, slot_wait_s=0.25)
    assert p.estimate.slot_from == 4
    for i in range(6):
        p.on_dispatch(request(i, input_tokens=1, cost_mu=0.001), "r0", 0.0)
    assert p.estimate._busy["r0"] == pytest.approx((6 + 1 - 4) * 0.25)


def test_uncached_request_may_leave_its_subset_for_a_faster_replica() -> None:
    # Nothing of the prompt is cached anywhere: the fastest replica takes it (spill_factor_new).
    # A little queued prefill on the subset's replica: the old spill rule (1.5x + 0.5 s) keeps it there.
    for factor, slack, leaves in ((1.0, 0.0, True), (1.5, 0.5, False)):
        p = policy(spill_factor_new=factor, spill_slack_new_s=slack, min_subset=1)
        replicas = fleet(8)
        d0 = p.pick(request(0, (42, 43), input_tokens=4096), replicas, 0.0, random.Random(0))
        p.on_dispatch(request(100, (500,), input_tokens=3000), d0.replica, 0.0)
        d = p.pick(request(1, (42, 43), input_tokens=4096), replicas, 0.0, random.Random(0))
        assert (d.replica != d0.replica) is leaves
        assert d.reason == ("fleetgate:spill" if leaves else "fleetgate:affinity")


@pytest.mark.parametrize(
    "bad",
    [
        {"spill_factor_new": 0.9},
        {"spill_slack_new_s": -1.0},
        {"slot_fraction": 0.0},
        {"max_running": -1},
        {"pick_rule": "ttft"},
        {"interference_seq_tokens": 2.5},
        {"prefill_tokens_per_s": 0.0},
    ],
)
def test_new_parameters_are_validated(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        policy(**bad)


def test_scan_limit_still_finds_the_cache_holder() -> None:
    p = policy(scan_limit=4)
    replicas = fleet(32)
    p.on_dispatch(request(0, (1, 2, 3, 4, 5, 6)), "r17", 0.0)
    p.on_complete(request(0, (1, 2, 3, 4, 5, 6)), "r17", 1.0, 1.0, True)
    for seed in range(10):
        d = p.pick(request(1, (1, 2, 3, 4, 5, 6, 7)), replicas, 2.0, random.Random(seed))
        assert d.replica == "r17"
    with pytest.raises(ValueError):
        policy(scan_limit=-1)


def test_inflight_count_survives_a_retry_without_outcome() -> None:
    p = policy()
    r = request(1, input_tokens=100)
    p.on_dispatch(r, "r0", 0.0)
    p.on_dispatch(r, "r1", 0.1)  # retried elsewhere, the first attempt's outcome never reported
    assert (p.inflight("r0"), p.inflight("r1")) == (0, 1)
    p.on_complete(r, "r1", 1.0, 1.0, True)
    assert p.inflight("r1") == 0


def test_known_prefill_rate_sets_the_estimate_in_engine_seconds() -> None:
    """``prefill_tokens_per_s``: own prefill = uncached tokens / rate; the queue drains in those units."""
    p = policy(prefill_tokens_per_s=1000.0, cache_discount=0.0)
    replicas = fleet(2)
    d = p.pick(request(0, (1, 2, 3, 4), input_tokens=2048), replicas, 0.0, random.Random(0))
    assert d.scores["est_ttft_s"] == pytest.approx(2.048)
    p.on_dispatch(request(0, (1, 2, 3, 4), input_tokens=2048), d.replica, 0.0)
    # The same prompt again at t=1: 1.048 s of the first prefill still queued there, nothing to prefill.
    d2 = p.pick(request(1, (1, 2, 3, 4), input_tokens=2048), replicas, 1.0, random.Random(0))
    assert d2.replica == d.replica
    assert d2.scores["est_ttft_s"] == pytest.approx(1.048)
    # An unrelated prompt goes to the idle replica, estimated at its own prefill only.
    d3 = p.pick(request(2, (9, 10), input_tokens=1024), replicas, 1.0, random.Random(0))
    assert d3.replica != d.replica
    assert d3.scores["est_ttft_s"] == pytest.approx(1.024)


def test_policy_inherits_the_deployments_cost_profile() -> None:
    """The estimate prices prefill with the deployment's ``cost_profile`` (loaded outside core), not the
    built-in default; ``prefill_mu_per_token`` still overrides it."""
    from fleetgate.config import DeploymentConfig
    from fleetgate.gateway.fleet import build_deployment

    dep = build_deployment(DeploymentConfig(model="m", cost_profile="llama2-70b-h100-tp4"))
    assert isinstance(dep.policy, FleetgatePolicy)
    assert dep.policy.estimate.alpha == pytest.approx(dep.profile.alpha) == pytest.approx(PROFILE.alpha)
    assert dep.policy.estimate.max_running == int(PROFILE.perf["max_batch"])
    default = build_deployment(DeploymentConfig(model="m"))
    assert isinstance(default.policy, FleetgatePolicy)
    assert default.policy.estimate.alpha == pytest.approx(default.profile.alpha)
    assert default.policy.estimate.alpha != pytest.approx(dep.policy.estimate.alpha)
    cfg = DeploymentConfig(
        model="m",
        cost_profile="llama2-70b-h100-tp4",
        routing={"policy": "fleetgate", "params": {"prefill_mu_per_token": 0.5}},  # type: ignore[arg-type]
    )
    overridden = build_deployment(cfg).policy
    assert isinstance(overridden, FleetgatePolicy) and overridden.estimate.alpha == 0.5


def test_context_key_follows_the_session_not_the_shared_system_prompt() -> None:
    """``key: context``: a session's next turn keys on its previous turn's prompt (the deepest prefix some
    replica is expected to hold), so two sessions of one tenant get different keys once they have context,
    while their first turns share the system prompt's key (the ``prefix`` key)."""
    p = policy(key="context", key_prefix_tokens=1024)
    rng = random.Random(0)
    replicas = fleet(8)
    system = (1, 2, 3, 4)  # 4 blocks of 512 tokens: deeper than the 1,024-token prefix key
    first_a, first_b = request(0, (*system, 10)), request(1, (*system, 20))
    keys = [p.affinity.key_fn(r) for r in (first_a, first_b)]
    assert keys[0] == keys[1]  # nothing held yet: the prefix key, shared
    for r in (first_a, first_b):
        p.on_dispatch(r, p.pick(r, replicas, 0.0, rng).replica, 0.0)
    next_a, next_b = request(2, (*system, 10, 11)), request(3, (*system, 20, 21))
    ka = p.affinity.key_fn(next_a, 5)  # what pick passes: 5 blocks held (turn 1's prompt)
    kb = p.affinity.key_fn(next_b, 5)
    assert ka != kb and keys[0] not in (ka, kb)
    served = {}
    for r in (next_a, next_b):
        d = p.pick(r, replicas, 1.0, rng)
        assert d.scores["cached_blocks"] == 5  # each turn goes where its own context is
        served[r.request_id] = d.replica
    assert p.affinity.key_fn(request(4, (1, 2))) == p.affinity.key_fn(request(5, (1, 2)), 0)


@pytest.mark.parametrize("rate", [None, 2000.0])
def test_fused_pick_agrees_with_its_parts(rate: float | None) -> None:
    """The fused ``pick`` reports the TTFT estimate the ``ttft_estimate`` part computes for the chosen
    replica, and never picks a replica the ``load_guard`` part drops (unless the guard would drop all)."""
    p = policy(**({} if rate is None else {"prefill_tokens_per_s": rate}))
    rng = random.Random(5)
    replicas = [
        ReplicaSnapshot(f"r{j}", capacity_mu_per_min=60.0 + 10 * j, learned_prefill_tokens_per_s=1500.0 + j)
        for j in range(6)
    ]
    from fleetgate.core.routing.pipeline import PickContext

    for i in range(400):
        now = i * 0.05
        r = request(i, (i % 5, 100 + i % 11, 1000 + i), cost_mu=0.2 + (i % 7) * 0.3)
        kept = p.guard.filter(r, list(replicas), PickContext(now, rng, frozenset()))
        times, _, _ = p.estimate.estimates(r, replicas, now)
        d = p.pick(r, replicas, now, rng)
        k = [x.name for x in replicas].index(d.replica)
        assert d.scores["est_ttft_s"] == pytest.approx(times[k], rel=1e-12)
        assert len(kept) == len(replicas) or d.replica in {x.name for x in kept}
        p.on_dispatch(r, d.replica, now)
        if i % 3 == 0:
            p.on_complete(r, d.replica, now + 0.5, r.cost_mu, True)


#: Session 9's defaults, one copy of them (bench/session_affinity.py).
SESSION9: dict[str, object] = dict(SESSION9_DEFAULTS)


class _Neutral(StageBase):
    """An extra scorer scoring every candidate 1 (adds 0 s): it only sends ``pick`` to its general loop."""

    name = "neutral"

    def score(self, request: RequestInfo, candidates: list[ReplicaSnapshot], ctx: PickContext) -> list[float]:
        return [1.0] * len(candidates)


@pytest.mark.parametrize(
    "params",
    [
        {},  # the session-10 defaults: pooled learned rates on the relative scale, the tail bound
        SESSION9,  # each replica's own learned rate (the plain loop before session 11)
        {"learned_rate_noise": 1.0},  # relative scale, no shrinkage
        {"scan_limit": 5},
        {"guard_exempt_s": 0.05, "spill_max_reprefill_s": 0.05},  # session 14's opt-in seconds rules
    ],
    ids=["default", "session9", "relative-noise1", "scan", "reprefill-s"],
)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fused_loop_makes_the_general_loops_decisions(params: dict[str, object], seed: int) -> None:
    """``pick``'s fused loop is the general loop's rule: on random fleets (MU rates, learned rates coming
    and changing, engine queues, KV pressure, late first tokens for the tail bound) a policy whose only
    difference is a neutral extra scorer (which takes the general loop) makes the same decisions, estimates
    included, at every pick."""
    rnd = random.Random(seed)
    fused = policy(**params)
    general = FleetgatePolicy(fused.params, PROFILE, scorers=[(_Neutral(), 1.0)])
    n = 12
    caps = [rnd.choice((60.0, 100.0, 100.0, 140.0)) for _ in range(n)]
    rates: list[float | None] = [None] * n
    inflight: list[tuple[RequestInfo, str, float]] = []
    picks = {"fused": random.Random(seed), "general": random.Random(seed)}
    for i in range(1500):
        now = i * 0.02
        if rnd.random() < 0.05:  # a replica learns (or relearns) its prefill rate
            rates[rnd.randrange(n)] = rnd.choice((None, 2000.0, 2100.0, 4000.0, 9000.0, 1000.0 + i))
        busy = {name for _, name, _ in inflight}
        replicas = [
            ReplicaSnapshot(
                f"r{j}",
                capacity_mu_per_min=caps[j],
                learned_prefill_tokens_per_s=rates[j],
                inflight_requests=sum(1 for _, name, _ in inflight if name == f"r{j}"),
                inflight_mu=sum(q.cost_mu for q, name, _ in inflight if name == f"r{j}"),
                engine_waiting=rnd.choice((0, 0, 3)) if f"r{j}" in busy else 0,
                engine_kv_usage=rnd.choice((0.2, 0.97)),
            )
            for j in range(n)
        ]
        group = rnd.randrange(8)
        hashes = (group, *(group * 100 + k for k in range(rnd.randint(0, 6))))
        r = request(i, hashes, cost_mu=0.2 + rnd.random() * 3, stream=True)
        a = fused.pick(r, replicas, now, picks["fused"])
        b = general.pick(r, replicas, now, picks["general"])
        assert (a.replica, a.reason, dict(a.scores)) == (b.replica, b.reason, dict(b.scores)), i
        assert fused.estimate.memo == general.estimate.memo
        for p in (fused, general):
            p.on_dispatch(r, a.replica, now)
        inflight.append((r, a.replica, now + rnd.choice((0.1, 0.5, 4.0))))
        for q, name, first in [x for x in inflight if x[2] <= now]:
            inflight.remove((q, name, first))
            for p in (fused, general):
                p.on_first_token(q, name, first)
                p.on_complete(q, name, now, q.cost_mu, True)
    assert fused.tail_bound_drops() == general.tail_bound_drops()
    assert fused.guard.skips == general.guard.skips
