"""Autoscaling on model-unit (MU) utilisation: a pure ``decide(context) -> (desired_replicas, state)``.

The calling convention (context in, count and state out) is ``base.py``'s; nothing here reads a clock.

Why MU: request counts, CPU and memory do not show GPU load (a burst of long-context requests looks like a
burst of short ones); MU do. Demand is ``settled MU of the last minute + growth of the MU in flight over the
window`` (never below the MU in flight): arrivals = completions + change in flight, so that is the arrival
volume of the last minute, and it measures offered load even while the fleet is saturated (it does not stall
at capacity the way settled throughput alone would). See :func:`arrival_demand`.

The algorithm, Knative-like with changes for LLM serving:

* **Stable window** (60 s): the mean demand sets the baseline ``ceil(demand / (capacity * target))``;
  an optional **trend term** projects the window mean forward by its own lag plus ``forecast_horizon_s``
  (set it to the cold start) when demand is rising; a falling trend is ignored (no scale-down on a forecast).
* **Panic window** (6 s): when short-term demand (also the arrival rate since the last sample, see
  :func:`recent_demand`) needs ``panic_threshold`` x the replicas we already have or are starting, scale
  straight to the panic figure and hold (no scale-down) until the stable window has passed without another
  panic signal.
* **Daily pattern** (on): a rise in demand seen at this time of day yesterday, within the next
  ``seasonal_lead_s``, is added ahead of time, so recurring jumps find their replicas warm
  (:func:`seasonal_increment`).
* **Pending awareness**: the target is an absolute count computed from demand, compared with
  ``ready + starting``; replicas still starting count as already asked for, so a burst does not re-request
  them on every tick, and nothing is scaled down while any replica is still starting.
* **Scale-down** is delayed (the highest raw desire of the last ``scale_down_delay_s`` is the floor), blocked
  for ``scale_up_cooldown_s`` after a scale-up, and rate-limited (``scale_down_max_step`` replicas at most per
  ``scale_down_interval_s``). Cold starts are minutes for real engines: removing capacity too early is the
  expensive mistake.
* **Warm floor**: ``warm_floor`` replicas stay while any demand was seen in the last ``idle_to_min_s``; only a
  really idle deployment drops to ``min_replicas`` (which may be 0).

Bounds and the scale-down delay are the shared rails (``rails.Rails``), here interleaved with the policy's
own holds; the demand terms are this module's.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import Field, model_validator

from fleetgate.core.autoscale.base import (
    EPS,
    AutoscaleContext,
    AutoscaleSummary,
    context_summary,
    replicas_for,
    window_mean,
    window_slope,
)
from fleetgate.core.autoscale.rails import Rails, in_cooldown, limit_scale_down, limit_scale_up
from fleetgate.core.plugins import PluginParams

_EPS = EPS


class AutoscalePolicy(PluginParams):
    """fleetgate's MU-demand autoscaler (its Params); defaults documented in docs/autoscaling.md."""

    target_utilisation: float = Field(default=0.7, description="Target MU use of each replica, in (0, 1].")
    min_replicas: int = Field(default=1, description="Fewest replicas (0 allowed: scale to zero).")
    max_replicas: int = Field(default=1024, description="Most replicas.")
    warm_floor: int = Field(default=1, description="Replicas kept while demand was seen recently.")
    idle_to_min_s: float = Field(default=1800.0, description="Quiet time before dropping below warm_floor.")
    stable_window_s: float = Field(default=60.0, description="Window of the mean demand (s).")
    panic_window_s: float = Field(default=6.0, description="Window of the short-term demand (s).")
    panic_threshold: float = Field(default=1.4, description="Panic when short-term needs this x replicas.")
    max_scale_up_rate: float = Field(default=100.0, description="At most this x the replicas per decision.")
    scale_down_delay_s: float = Field(
        default=300.0, description="Scale down only to the highest desire of this long (s)."
    )
    scale_up_cooldown_s: float = Field(default=120.0, description="No scale-down this long after a scale-up.")
    scale_down_interval_s: float = Field(default=30.0, description="Time between two scale-downs (s).")
    scale_down_max_step: int = Field(default=1, description="Replicas removed per scale-down at least.")
    scale_down_max_fraction: float = Field(
        default=0.1, description="Or this fraction of the replicas, when larger."
    )
    forecast_horizon_s: float = Field(default=0.0, description="Trend projection ahead (s; 0: off).")
    headroom_beta: float = Field(default=0.0, description="Square-root staffing headroom (0: off).")
    seasonal_period_s: float = Field(default=86400.0, description="Period of the daily pattern (0: off).")
    seasonal_bucket_s: float = Field(default=600.0, description="Bucket of the daily pattern (s).")
    seasonal_periods: int = Field(default=1, description="Past periods a rise must have recurred in.")
    seasonal_lead_s: float = Field(default=240.0, description="How far ahead recurring rises pre-warm (s).")
    inflight_term: Literal["change", "level"] = Field(
        default="change", description="Demand's in-flight term: growth over the window, or the level."
    )
    panic_on_recent: bool = Field(default=True, description="Panic on the arrival rate of the last seconds.")

    @model_validator(mode="after")
    def _check(self) -> AutoscalePolicy:
        if not 0.0 < self.target_utilisation <= 1.0:
            raise ValueError("target_utilisation must be in (0, 1]")
        if self.min_replicas < 0 or self.max_replicas < max(self.min_replicas, 1):
            raise ValueError("need 0 <= min_replicas <= max_replicas and max_replicas >= 1")
        if self.warm_floor < 0:
            raise ValueError("warm_floor must be >= 0")
        if (
            self.stable_window_s <= 0
            or self.panic_window_s <= 0
            or self.panic_window_s > self.stable_window_s
        ):
            raise ValueError("need 0 < panic_window_s <= stable_window_s")
        if self.panic_threshold <= 1.0:
            raise ValueError("panic_threshold must be > 1")
        if self.max_scale_up_rate < 1.0:
            raise ValueError("max_scale_up_rate must be >= 1")
        if self.scale_down_max_step < 1:
            raise ValueError("scale_down_max_step must be >= 1")
        if not 0.0 <= self.scale_down_max_fraction <= 1.0:
            raise ValueError("scale_down_max_fraction must be in [0, 1]")
        for name, value in (
            ("scale_down_delay_s", self.scale_down_delay_s),
            ("scale_up_cooldown_s", self.scale_up_cooldown_s),
            ("scale_down_interval_s", self.scale_down_interval_s),
            ("forecast_horizon_s", self.forecast_horizon_s),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.idle_to_min_s < 0:
            raise ValueError("idle_to_min_s must be >= 0")
        if self.headroom_beta < 0:
            raise ValueError("headroom_beta must be >= 0")
        if self.seasonal_period_s < 0 or self.seasonal_lead_s < 0:
            raise ValueError("seasonal_period_s and seasonal_lead_s must be >= 0")
        if self.seasonal_period_s > 0 and not 0 < self.seasonal_bucket_s <= self.seasonal_period_s:
            raise ValueError("need 0 < seasonal_bucket_s <= seasonal_period_s")
        if self.seasonal_periods < 1:
            raise ValueError("seasonal_periods must be >= 1")
        return self

    @property
    def rails(self) -> Rails:
        """The shared rails with this policy's bounds and scale-down delay."""
        return Rails(self.min_replicas, self.max_replicas, self.scale_down_delay_s)

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None) -> AutoscalePolicy:
        """Build from a plain mapping (config or CLI); unknown keys are an error, not silently ignored."""
        params = dict(params or {})
        unknown = sorted(set(params) - set(cls.model_fields))
        if unknown:
            raise ValueError(f"unknown autoscaler parameter(s): {', '.join(unknown)}")
        return cls.model_validate(params)


