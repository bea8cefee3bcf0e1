"""Table-driven tests of the routing registry, pipeline parts and baseline policies."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest

from fleetgate.core.errors import ServiceUnavailableError
from fleetgate.core.routing import POLICY_NAMES, build_policy
from fleetgate.core.routing.filters import RandomSampleFilter, RoutableFilter
from fleetgate.core.routing.outlier import OutlierDetector
from fleetgate.core.routing.pickers import MaxScorePicker, RandomPicker, RoundRobinPicker
from fleetgate.core.routing.pipeline import PickContext, PipelinePolicy
from fleetgate.core.routing.scorers import (
    InflightRequestsScorer,
    QueueLengthScorer,
    lower_is_better,
    queue_length,
)
from fleetgate.core.types import HealthState, ReplicaSnapshot, RequestInfo

REQ = RequestInfo(request_id="q1", model="m", input_tokens=100, cost_mu=0.5)


def fleet(n: int, **overrides: object) -> list[ReplicaSnapshot]:
    return [ReplicaSnapshot(f"r{i}", **overrides) for i in range(n)]  # type: ignore[arg-type]


def ctx(now: float = 0.0, exclude: Sequence[str] = (), seed: int = 0) -> PickContext:
    return PickContext(now, random.Random(seed), frozenset(exclude))


# -- registry --------------------------------------------------------------------------------------------


def test_config_accepts_exactly_the_registered_policies() -> None:
    from fleetgate.config import ROUTING_VARIANTS, DeploymentConfig

    assert tuple(ROUTING_VARIANTS) == POLICY_NAMES
    for name in POLICY_NAMES:
        cfg = DeploymentConfig(model="m", routing={"policy": name})  # type: ignore[arg-type]
        assert cfg.routing.policy == name
        assert build_policy(name, cfg.routing.params).name == name
    with pytest.raises(ValueError, match="does not match any of the expected tags"):
        DeploymentConfig(model="m", routing={"policy": "nope"})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_builds_and_picks(name: str) -> None:
    policy = build_policy(name)
    assert policy.name == name
    d = policy.pick(REQ, fleet(4), 0.0, random.Random(1))
    assert d.replica in {"r0", "r1", "r2", "r3"}
    policy.on_dispatch(REQ, d.replica, 0.0)
    policy.on_complete(REQ, d.replica, 1.0, 0.5, True)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_fresh_object_per_build(name: str) -> None:
    assert build_policy(name) is not build_policy(name)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("nope", None, "unknown routing policy"),
        ("round_robin", {"bogus": 1}, "bogus: Extra inputs are not permitted"),
        ("least_requests", {"tie_break": "sideways"}, "tie_break"),
        ("p2c", {"choices": 0}, "choices: Input should be greater than or equal to 1"),
        ("cache_aware", {"cache_threshold": 2.0}, "cache_threshold"),
        ("cache_aware", {"bogus": 1}, "bogus: Extra inputs"),
        ("fleetgate", {"key": "colour"}, "key: Input should be 'prefix', 'session', 'tenant' or 'context'"),
        ("fleetgate", {"bogus": 1}, "invalid parameters for routing policy 'fleetgate': bogus"),
        ("random", {"outlier": {"consecutive_failures": 0}}, "consecutive_failures"),
    ],
)
def test_bad_config_fails_at_build(name: str, params: dict[str, object] | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_policy(name, params)


# -- unroutable replicas and ServiceUnavailableError -----------------------------------------------------

UNROUTABLE = [
    ReplicaSnapshot("bad-unhealthy", health=HealthState.UNHEALTHY),
    ReplicaSnapshot("bad-restarting", health=HealthState.RESTARTING),
    ReplicaSnapshot("bad-starting", health=HealthState.STARTING),
    ReplicaSnapshot("bad-draining", draining=True),
    ReplicaSnapshot("bad-ejected", ejected_until_s=100.0),
]


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_only_routable_replicas_are_picked(name: str) -> None:
    policy = build_policy(name)
    replicas = [*UNROUTABLE, ReplicaSnapshot("ok-suspect", health=HealthState.SUSPECT), ReplicaSnapshot("ok")]
    rng = random.Random(3)
    seen = set()
    for i in range(40):
        req = RequestInfo(request_id=f"q{i}", model="m", input_tokens=50, prefix_hashes=(i % 3, i))
        d = policy.pick(req, replicas, 10.0, rng, frozenset({"ok"}) if i % 2 else frozenset())
        policy.on_dispatch(req, d.replica, 10.0)
        seen.add(d.replica)
        assert d.replica.startswith("ok")
        if i % 2:
            assert d.replica == "ok-suspect"
    assert seen == {"ok", "ok-suspect"}


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_no_routable_replica_raises_503(name: str) -> None:
    policy = build_policy(name)
    with pytest.raises(ServiceUnavailableError) as err:
        policy.pick(REQ, UNROUTABLE, 10.0, random.Random(0))
    assert err.value.status == 503
    with pytest.raises(ServiceUnavailableError):
        policy.pick(REQ, fleet(2), 0.0, random.Random(0), frozenset({"r0", "r1"}))
    with pytest.raises(ServiceUnavailableError):
        policy.pick(REQ, [], 0.0, random.Random(0))


def test_ejection_ends_when_its_time_passes() -> None:
    policy = build_policy("round_robin")
    replicas = [ReplicaSnapshot("a", ejected_until_s=5.0)]
    with pytest.raises(ServiceUnavailableError):
        policy.pick(REQ, replicas, 4.9, random.Random(0))
    assert policy.pick(REQ, replicas, 5.0, random.Random(0)).replica == "a"


# -- baselines -------------------------------------------------------------------------------------------


def test_round_robin_cycles_and_skips_excluded() -> None:
    policy = build_policy("round_robin")
    rng = random.Random(0)
    picks = [policy.pick(REQ, fleet(3), 0.0, rng).replica for _ in range(6)]
    assert picks == ["r0", "r1", "r2", "r0", "r1", "r2"]
    assert policy.pick(REQ, fleet(3), 0.0, rng, frozenset({"r0"})).replica == "r1"
    # A replica leaving does not make the cycle skip others or repeat.
    two = [r for r in fleet(3) if r.name != "r2"]
    assert [policy.pick(REQ, two, 0.0, rng).replica for _ in range(3)] == ["r0", "r1", "r0"]


def test_random_is_uniform_and_seeded() -> None:
    counts = Counter(
        build_policy("random").pick(REQ, fleet(4), 0.0, random.Random(i)).replica for i in range(4000)
    )
    assert set(counts) == {"r0", "r1", "r2", "r3"}
    assert max(counts.values()) < 1.15 * min(counts.values())
    a = [build_policy("random").pick(REQ, fleet(8), 0.0, random.Random(42)).replica for _ in range(3)]
    assert len(set(a)) == 1


@pytest.mark.parametrize(
    ("inflight", "expected"),
    [
        ([3, 1, 2], {"r1"}),
        ([0, 5, 0], {"r0", "r2"}),
        ([7, 7, 7], {"r0", "r1", "r2"}),
    ],
)
def test_least_requests_picks_fewest_inflight(inflight: list[int], expected: set[str]) -> None:
    replicas = [ReplicaSnapshot(f"r{i}", inflight_requests=v) for i, v in enumerate(inflight)]
    policy = build_policy("least_requests")
    rng = random.Random(5)
    got = {policy.pick(REQ, replicas, 0.0, rng).replica for _ in range(60)}
    assert got == expected  # ties are spread by the rng


def test_least_requests_first_tie_break_is_stable() -> None:
    replicas = [ReplicaSnapshot(f"r{i}", inflight_requests=v) for i, v in enumerate([2, 0, 0])]
    policy = build_policy("least_requests", {"tie_break": "first"})
    assert {policy.pick(REQ, replicas, 0.0, random.Random(i)).replica for i in range(20)} == {"r1"}


@pytest.mark.parametrize(
    ("snap", "length"),
    [
        (ReplicaSnapshot("a", inflight_requests=4), 4.0),
        (ReplicaSnapshot("a", inflight_requests=1, engine_waiting=3, engine_running=2), 5.0),
        (ReplicaSnapshot("a", inflight_requests=9, engine_waiting=3, engine_running=2), 9.0),
        (ReplicaSnapshot("a", inflight_requests=0, engine_running=6), 6.0),
    ],
)
def test_queue_length_prefers_engine_but_never_below_inflight(snap: ReplicaSnapshot, length: float) -> None:
    assert queue_length(snap) == length


def test_p2c_never_picks_the_longer_of_two() -> None:
    replicas = [
        ReplicaSnapshot(f"r{i}", inflight_requests=i, engine_waiting=i, engine_running=0) for i in range(6)
    ]
    policy = build_policy("p2c")
    counts = Counter(policy.pick(REQ, replicas, 0.0, random.Random(s)).replica for s in range(3000))
    assert "r5" not in counts  # the longest queue only wins if drawn twice, which p2c never does
    assert counts["r0"] > counts["r1"] > counts["r2"] > counts["r3"] > counts["r4"]


# -- parts -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "scores"),
    [([1.0, 3.0, 2.0], [1.0, 0.0, 0.5]), ([2.0, 2.0], [1.0, 1.0]), ([5.0], [1.0])],
)
def test_lower_is_better(values: list[float], scores: list[float]) -> None:
    assert lower_is_better(values) == scores


def test_scorers_return_unit_interval() -> None:
    replicas = [ReplicaSnapshot(f"r{i}", inflight_requests=i * 3, engine_waiting=i) for i in range(5)]
    for scorer in (InflightRequestsScorer(), QueueLengthScorer()):
        scores = scorer.score(REQ, replicas, ctx())
        assert len(scores) == 5 and all(0.0 <= s <= 1.0 for s in scores)
        assert scores[0] == 1.0 and scores[-1] == 0.0


def test_random_sample_filter_draws_distinct() -> None:
    f = RandomSampleFilter(2)
    for seed in range(200):
        got = f.filter(REQ, fleet(5), ctx(seed=seed))
        assert len(got) == 2 and got[0].name != got[1].name
    three = RandomSampleFilter(3).filter(REQ, fleet(10), ctx(seed=1))
    assert len({r.name for r in three}) == 3
    assert RandomSampleFilter(4).filter(REQ, fleet(3), ctx()) == fleet(3)


def test_pickers() -> None:
    cands = fleet(3)
    assert MaxScorePicker("first").pick(cands, [0.2, 0.9, 0.9], ctx()) == 1
    assert {MaxScorePicker("random").pick(cands, [0.2, 0.9, 0.9], ctx(seed=s)) for s in range(30)} == {1, 2}
    assert 0 <= RandomPicker().pick(cands, None, ctx()) < 3
    rr = RoundRobinPicker()
    assert [rr.pick(cands, None, ctx()) for _ in range(4)] == [0, 1, 2, 0]


def test_weighted_pipeline_combines_scores_and_explains() -> None:
    replicas = [
        ReplicaSnapshot("a", inflight_requests=0, engine_waiting=10, engine_running=0),
        ReplicaSnapshot("b", inflight_requests=4, engine_waiting=0, engine_running=4),
    ]
    p = PipelinePolicy(
        "custom",
        [RoutableFilter()],
        [(InflightRequestsScorer(), 1.0), (QueueLengthScorer(), 3.0)],
        MaxScorePicker("first"),
    )
    d = p.pick(REQ, replicas, 0.0, random.Random(0))
    assert d.replica == "b"  # the queue scorer outweighs the in-flight scorer 3:1
    assert d.scores == {"inflight_requests": 0.0, "queue_length": 1.0}
    assert d.reason == "custom"


def test_routable_filter_panic_mode_ignores_detector_only() -> None:
    det = OutlierDetector()
    for name in ("r0", "r1", "r2", "r3"):
        det.record(name, True, 0.0)
    for _ in range(5):
        det.record("r0", False, 1.0)
    f = RoutableFilter(det)
    assert [r.name for r in f.filter(REQ, fleet(2), ctx(now=2.0))] == ["r1"]
    # Only the ejected replica left: better a doubtful replica than a 503.
    assert [r.name for r in f.filter(REQ, fleet(1), ctx(now=2.0))] == ["r0"]
    # ... but exclude, health and draining are never overridden.
    assert f.filter(REQ, fleet(1), ctx(now=2.0, exclude=["r0"])) == []


def test_scorer_plugins_by_name_from_config() -> None:
    replicas = [
        ReplicaSnapshot("a", inflight_requests=0, engine_kv_usage=0.95),
        ReplicaSnapshot("b", inflight_requests=3, engine_kv_usage=0.10),
    ]
    plain = build_policy("least_requests")
    assert plain.pick(REQ, replicas, 0.0, random.Random(0)).replica == "a"
    kv = build_policy("least_requests", {"scorers": {"inflight_requests": 1.0, "kv_usage": 2.0}})
    d = kv.pick(REQ, replicas, 0.0, random.Random(0))
    assert d.replica == "b"
    assert d.scores == {"inflight_requests": 0.0, "kv_usage": pytest.approx(0.9)}
    with pytest.raises(ValueError, match=r"scorers.0: Input tag 'vibes' .* does not match"):
        build_policy("p2c", {"scorers": {"vibes": 1.0}})
    with pytest.raises(ValueError, match="positive weight"):
        build_policy("p2c", {"scorers": {"queue_length": 0.0}})


def test_kv_usage_scorer_treats_unknown_as_neutral() -> None:
    from fleetgate.core.routing.scorers import KvUsageScorer

    replicas = [
        ReplicaSnapshot("a", engine_kv_usage=0.2),
        ReplicaSnapshot("b"),
        ReplicaSnapshot("c", engine_kv_usage=1.3),
    ]
    assert KvUsageScorer().score(REQ, replicas, ctx()) == [pytest.approx(0.8), 0.5, 0.0]


def test_ttft_estimate_scorer_combines_with_any_scored_policy() -> None:
    """The TTFT estimate is a plain scorer too: least_requests with it avoids the replica that has a long
    prefill queued (fed by the pipeline's dispatch hook) and forgets it at completion."""
    policy = build_policy(
        "least_requests", {"scorers": [{"type": "ttft_estimate", "prefill_tokens_per_s": 1000}]}
    )
    assert policy.uses_prefix_hashes
    replicas = fleet(2)
    long = RequestInfo(request_id="long", model="m", input_tokens=5000, cost_mu=5.0)
    policy.on_dispatch(long, "r0", 0.0)
    short = RequestInfo(request_id="short", model="m", input_tokens=100, cost_mu=0.1)
    d = policy.pick(short, replicas, 1.0, random.Random(0))
    assert d.replica == "r1" and d.scores == {"ttft_estimate": 1.0}
    policy.on_complete(long, "r0", 6.0, 5.0, True)
    p2c = build_policy("p2c", {"scorers": {"ttft_estimate": 1.0, "queue_length": 0.5}})
    assert p2c.pick(short, replicas, 0.0, random.Random(0)).replica in {"r0", "r1"}


def test_fleetgate_takes_extra_scorers_as_seconds() -> None:
    """An extra scorer adds weight x (1 - score) seconds to the TTFT estimate: a strong kv_usage weight moves
    an otherwise equal request off the replica whose KV cache is nearly full, whichever that is."""
    req = RequestInfo(request_id="q", model="m", input_tokens=100, cost_mu=0.1)
    for full, other in (("a", "b"), ("b", "a")):
        replicas = [ReplicaSnapshot("a", engine_kv_usage=0.99 if full == "a" else 0.0)]
        replicas.append(ReplicaSnapshot("b", engine_kv_usage=0.99 if full == "b" else 0.0))
        kv = build_policy("fleetgate", {"scorers": {"kv_usage": 10.0}})
        d = kv.pick(req, replicas, 0.0, random.Random(0))
        plain = build_policy("fleetgate").pick(req, replicas, 0.0, random.Random(0))
        assert d.replica == other
        assert d.scores["est_ttft_s"] == pytest.approx(plain.scores["est_ttft_s"])  # + 0 s on the free one
    with pytest.raises(ValueError, match=r"scorers\.0"):
        build_policy("fleetgate", {"scorers": {"vibes": 1.0}})
