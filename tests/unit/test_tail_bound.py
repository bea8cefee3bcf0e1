"""The tail bound (``filters.tail_bound``): a replica whose oldest unanswered request is overdue gets no new
requests while others are on time, alone and inside fleetgate's policy (issue 20, item 3)."""

from __future__ import annotations

import random
from statistics import median

import pytest

from fleetgate.core.routing import build_policy
from fleetgate.core.routing.filters.tail_bound import TailBound, TailBoundParams
from fleetgate.core.routing.fleetgate import FleetgatePolicy
from fleetgate.core.routing.pipeline import PickContext
from fleetgate.core.routing.rates import ReplicaLoads
from fleetgate.core.types import ReplicaSnapshot, RequestInfo
from fleetgate.profiles import load_profile

PROFILE = load_profile("llama2-70b-h100-tp4")


def fleet(n: int) -> list[ReplicaSnapshot]:
    return [ReplicaSnapshot(f"r{i}") for i in range(n)]


def req(i: int, stream: bool = True, **kw: object) -> RequestInfo:
    return RequestInfo(
        request_id=f"q{i}",
        model="m",
        input_tokens=1000,
        cost_mu=1.0,
        stream=stream,
        **kw,  # type: ignore[arg-type]
    )


def names(reps: list[ReplicaSnapshot]) -> list[str]:
    return [r.name for r in reps]


def test_overdue_replica_dropped_until_its_queue_moves() -> None:
    tb = TailBound(TailBoundParams(tail_bound_s=5.0, tail_bound_factor=2.0))
    reps = fleet(5)
    tb.expect(req(1), "r0", 10.0)  # expected first token at t=10
    tb.expect(req(2), "r0", 12.0)
    tb.expect(req(3), "r1", 15.0)
    assert tb.keep(reps, 14.0) is reps  # r0 4 s late: within 5 s
    assert tb.overdue_s("r0", 16.0) == pytest.approx(6.0)
    # r0 6 s late, r1 1 s, the others on time: the median is 0, the limit 2 x 0 + 5
    assert names(tb.keep(reps, 16.0)) == ["r1", "r2", "r3", "r4"]
    assert tb.dropped == 1
    # r0's second request answers first: first come first served, so the first one has started too
    tb.on_first_token(req(2), "r0", 16.5)
    assert tb.overdue_s("r0", 16.5) == 0.0
    assert tb.keep(reps, 16.5) is reps
    # a completion answers its own request only
    tb.on_complete(req(3), "r1", 30.0, 1.0, True)
    assert tb.overdue_s("r1", 30.0) == 0.0


def test_bound_is_relative_to_the_fleets_median() -> None:
    """A fleet that is late everywhere keeps every replica (one that just answered does not draw them all);
    only a replica far later than the typical one is dropped."""
    tb = TailBound(TailBoundParams(tail_bound_s=5.0, tail_bound_factor=2.0))
    reps = fleet(4)
    for i in range(3):
        tb.expect(req(i), f"r{i}", 0.0)
    assert tb.keep(reps, 40.0) is reps  # 40 / 40 / 40 / 0 s late: median 40, limit 85
    tb.on_first_token(req(1), "r1", 90.0)
    tb.on_first_token(req(2), "r2", 90.0)
    tb.expect(req(11), "r1", 90.0)
    tb.expect(req(12), "r2", 90.0)
    # at t=100: r0 100 s late, r1 and r2 10 s, r3 on time: median 10, limit 25
    assert names(tb.keep(reps, 100.0)) == ["r1", "r2", "r3"]


def test_requests_not_streamed_are_not_waited_for() -> None:
    """The gateway reports a first token only for streamed requests: another one never counts as late."""
    tb = TailBound(TailBoundParams(tail_bound_s=1.0))
    tb.expect(req(1, stream=False), "r0", 0.0)
    assert tb.overdue_s("r0", 100.0) == 0.0
    assert tb.keep(fleet(3), 100.0) == fleet(3)


def test_retry_and_unknown_first_tokens() -> None:
    tb = TailBound(TailBoundParams(tail_bound_s=1.0))
    tb.expect(req(1), "r0", 0.0)
    tb.expect(req(1), "r1", 5.0)  # a retry on r1: r0 no longer waits for it
    assert tb.overdue_s("r0", 20.0) == 0.0
    assert tb.overdue_s("r1", 20.0) == pytest.approx(15.0)
    tb.on_first_token(req(1), "r0", 20.0)  # not pending there: ignored
    assert tb.overdue_s("r1", 20.0) == pytest.approx(15.0)


def test_pipeline_filter_expects_the_fluid_queue_end() -> None:
    loads = ReplicaLoads(60.0)
    loads.queue("r0", 4.0, 1.0)  # prefill queued there until t=5
    tb = TailBound(TailBoundParams(tail_bound_s=2.0), loads)
    tb.on_dispatch(req(1), "r0", 1.0)
    tb.on_dispatch(req(2), "r1", 1.0)  # nothing queued: expected now
    assert tb.overdue_s("r0", 6.0) == pytest.approx(1.0)
    ctx = PickContext(3.0, random.Random(0), frozenset())
    assert names(tb.filter(req(3), fleet(3), ctx)) == ["r0", "r1", "r2"]  # r1 2 s late: within 2 s
    ctx = PickContext(4.0, random.Random(0), frozenset())
    assert names(tb.filter(req(3), fleet(3), ctx)) == ["r0", "r2"]  # r1 3 s late, r0 and r2 on time