_DEFAULT_POLICY = AutoscalePolicy()


@dataclass(frozen=True, slots=True)
class AutoscaleState:
    """What :func:`decide` remembers between calls (opaque to callers, but readable for logs and metrics)."""

    samples: tuple[tuple[float, float], ...] = ()
    desired_history: tuple[tuple[float, int], ...] = ()
    panic_until_s: float = -math.inf
    last_scale_up_s: float = -math.inf
    last_scale_down_s: float = -math.inf
    last_demand_s: float = -math.inf
    desired: int = 0
    panic: bool = False
    utilisation: float = 0.0
    demand_mu_per_min: float = 0.0
    reason: str = "init"
    #: Seasonal memory: demand samples of the current bucket, and (bucket index, median demand) of the last
    #: ``seasonal_periods`` periods, oldest first.
    bucket: int | None = None
    bucket_samples: tuple[float, ...] = ()
    season: tuple[tuple[int, float], ...] = ()
    seasonal_mu_per_min: float = 0.0
    #: (time, MU in flight) of the stable window, for the ``change`` in-flight term.
    inflight_samples: tuple[tuple[float, float], ...] = ()


def arrival_demand(
    ctx: AutoscaleContext, inflight_history: Sequence[tuple[float, float]], p: AutoscalePolicy
) -> float:
    """Demand in MU per minute: settled MU of the last minute plus the in-flight term.

    ``level`` adds the MU in flight now. That counts the requests of the last ``L`` seconds (``L`` = the
    end-to-end latency) twice over a minute's window — they are in flight now and their predecessors settled
    within the minute — so on steady traffic it reads ``(60 + L) / 60`` of the arrival rate (~15 % high at
    L ~ 10 s, more with the p90 output budget of the estimates).
    ``change`` (default) adds the growth of the in-flight MU over the stable window instead, as a per-minute
    rate: arrivals = completions + change in flight, so this is the arrival volume of the last minute. It
    still sees unmet demand while the fleet is saturated (settled MU stalls at capacity, in-flight MU grows
    by exactly the shortfall), and a falling in-flight total (a backlog draining) is not subtracted. It is
    never below the MU in flight themselves: work that has not settled within the minute (long requests, a
    stalled batch) still needs replicas even when nothing new arrives.
    """
    settled = max(0.0, ctx.settled_mu_per_min)
    inflight = max(0.0, ctx.inflight_mu)
    if p.inflight_term == "level":
        return settled + inflight
    old = [s for s in inflight_history if ctx.now_s - s[0] < p.stable_window_s - _EPS]
    if not old:
        return settled + inflight  # no history yet: the whole in-flight amount is new
    t0, i0 = old[0]
    span = ctx.now_s - t0
    growth = max(0.0, inflight - i0) * (max(1.0, 60.0 / span) if span > _EPS else 1.0)
    return max(settled + growth, inflight)


