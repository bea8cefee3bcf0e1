"""Properties of every autoscaler: within [min, max]; fleetgate never scales down in panic or cooldown."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgate.core.autoscale import AutoscaleContext, AutoscalePolicy, AutoscaleState, KpaAutoscaler, decide

policies = st.builds(
    lambda lo, span, target, panic, delay, cool, interval, step, fc, floor, frac, beta, season: (
        AutoscalePolicy(
            min_replicas=lo,
            max_replicas=max(1, lo + span),
            target_utilisation=target,
            panic_threshold=panic,
            scale_down_delay_s=delay,
            scale_up_cooldown_s=cool,
            scale_down_interval_s=interval,
            scale_down_max_step=step,
            forecast_horizon_s=fc,
            warm_floor=floor,
            scale_down_max_fraction=frac,
            headroom_beta=beta,
            # A short "period" so that the seasonal memory fills within one example.
            seasonal_period_s=season,
            seasonal_bucket_s=max(1.0, season / 8),
            seasonal_lead_s=season / 4,
        )
    ),
    st.integers(0, 5),
    st.integers(0, 30),
    st.floats(0.1, 1.0),
    st.floats(1.01, 4.0),
    st.floats(0, 600),
    st.floats(0, 600),
    st.floats(0, 120),
    st.integers(1, 5),
    st.floats(0, 300),
    st.integers(0, 4),
    st.floats(0.0, 1.0),
    st.floats(0.0, 3.0),
    st.sampled_from([0.0, 240.0, 1200.0]),
)

steps = st.lists(
    st.tuples(
        st.floats(0.1, 120.0),  # time since last step
        st.floats(0.0, 5000.0),  # settled MU per minute
        st.floats(0.0, 500.0),  # MU in flight
        st.integers(0, 40),  # ready replicas (may disagree with the target: crashes, slow starts)
        st.integers(0, 10),  # starting replicas
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(policies, steps, st.integers(0, 40))
def test_fleetgate_bounds_panic_and_cooldown(pol: AutoscalePolicy, seq: list[Any], start: int) -> None:
    now = 0.0
    state: AutoscaleState | None = None
    current = max(pol.min_replicas, min(pol.max_replicas, start))
    for dt, settled, inflight, ready, starting in seq:
        now += dt
        ctx = AutoscaleContext(
            now_s=now,
            current_replicas=current,
            ready_replicas=min(ready, current),
            starting_replicas=starting,
            settled_mu_per_min=settled,
            inflight_mu=inflight,
            policy=pol,
            policy_state=state,
        )
        desired, new = decide(ctx)
        assert pol.min_replicas <= desired <= pol.max_replicas
        if new.panic:
            assert desired >= current, "scaled down in panic"
        if state is not None and now - state.last_scale_up_s < pol.scale_up_cooldown_s:
            assert desired >= current, "scaled down during the cooldown after a scale-up"
        if desired < current:
            step = max(pol.scale_down_max_step, int(current * pol.scale_down_max_fraction))
            assert current - desired <= step
            assert starting == 0
        state, current = new, desired


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 5),
    st.integers(0, 30),
    st.floats(0.5, 200.0),
    st.lists(
        st.tuples(st.floats(0.1, 60.0), st.floats(0, 2000.0), st.integers(0, 40)), min_size=1, max_size=60
    ),
)
def test_kpa_bounds_and_panic(lo: int, span: int, target: float, seq: list[Any]) -> None:
    kpa = KpaAutoscaler(target_concurrency=target, min_replicas=lo, max_replicas=max(1, lo + span))
    now = 0.0
    state: Any = None
    current = lo
    for dt, conc, ready in seq:
        now += dt
        ctx = AutoscaleContext(
            now_s=now,
            current_replicas=current,
            ready_replicas=ready,
            inflight_requests=conc,
            policy_state=state,
        )
        desired, state = kpa.decide(ctx)
        assert kpa.min_replicas <= desired <= kpa.max_replicas
        current = desired