def test_params_off_by_default_and_validated() -> None:
    assert TailBoundParams().tail_bound_s is None
    with pytest.raises(ValueError):
        TailBound(TailBoundParams())
    with pytest.raises(ValueError):
        build_policy("fleetgate", {"tail_bound_s": -1.0}, profile=PROFILE)
    # The policy's default has the bound on since session 10 (2 s, keeping a holder of half the prompt);
    # ``tail_bound_s: null`` turns it off.
    p = build_policy("fleetgate", {}, profile=PROFILE)
    assert isinstance(p, FleetgatePolicy) and p.tail is not None
    assert (p.tail.slack_s, p.tail.keep_share) == (2.0, 0.5)
    p = build_policy("fleetgate", {"tail_bound_s": None}, profile=PROFILE)
    assert isinstance(p, FleetgatePolicy) and p.tail is None


def test_fleetgate_skips_a_stuck_cache_holder() -> None:
    """Without the bound a request goes to the replica holding its prefix; with the bound (and no
    exception for holders), not while that replica's earlier request is long overdue (the estimate there is
    wrong)."""
    reps = fleet(4)
    rng = random.Random(0)
    hashes = tuple(range(1, 9))

    def pick_after_stall(params: dict[str, object]) -> str:
        p = build_policy("fleetgate", params, profile=PROFILE)
        first = req(1, prefix_hashes=hashes, prefix_block_tokens=128)
        home = p.pick(first, reps, 0.0, rng).replica
        p.on_dispatch(first, home, 0.0)
        # 60 s later no first token came back from ``home``; the same prefix again
        again = req(2, prefix_hashes=hashes, prefix_block_tokens=128)
        return "home" if p.pick(again, reps, 60.0, rng).replica == home else "other"

    assert pick_after_stall({"tail_bound_s": None}) == "home"
    assert pick_after_stall({"tail_bound_s": 5.0, "tail_bound_keep_share": None}) == "other"


def test_keep_share_keeps_a_late_replica_that_holds_the_prompt() -> None:
    tb = TailBound(TailBoundParams(tail_bound_s=5.0, tail_bound_keep_share=0.5))
    reps = fleet(5)
    tb.expect(req(1), "r0", 0.0)
    tb.expect(req(2), "r1", 0.0)
    held = {"r0": 4, "r1": 1}  # blocks of 128 tokens expected cached: r0 512 of 1000 tokens, r1 128

    def depths(request: RequestInfo) -> tuple[dict[str, int], frozenset[str]]:
        return held, frozenset({"r0"})

    ask = req(3, prefix_block_tokens=128)
    assert names(tb.keep(reps, 60.0)) == ["r2", "r3", "r4"]  # r0 and r1 60 s late, the median 0
    assert names(tb.keep(reps, 60.0, ask, depths)) == ["r0", "r2", "r3", "r4"]  # r0 holds half of it
    with pytest.raises(ValueError):
        TailBoundParams(tail_bound_s=5.0, tail_bound_keep_share=0.0)


def test_fleetgate_keep_share_stays_with_a_session_holder() -> None:
    reps = fleet(4)
    rng = random.Random(0)
    hashes = tuple(range(1, 9))  # 8 blocks of 128 tokens: the whole 1000-token prompt
    p = build_policy("fleetgate", {"tail_bound_s": 5.0, "tail_bound_keep_share": 0.5}, profile=PROFILE)
    first = req(1, prefix_hashes=hashes, prefix_block_tokens=128)
    home = p.pick(first, reps, 0.0, rng).replica
    p.on_dispatch(first, home, 0.0)
    again = req(2, prefix_hashes=hashes, prefix_block_tokens=128)
    assert p.pick(again, reps, 60.0, rng).replica == home


def _reference_keep(tb: TailBound, reps: list[ReplicaSnapshot], now: float) -> list[str]:
    """The bound written out from each candidate's overdue (no shortcut)."""
    late = [tb.overdue_s(r.name, now) for r in reps]
    if not late or max(late) <= tb.slack_s:
        return names(reps)
    limit = tb.factor * median(late) + tb.slack_s
    return [r.name for r, x in zip(reps, late, strict=True) if x <= limit]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_keep_matches_the_rule_written_out(seed: int) -> None:
    """``keep``'s shortcut (the least unanswered expected time over all replicas) never changes its answer:
    random expectations, retries, first tokens and completions, asked at random times and candidate sets."""
    rnd = random.Random(seed)
    tb = TailBound(TailBoundParams(tail_bound_s=2.0))
    reps = fleet(7)
    open_: list[tuple[RequestInfo, str]] = []
    for i in range(3000):
        now = i * 0.05
        u = rnd.random()
        if u < 0.4:
            r = req(rnd.randrange(i + 1)) if rnd.random() < 0.05 else req(i)  # (a retry reuses an id)
            name = rnd.choice(reps).name
            tb.expect(r, name, now + rnd.choice((-1.0, 0.0, 0.5, 3.0)))
            open_.append((r, name))
        elif u < 0.6 and open_:
            r, name = open_.pop(rnd.randrange(len(open_)))
            tb.on_first_token(r, name, now)
        elif u < 0.7 and open_:
            r, name = open_.pop(rnd.randrange(len(open_)))
            tb.on_complete(r, name, now, 1.0, True)
        cands = [r for r in reps if rnd.random() < 0.8] or reps
        assert names(tb.keep(cands, now)) == _reference_keep(tb, cands, now), i