def recent_demand(
    ctx: AutoscaleContext, inflight_history: Sequence[tuple[float, float]], p: AutoscalePolicy
) -> float:
    """Arrival rate of the last few seconds (MU per minute), for the panic window.

    The stable demand is a minute's arrival volume, so a jump needs most of a minute to show in it. The
    in-flight total moves at once: right after a jump, completions still run at the old rate (they lag by the
    request latency), so settled MU per minute plus the in-flight growth since the newest sample at least
    ``panic_window_s`` old, scaled to a minute, is the new arrival rate (less one average request in flight,
    so a lone arrival on a quiet deployment is not read as a surge). 0 (not used) with ``panic_on_recent``
    off or in ``level`` mode.
    """
    if p.inflight_term != "change" or not p.panic_on_recent:
        return 0.0
    now = ctx.now_s
    old = [s for s in inflight_history if p.panic_window_s - _EPS <= now - s[0] < p.stable_window_s - _EPS]
    if not old:
        return 0.0
    t0, i0 = old[-1]
    inflight = max(0.0, ctx.inflight_mu)
    # One arrival is not a trend: discount one average request, so that a single request landing on a
    # quiet, low-rate deployment does not read as a minute's worth of such requests and panic.
    one_request = inflight / ctx.inflight_requests if ctx.inflight_requests >= 1 else 0.0
    growth = max(0.0, inflight - i0 - one_request) * 60.0 / (now - t0)
    return max(0.0, ctx.settled_mu_per_min) + growth


def _median(vals: Sequence[float]) -> float:
    v = sorted(vals)
    n = len(v)
    return 0.0 if n == 0 else (v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2]))


