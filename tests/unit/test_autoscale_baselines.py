"""The simulator's baselines (static peak, Knative-KPA-style) behind the common autoscaler interface."""

from __future__ import annotations

import pytest

from fleetgate.core.autoscale import (
    AUTOSCALER_NAMES,
    AutoscaleContext,
    FleetgateAutoscaler,
    KpaAutoscaler,
    KpaState,
    StaticAutoscaler,
    build_autoscaler,
)


def _ctx(now: float, current: int, conc: float, state: object = None) -> AutoscaleContext:
    return AutoscaleContext(
        now_s=now,
        current_replicas=current,
        ready_replicas=current,
        inflight_requests=conc,
        policy_state=state,
    )


def test_build_by_name() -> None:
    assert AUTOSCALER_NAMES == ("static", "kpa", "fleetgate")
    assert isinstance(build_autoscaler("static", {"replicas": 4}), StaticAutoscaler)
    assert isinstance(build_autoscaler("kpa", {"target_concurrency": 8}), KpaAutoscaler)
    fg = build_autoscaler("fleetgate", {"target_utilisation": 0.6})
    assert isinstance(fg, FleetgateAutoscaler) and fg.policy.target_utilisation == 0.6
    for name in AUTOSCALER_NAMES:
        a = build_autoscaler(name, {"replicas": 2} if name == "static" else None)
        assert a.name == name
        d, _ = a.decide(_ctx(0.0, 1, 0.0))
        assert d >= 0
    with pytest.raises(ValueError, match="unknown autoscaler"):
        build_autoscaler("hpa")
    with pytest.raises(ValueError, match="unknown"):
        build_autoscaler("kpa", {"target": 3})


def test_static_from_peak() -> None:
    s = build_autoscaler(
        "static", {"peak_mu_per_min": 1000, "capacity_mu_per_min": 100, "target_utilisation": 0.7}
    )
    assert s.decide(_ctx(0, 1, 0))[0] == 15
    assert s.decide(_ctx(1e6, 99, 1e6))[0] == 15
    with pytest.raises(ValueError):
        build_autoscaler("static", {})


def test_kpa_stable_follows_concurrency_target() -> None:
    kpa = KpaAutoscaler(target_concurrency=10, target_utilisation=0.7, max_replicas=100)
    state: object = None
    cur = 1
    for t in range(0, 120):
        cur, state = kpa.decide(_ctx(t, cur, 14.0, state))
    assert cur == 2  # 14 in flight / (10 * 0.7) per replica
    assert isinstance(state, KpaState) and not state.panic


def test_kpa_panics_at_twice_ready_and_never_scales_down_in_panic() -> None:
    kpa = KpaAutoscaler(target_concurrency=10, target_utilisation=1.0, max_replicas=100)
    state: object = None
    cur = 1
    for t in range(0, 60):
        cur, state = kpa.decide(_ctx(t, cur, 5.0, state))
    assert cur == 1
    cur, state = kpa.decide(_ctx(60, cur, 200.0, state))
    assert isinstance(state, KpaState) and state.panic
    panic_peak = cur
    assert panic_peak > 1
    seq = []
    for t in range(61, 100):
        cur, state = kpa.decide(_ctx(t, cur, 5.0, state))
        seq.append(cur)
    # Panic holds for a stable window after the last signal, never going below the panic maximum.
    assert min(seq[:50]) >= panic_peak
    for t in range(100, 200):
        cur, state = kpa.decide(_ctx(t, cur, 5.0, state))
    assert cur == 1 and isinstance(state, KpaState) and not state.panic


def test_kpa_scale_down_at_most_half_per_step() -> None:
    kpa = KpaAutoscaler(target_concurrency=10, target_utilisation=1.0, max_replicas=100)
    d, _ = kpa.decide(_ctx(0, 16, 0.0, KpaState()))
    assert d == 8
