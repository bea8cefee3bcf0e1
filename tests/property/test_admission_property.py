"""Property tests of the admission core's bucket math and decisions (hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fleetgate.core.admission import (
    AdmissionSettings,
    BucketParams,
    BucketState,
    CapacityView,
    Charge,
    LocalAdmission,
    MemoryBuckets,
    TenantLimits,
    adjust,
    charge,
    drain,
    take_all,
)
from fleetgate.core.types import Priority, RequestInfo

rates = st.floats(min_value=0.01, max_value=1000.0)
bursts = st.floats(min_value=0.0, max_value=1000.0)
costs = st.floats(min_value=0.0, max_value=500.0)
gaps = st.floats(min_value=0.0, max_value=30.0)
ops = st.lists(
    st.tuples(st.sampled_from(["take", "settle"]), costs, st.floats(min_value=-500.0, max_value=500.0), gaps),
    min_size=1,
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(rate=rates, burst=bursts, seq=ops)
def test_no_bucket_goes_negative_or_above_its_burst(rate: float, burst: float, seq: list) -> None:
    p = BucketParams(rate, burst)
    b = MemoryBuckets()
    t = 0.0
    for op, cost, delta, gap in seq:
        t += gap
        if op == "take":
            out = b.take([Charge("k", p, cost)], t)
            assert out.allowed == (out.retry_after_s <= 0)
            assert (out.retry_after_s > 0) == (not out.allowed)
        else:
            b.adjust([Charge("k", p, delta)], t)
        s = b.states.get("k", BucketState(0.0, t))
        assert s.level >= 0.0
        assert 0.0 <= s.tokens(p) <= burst
        assert s.debt(p) >= 0.0


@settings(max_examples=300, deadline=None)
@given(rate=rates, burst=bursts, level=st.floats(0.0, 2000.0), cost=costs, now=st.floats(0.0, 100.0))
def test_retry_after_is_positive_exactly_when_denied_and_is_accurate(
    rate: float, burst: float, level: float, cost: float, now: float
) -> None:
    p = BucketParams(rate, burst)
    states = {"k": BucketState(level, 0.0)}
    out = take_all(states, [Charge("k", p, cost)], now)
    assert (out.retry_after_s > 0) == (not out.allowed)
    if not out.allowed:
        later = take_all(states, [Charge("k", p, cost)], now + out.retry_after_s * (1 + 1e-9) + 1e-9)
        assert later.allowed  # waiting retry_after is enough
        if out.retry_after_s > 1e-3:
            sooner = take_all(states, [Charge("k", p, cost)], now + out.retry_after_s * 0.5)
            assert not sooner.allowed  # and not much less would do


@settings(max_examples=300, deadline=None)
@given(rate=rates, burst=bursts, level=st.floats(0.0, 1000.0), estimate=costs, actual=costs, gap=gaps)
def test_settle_refunds_exactly(
    rate: float, burst: float, level: float, estimate: float, actual: float, gap: float
) -> None:
    p = BucketParams(rate, burst)
    s0 = BucketState(level, 0.0)
    reserved = charge(s0, p, estimate, 0.0)
    # settled at the same instant: exactly as if the actual cost had been charged up front
    same = adjust(reserved, p, actual - estimate, 0.0)
    assert same.level == pytest.approx(charge(s0, p, actual, 0.0).level, abs=1e-9)
    # settled later: the difference is applied to the drained level, which never drops below 0
    later = adjust(reserved, p, actual - estimate, gap)
    expected = max(0.0, drain(reserved, p, gap).level + actual - estimate)
    assert later.level == pytest.approx(expected, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(
    per_min=st.floats(1.0, 1000.0),
    burst_s=st.floats(0.0, 10.0),
    arrivals=st.lists(st.tuples(st.floats(0.0, 2.0), st.floats(0.01, 50.0)), min_size=1, max_size=200),
)
def test_any_window_admits_at_most_rate_times_window_plus_burst_or_one_request(
    per_min: float, burst_s: float, arrivals: list[tuple[float, float]]
) -> None:
    p = BucketParams.per_minute(per_min, burst_s)
    b = MemoryBuckets()
    t = 0.0
    admitted: list[tuple[float, float]] = []
    for gap, cost in arrivals:
        t += gap
        if b.take([Charge("k", p, cost)], t).allowed:
            admitted.append((t, cost))
    for window in (1.0, 10.0, 60.0):
        for i, (t0, _) in enumerate(admitted):
            inside = [c for t1, c in admitted[i:] if t1 <= t0 + window]
            assert math.fsum(inside) <= p.rate_per_s * window + max(p.burst, max(inside)) + 1e-6


@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(["gold", "free", "silver"]),
            st.floats(0.0, 20.0),
            st.floats(0.0, 1.0),
            st.sampled_from(list(Priority)),
        ),
        min_size=1,
        max_size=80,
    ),
    queue_max=st.integers(0, 5),
    deadline=st.floats(0.0, 3.0),
)
def test_decisions_retry_after_positive_exactly_when_denied(
    events: list[tuple[str, float, float, Priority]], queue_max: int, deadline: float
) -> None:
    tenants = {
        "gold": TenantLimits("gold", reserved_mu_per_min={"m": 60.0}, requests_per_minute=30),
        "silver": TenantLimits("silver", Priority.BATCH, {"m": 30.0}, best_effort_mu_per_min=30.0),
        "free": TenantLimits("free", Priority.BEST_EFFORT, best_effort_mu_per_min=math.inf),
    }
    la = LocalAdmission(
        AdmissionSettings(queue_max=queue_max, default_deadline_s=deadline),
        capacity_of=lambda _m: CapacityView(120.0, 90.0),
    )
    t = 0.0
    seen = 0
    for i, (name, cost, gap, prio) in enumerate(events):
        t += gap
        r = RequestInfo(f"r{i}", "m", tenant=name, cost_mu=cost, priority=prio)
        d = la.submit(tenants[name], r, t)
        decisions = [d] if d is not None else []
        decisions += [dd for _, dd in la.poll(t)]
        for dd in decisions:
            seen += 1
            assert (dd.retry_after_s > 0) == (not dd.allowed)
            assert dd.status == (200 if dd.allowed else dd.status) and dd.status in (200, 429, 503)
    # everything still queued is decided by its deadline
    leftovers = la.poll(t + deadline + 1.0)
    for _, dd in leftovers:
        assert (dd.retry_after_s > 0) == (not dd.allowed)
    assert la.queued == 0
    assert seen + len(leftovers) == len(events)


# ------------------------------------------------------- bounds (issue 22: findings 4 and 8, as classes)
@settings(max_examples=200, deadline=None)
@given(
    prompt=st.integers(-(10**12), 10**12),
    completion=st.integers(-(10**12), 10**12),
    cached=st.integers(-(10**12), 10**12),
    max_tokens=st.none() | st.integers(0, 10**6),
    context=st.none() | st.integers(1, 10**6),
    events=st.none() | st.integers(0, 10**5),
)
def test_bounded_usage_is_never_negative_nor_beyond_what_the_request_could_produce(
    prompt: int, completion: int, cached: int, max_tokens: int | None, context: int | None, events: int | None
) -> None:
    from fleetgate.core.admission.settlement import STREAM_TOKENS_PER_EVENT, bound_usage
    from fleetgate.core.types import Usage

    usage = Usage(prompt, completion, cached)
    r = RequestInfo("r", "m", input_tokens=100, max_output_tokens=max_tokens)
    out = bound_usage(usage, r, context_tokens=context, streamed_events=events).usage
    assert min(out.prompt_tokens, out.completion_tokens, out.cached_tokens, out.image_tokens) >= 0
    limits = [x for x in (max_tokens, context) if x is not None]
    if events:
        limits.append(events * STREAM_TOKENS_PER_EVENT)
    if limits:
        assert out.completion_tokens <= min(limits)
    if context is not None:
        assert out.prompt_tokens <= context
    assert out.cached_tokens <= out.prompt_tokens
    if min(prompt, completion, cached) >= 0 and out == usage:
        assert out is usage  # within bounds: untouched


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(
        st.tuples(
            st.floats(0.0, 1.0),  # gap before it (s)
            st.floats(0.001, 1.0),  # estimate as a share of the bound
            st.floats(0.1, 40.0),  # bound (MU)
            st.floats(0.0, 1.0),  # actual as a share of the bound
            st.floats(0.1, 30.0),  # run time (s)
        ),
        min_size=1,
        max_size=120,
    )
)
@example(requests=[(0.05, 0.01, 40.0, 1.0, 30.0)] * 100)  # the report's game: 1% estimates, long runs
def test_no_estimate_game_overshoots_the_limit_by_more_than_one_request(
    requests: list[tuple[float, float, float, float, float]],
) -> None:
    """Any mix of estimates below the bound, concurrency and run times: the settled MU of what a meter
    admits in any 60 s window stays within its limit plus the largest bound (burst 0)."""
    limit = 60.0
    la = LocalAdmission(AdmissionSettings(default_deadline_s=0.0))
    tenant = TenantLimits("t", reserved_mu_per_min={"m": limit})
    t = 0.0
    running: list[tuple[float, RequestInfo, object, float]] = []
    admitted: list[tuple[float, float]] = []

    def finish(until: float) -> None:
        for item in sorted((x for x in running if x[3] <= until), key=lambda x: x[3]):
            running.remove(item)
            _at, r, d, end = item
            la.settle(tenant, r, d, r.bound_mu * actual_share[r.request_id], end)  # type: ignore[arg-type,operator]

    actual_share: dict[str, float] = {}
    for i, (gap, est, bound, act, run) in enumerate(requests):
        finish(t + gap)
        t += gap
        r = RequestInfo(f"r{i}", "m", tenant="t", cost_mu=bound * est, bound_mu=bound)
        actual_share[r.request_id] = act
        d = la.submit(tenant, r, t)
        if d is not None and d.allowed:
            running.append((t, r, d, t + run))
            admitted.append((t, bound * act))
    finish(math.inf)
    biggest = max(b for _g, _e, b, _a, _r in requests)
    events = sorted(admitted)
    for i, (t0, _c) in enumerate(events):
        inside = math.fsum(c for t1, c in events[i:] if t1 < t0 + 60.0)
        assert inside <= limit + biggest + 1e-6