def season_update(
    prev: AutoscaleState, p: AutoscalePolicy, now: float, demand: float
) -> tuple[int | None, tuple[float, ...], tuple[tuple[int, float], ...]]:
    """Add one demand sample to the seasonal memory; a finished bucket is stored as its median.

    The median (not the mean) keeps the few minutes of an overload, when in-flight work inflates the demand
    reading, out of the stored level.
    """
    if p.seasonal_period_s <= 0:
        return None, (), ()
    b = math.floor(now / p.seasonal_bucket_s)
    season = prev.season
    if prev.bucket is None or b == prev.bucket:
        return b, (*prev.bucket_samples, demand), season
    keep = math.ceil(p.seasonal_periods * p.seasonal_period_s / p.seasonal_bucket_s)
    if prev.bucket_samples:
        season = (*season, (prev.bucket, _median(prev.bucket_samples)))
    oldest = b - keep
    if season and season[0][0] < oldest:
        season = season[bisect_left(season, oldest, key=lambda x: x[0]) :]
    return b, (demand,), season


def seasonal_increment(season: Sequence[tuple[int, float]], p: AutoscalePolicy, now: float) -> float:
    """The rise in demand (MU/min) the past periods saw between now and ``now + seasonal_lead_s``.

    For each of the last ``seasonal_periods`` periods: the largest increase from the bucket of "now" to a
    bucket within the lead time, at the same phase of that period. The minimum over the periods is used (a
    rise must have recurred in every one of them), and only a rise: the forecast never lowers the count.
    Additive, not a ratio, so a day that runs 10 % lower than the last does not inherit its level.
    """
    if p.seasonal_period_s <= 0 or not season:
        return 0.0
    idx = [x[0] for x in season]
    per = p.seasonal_period_s / p.seasonal_bucket_s
    b_now = math.floor(now / p.seasonal_bucket_s)
    b_end = math.floor((now + p.seasonal_lead_s) / p.seasonal_bucket_s)
    if b_end <= b_now:
        return 0.0

    def at(b: int) -> float | None:
        j = bisect_left(idx, b)
        return season[j][1] if j < len(idx) and idx[j] == b else None

    rises: list[float] = []
    for k in range(1, p.seasonal_periods + 1):
        shift = round(k * per)
        base = at(b_now - shift)
        if base is None:
            continue
        ahead = [v for b in range(b_now + 1, b_end + 1) if (v := at(b - shift)) is not None]
        if not ahead:
            continue
        rises.append(max(ahead) - base)
    if not rises:
        return 0.0
    return max(0.0, min(rises))


# ---------------------------------------------------------------------------------------------------------
# fleetgate's policy.


