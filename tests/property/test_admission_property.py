"""Property tests of the admission core's bucket math and decisions (hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
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
