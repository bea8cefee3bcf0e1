"""Table-driven tests of fleetgate's MU autoscaler (core.autoscale) and the shared wrappers."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from fleetgate.core.autoscale import (
    AutoscaleContext,
    AutoscalePolicy,
    AutoscaleState,
    apply_bounds,
    decide,
    delayed_floor,
    limit_scale_down,
    limit_scale_up,
    replicas_for,
    seasonal_increment,
    window_slope,
)


@dataclass
class Run:
    """Drives decide() like the live loop: the provider applies each decision at once (instant start)."""

    policy: AutoscalePolicy
    current: int = 1
    state: AutoscaleState | None = None
    starting: int = 0

    def step(
        self, now: float, demand: float, *, ready: int | None = None, starting: int | None = None
    ) -> int:
        ctx = AutoscaleContext(
            now_s=now,
            current_replicas=self.current,
            ready_replicas=self.current if ready is None else ready,
            starting_replicas=self.starting if starting is None else starting,
            capacity_mu_per_min=100.0,
            settled_mu_per_min=demand,
            policy=self.policy,
            policy_state=self.state,
        )
        desired, self.state = decide(ctx)
        self.current = desired
        return desired

    def hold(self, start: float, end: float, demand: float, dt: float = 1.0) -> list[int]:
        out = []
        t = start
        while t < end:
            out.append(self.step(t, demand))
            t += dt
        return out


def test_helpers() -> None:
    assert apply_bounds(0, 1, 5) == 1
    assert apply_bounds(9, 1, 5) == 5
    assert limit_scale_up(2, 100, 10.0) == 20
    assert limit_scale_up(0, 3, 10.0) == 1  # from zero: at least one more
    assert limit_scale_down(10, 2, max_step=1) == 9
    assert limit_scale_down(10, 2, max_rate=2.0) == 5
    assert delayed_floor([(0.0, 5), (50.0, 3)], 100.0, 60.0) == 3
    assert delayed_floor([(0.0, 5), (50.0, 3)], 100.0, 100.0) == 5
    assert replicas_for(70.0, 100.0, 0.7) == 1
    assert replicas_for(70.1, 100.0, 0.7) == 2
    assert replicas_for(0.0, 100.0, 0.7) == 0
    assert window_slope([(0.0, 0.0), (1.0, 2.0), (2.0, 4.0)], 2.0, 10.0) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("demand", "expected"),
    [
        (0.0, 1),  # idle: min_replicas
        (70.0, 1),  # exactly at target on one replica
        (71.0, 2),
        (140.0, 2),
        (350.0, 5),
        (10_000.0, 8),  # max_replicas
    ],
)
def test_steady_demand_converges_to_target(demand: float, expected: int) -> None:
    pol = AutoscalePolicy(min_replicas=1, max_replicas=8, scale_down_delay_s=0, scale_up_cooldown_s=0)
    run = Run(pol)
    run.hold(0, 200, demand)
    assert run.current == expected


def test_burst_panics_and_scales_straight_up() -> None:
    run = Run(AutoscalePolicy(max_replicas=50))
    run.hold(0, 120, 50.0)
    assert run.current == 1
    # A 14x burst: within the 6 s panic window, the fleet jumps to the full need, not one step at a time.
    got = [run.step(120 + i, 700.0) for i in range(6)]
    assert got[-1] == 10
    assert run.state is not None and run.state.panic and run.state.reason in ("panic", "pending", "hold")
    assert max(got) == 10  # never overshoots the need


def test_pending_replicas_are_not_requested_twice() -> None:
    pol = AutoscalePolicy(max_replicas=50)
    run = Run(pol)
    run.hold(0, 60, 50.0)
    # Replicas take minutes to start: only 1 is ready, the rest are starting. The demand estimate grows while
    # the panic window fills (6 s), then the count must stay at the need (10): starting replicas are never
    # requested a second time, however long they take.
    seen = []
    for i in range(0, 120):
        seen.append(run.step(60 + i, 700.0, ready=1, starting=run.current - 1))
    assert seen == sorted(seen)
    assert seen[6:] == [10] * (len(seen) - 6)


def test_scale_down_waits_for_delay_then_steps_down_at_rate() -> None:
    pol = AutoscalePolicy(
        max_replicas=20,
        scale_down_delay_s=300,
        scale_up_cooldown_s=120,
        scale_down_interval_s=30,
        scale_down_max_step=1,
    )
    run = Run(pol)
    run.hold(0, 200, 700.0)
    assert run.current == 10
    seq = run.hold(200, 800, 70.0)
    # Nothing removed before the delay has passed (from the last moment the high desire was seen).
    assert all(d == 10 for d in seq[: 300 - 60])
    # Then at most one replica per 30 s.
    downs = [i for i in range(1, len(seq)) if seq[i] < seq[i - 1]]
    assert downs, seq[-5:]
    assert all(seq[i - 1] - seq[i] == 1 for i in downs)
    assert all(b - a >= 30 for a, b in itertools.pairwise(downs))
    run.hold(800, 1200, 70.0)
    assert run.current == 1


def test_no_scale_down_while_replicas_are_starting() -> None:
    pol = AutoscalePolicy(scale_down_delay_s=0, scale_up_cooldown_s=0, scale_down_interval_s=0)
    run = Run(pol, current=5)
    for t in range(0, 100):
        run.step(t, 0.0, ready=3, starting=2)
    assert run.current == 5
    assert run.state is not None and run.state.reason == "hold_starting"
    run.hold(100, 110, 0.0)
    assert run.current < 5


def test_cooldown_after_scale_up_blocks_scale_down() -> None:
    pol = AutoscalePolicy(scale_down_delay_s=0, scale_up_cooldown_s=120, scale_down_interval_s=0)
    run = Run(pol)
    run.hold(0, 70, 300.0)
    assert run.current == 5
    seq = run.hold(70, 300, 0.0)
    first_down = next(i for i, d in enumerate(seq) if d < 5)
    last_up = run.state.last_scale_up_s if run.state else 0.0
    assert 70 + first_down - last_up >= 120


def test_warm_floor_then_scale_to_min_when_idle() -> None:
    pol = AutoscalePolicy(
        min_replicas=0, warm_floor=1, idle_to_min_s=600, scale_down_delay_s=0, scale_up_cooldown_s=0
    )
    run = Run(pol, current=0)
    assert run.step(0, 0.0) == 0  # never used: stays at zero
    assert run.step(1, 10.0, ready=0) == 1  # first demand starts one replica
    run.hold(2, 500, 0.0)
    assert run.current == 1  # warm floor while recently used
    run.hold(500, 700, 0.0)
    assert run.current == 0


def test_forecast_term_scales_earlier_on_a_ramp() -> None:
    def ramp(pol: AutoscalePolicy) -> list[int]:
        run = Run(pol, current=1)
        return [run.step(t, 5.0 * t) for t in range(0, 240, 5)]

    base = ramp(AutoscalePolicy(max_replicas=100))
    fc = ramp(AutoscalePolicy(max_replicas=100, forecast_horizon_s=180))
    assert all(f >= b for f, b in zip(fc, base, strict=True))
    assert sum(fc) > sum(base)


def test_unhealthy_capacity_shows_in_utilisation() -> None:
    ctx = AutoscaleContext(now_s=0, current_replicas=4, ready_replicas=2, settled_mu_per_min=140.0)
    assert ctx.utilisation == pytest.approx(0.7)
    _, st = decide(ctx)
    assert st.utilisation == pytest.approx(0.7)
    assert st.demand_mu_per_min == pytest.approx(140.0)


def test_inflight_counts_as_demand() -> None:
    ctx = AutoscaleContext(
        now_s=0, current_replicas=1, ready_replicas=1, settled_mu_per_min=70, inflight_mu=70
    )
    d, _ = decide(ctx)
    assert d == 2


@pytest.mark.parametrize(
    "bad",
    [
        {"target_utilisation": 0},
        {"min_replicas": 5, "max_replicas": 2},
        {"panic_window_s": 100, "stable_window_s": 60},
        {"panic_threshold": 1.0},
        {"scale_down_delay_s": -1},
    ],
)
def test_policy_validation(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AutoscalePolicy.from_params(bad)


def test_policy_rejects_unknown_params() -> None:
    with pytest.raises(ValueError, match="unknown"):
        AutoscalePolicy.from_params({"targt": 0.5})


def test_large_fleets_scale_down_by_a_fraction() -> None:
    pol = AutoscalePolicy(
        max_replicas=1000, scale_down_delay_s=0, scale_up_cooldown_s=0, scale_down_interval_s=0,
        scale_down_max_fraction=0.1,
    )  # fmt: skip
    run = Run(pol, current=200)
    assert run.step(0, 0.0, ready=200) == 180  # 10 % of 200, not one at a time


def test_square_root_staffing_gives_small_fleets_more_headroom() -> None:
    assert replicas_for(70.0, 100.0, 0.7, beta=0.0) == 1
    assert replicas_for(70.0, 100.0, 0.7, beta=1.0) == 2  # 0.7 replicas of load: +0.84 headroom
    big = replicas_for(70_000.0, 100.0, 0.7, beta=1.0)
    assert big == 1000 + 27  # 700 replicas of load: headroom grows like sqrt, not linearly


def _daily_run(pol: AutoscalePolicy, days: int, step_at: float, low: float, high: float) -> list[int]:
    """`days` days of demand `low`, rising to `high` at `step_at` seconds into each day for one hour;
    returns the replica count asked for at `step_at - 60` on each day."""
    run = Run(pol)
    out = []
    for d in range(days):
        for t in range(0, 86400, 10):
            now = d * 86400.0 + t
            demand = high if step_at <= t < step_at + 3600 else low
            run.step(now, demand)
            if t == step_at - 60:
                out.append(run.current)
    return out


def test_seasonal_forecast_prewarms_before_a_recurring_step() -> None:
    pol = AutoscalePolicy(max_replicas=100, seasonal_period_s=86400.0)
    # 70 MU/min -> 1 replica; 2,100 MU/min -> 30 replicas at the 0.7 target.
    counts = _daily_run(pol, 3, step_at=36000.0, low=70.0, high=2100.0)
    assert counts[0] == 1  # no history on the first day: purely reactive
    assert counts[1] == 30  # the rise seen yesterday, one cold start ahead (lead 240 s)
    assert counts[2] == 30
    off = _daily_run(
        AutoscalePolicy(max_replicas=100, seasonal_period_s=0.0), 3, step_at=36000.0, low=70.0, high=2100.0
    )
    assert off == [1, 1, 1]


def test_seasonal_forecast_needs_the_rise_in_every_remembered_period() -> None:
    pol = AutoscalePolicy(
        seasonal_period_s=100.0, seasonal_bucket_s=10.0, seasonal_lead_s=15.0, seasonal_periods=2
    )
    # (bucket, median demand): period 1 (buckets 0-9) rose at bucket 5, period 2 (10-19) did not.
    season = tuple((b, 500.0 if b == 5 else 100.0) for b in range(20))
    # now = bucket 24, lead reaches bucket 25: +400 two periods ago (4 -> 5), flat in the last (14 -> 15)
    assert seasonal_increment(season, pol, 240.0) == 0.0
    one = AutoscalePolicy(
        seasonal_period_s=100.0, seasonal_bucket_s=10.0, seasonal_lead_s=15.0, seasonal_periods=1
    )
    assert seasonal_increment(season, one, 135.0) == 400.0  # bucket 13 -> 14-15 = last period's 4-5
    assert seasonal_increment(season, one, 165.0) == 0.0  # a fall is never forecast