def decide(ctx: AutoscaleContext) -> tuple[int, AutoscaleState]:
    """One decision: the replica count to run now and the state to pass back next time."""
    p = ctx.policy if ctx.policy is not None else _DEFAULT_POLICY
    rails = p.rails
    prev: AutoscaleState = (
        ctx.policy_state if isinstance(ctx.policy_state, AutoscaleState) else AutoscaleState()
    )
    now = ctx.now_s
    current = max(0, ctx.current_replicas)
    pending_total = max(current, ctx.ready_replicas + max(0, ctx.starting_replicas))
    cap = ctx.capacity_mu_per_min
    inflight = max(0.0, ctx.inflight_mu)
    inflight_samples = (
        *(s for s in prev.inflight_samples if now - s[0] < p.stable_window_s - _EPS),
        (now, inflight),
    )
    demand = arrival_demand(ctx, prev.inflight_samples, p)

    horizon = max(p.stable_window_s, p.scale_down_delay_s)
    samples = (*(s for s in prev.samples if now - s[0] < p.stable_window_s - _EPS), (now, demand))
    last_demand_s = now if demand > 0 else prev.last_demand_s

    stable = window_mean(samples, now, p.stable_window_s)
    if p.forecast_horizon_s > 0:
        slope = window_slope(samples, now, p.stable_window_s)
        if slope > 0:
            # The window mean lags the present by half a window; project it to now + horizon.
            stable = max(stable, stable + slope * (p.stable_window_s / 2 + p.forecast_horizon_s))
    bucket, bucket_samples, season = season_update(prev, p, now, demand)
    seasonal = seasonal_increment(season, p, now)
    if seasonal > 0:
        # Pre-warm for a rise that recurred at this time of the period: start the replicas a cold start
        # before the demand arrives instead of reacting to it.
        stable = max(stable, window_mean(samples, now, p.stable_window_s) + seasonal)
    short = max(window_mean(samples, now, p.panic_window_s), recent_demand(ctx, prev.inflight_samples, p))
    want_stable = replicas_for(stable, cap, p.target_utilisation, p.headroom_beta)
    want_panic = replicas_for(short, cap, p.target_utilisation, p.headroom_beta)

    panic_signal = want_panic >= p.panic_threshold * max(pending_total, 1) and want_panic > pending_total
    panic_until = now + p.stable_window_s if panic_signal else prev.panic_until_s
    panic = now < panic_until

    floor = p.min_replicas
    if now - last_demand_s <= p.idle_to_min_s:
        floor = max(floor, p.warm_floor)
    raw = max(want_stable, want_panic if panic else 0)
    raw = rails.bound(max(raw, floor))
    history = rails.remember(prev.desired_history, now, raw, keep_s=horizon)

    reason = "hold"
    desired = current
    last_up, last_down = prev.last_scale_up_s, prev.last_scale_down_s
    if raw > pending_total:
        # Scale up, counting replicas still starting as already provided.
        desired = limit_scale_up(pending_total, raw, p.max_scale_up_rate)
        reason = "panic" if panic else "scale_up"
    elif raw > current:
        # The replicas we need are already starting: ask for exactly those, nothing more.
        desired = min(raw, pending_total)
        reason = "pending"
    elif raw < current:
        delayed = rails.bound(rails.delay_floor(history, now))
        if panic:
            reason = "hold_panic"
        elif ctx.starting_replicas > 0:
            reason = "hold_starting"
        elif in_cooldown(now, last_up, p.scale_up_cooldown_s):
            reason = "hold_cooldown"
        elif delayed >= current:
            reason = "hold_delay"
        elif in_cooldown(now, max(last_down, last_up), p.scale_down_interval_s):
            reason = "hold_rate"
        else:
            step = max(p.scale_down_max_step, math.floor(current * p.scale_down_max_fraction))
            desired = limit_scale_down(current, max(raw, delayed), max_step=step)
            reason = "scale_down"
    desired = rails.bound(desired)
    if desired > current:
        last_up = now
    elif desired < current:
        last_down = now

    ready_cap = ctx.ready_replicas * cap
    util = demand / ready_cap if ready_cap > 0 else (math.inf if demand > 0 else 0.0)
    state = AutoscaleState(
        samples=samples,
        desired_history=history,
        panic_until_s=panic_until,
        last_scale_up_s=last_up,
        last_scale_down_s=last_down,
        last_demand_s=last_demand_s,
        desired=desired,
        panic=panic,
        utilisation=util,
        demand_mu_per_min=demand,
        reason=reason,
        bucket=bucket,
        bucket_samples=bucket_samples,
        season=season,
        seasonal_mu_per_min=seasonal,
        inflight_samples=inflight_samples,
    )
    return desired, state


@dataclass(frozen=True, slots=True)
class FleetgateAutoscaler:
    """:func:`decide` with a fixed policy, behind the common :class:`Autoscaler` interface."""

    policy: AutoscalePolicy = _DEFAULT_POLICY
    name: str = "fleetgate"

    def decide(self, ctx: AutoscaleContext) -> tuple[int, AutoscaleState]:
        return decide(replace(ctx, policy=self.policy))

    def summary(self, ctx: AutoscaleContext, state: Any) -> AutoscaleSummary:
        """The demand it scaled on (its in-flight term), not the context's plain sum."""
        if isinstance(state, AutoscaleState):
            return AutoscaleSummary(state.demand_mu_per_min, state.utilisation, state.panic, state.reason)
        return context_summary(ctx)
