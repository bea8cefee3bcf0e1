"""Baseline autoscalers for the simulator: static peak provisioning and a KPA-style concurrency target.

Both implement the same :class:`~fleetgate.core.autoscale.Autoscaler` interface as fleetgate's policy, so the
simulator drives all three with identical contexts and cold starts. Pure: no clocks, no I/O.

The KPA model follows Knative Serving's documented defaults: a per-replica concurrency target
(``container-concurrency-target-default`` 100, used at ``container-concurrency-target-percentage`` 70 %),
a 60 s stable window, a panic window of 10 % of it (6 s), panic when the panic window wants >= 2x the ready
replicas, never scaling down while panicking, scale-up at most 1000x and scale-down at most by half per
decision (``max-scale-up-rate`` / ``max-scale-down-rate``), and no scale-down delay. For LLM serving the
concurrency target has to be set per model (``target_concurrency``): requests of very different sizes count
the same, which is exactly the weakness model units address.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetgate.core.autoscale import (
    AUTOSCALER_NAMES,
    AutoscaleContext,
    AutoscalePolicy,
    Autoscaler,
    FleetgateAutoscaler,
    apply_bounds,
    delayed_floor,
    limit_scale_down,
    limit_scale_up,
    replicas_for,
    window_mean,
)

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class StaticAutoscaler:
    """Always the same count: provisioning for the peak (the cost ceiling every autoscaler is compared to)."""

    replicas: int
    name: str = "static"

    def decide(self, ctx: AutoscaleContext) -> tuple[int, None]:
        return max(0, self.replicas), None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> StaticAutoscaler:
        """``replicas``, or ``peak_mu_per_min`` with ``capacity_mu_per_min`` and ``target_utilisation``."""
        params = dict(params)
        unknown = sorted(
            set(params) - {"replicas", "peak_mu_per_min", "capacity_mu_per_min", "target_utilisation"}
        )
        if unknown:
            raise ValueError(f"unknown static autoscaler parameter(s): {', '.join(unknown)}")
        if "replicas" in params:
            return cls(replicas=int(params["replicas"]))
        if "peak_mu_per_min" not in params:
            raise ValueError("static autoscaler needs `replicas` or `peak_mu_per_min`")
        cap = float(params.get("capacity_mu_per_min", 100.0))
        target = float(params.get("target_utilisation", 0.7))
        return cls(replicas=max(1, replicas_for(float(params["peak_mu_per_min"]), cap, target)))


@dataclass(frozen=True, slots=True)
class KpaState:
    """Knative KPA memory: concurrency samples, panic bookkeeping and recent desires (for the delay)."""

    samples: tuple[tuple[float, float], ...] = ()
    panic_since_s: float | None = None
    max_panic_pods: int = 0
    desired_history: tuple[tuple[float, int], ...] = ()
    desired: int = 0
    panic: bool = False
    reason: str = "init"


@dataclass(frozen=True, slots=True)
class KpaAutoscaler:
    """Knative Pod Autoscaler, concurrency mode: target in-flight requests per replica."""

    target_concurrency: float = 100.0
    target_utilisation: float = 0.7
    stable_window_s: float = 60.0
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    scale_down_delay_s: float = 0.0
    min_replicas: int = 1
    max_replicas: int = 1024
    name: str = field(default="kpa")

    def __post_init__(self) -> None:
        if self.target_concurrency <= 0 or not 0 < self.target_utilisation <= 1:
            raise ValueError("target_concurrency must be > 0 and target_utilisation in (0, 1]")
        if not 0 < self.panic_window_s <= self.stable_window_s:
            raise ValueError("need 0 < panic_window_s <= stable_window_s")
        if self.min_replicas < 0 or self.max_replicas < max(1, self.min_replicas):
            raise ValueError("need 0 <= min_replicas <= max_replicas and max_replicas >= 1")

    def decide(self, ctx: AutoscaleContext) -> tuple[int, KpaState]:
        prev = ctx.policy_state if isinstance(ctx.policy_state, KpaState) else KpaState()
        now = ctx.now_s
        samples = (
            *(s for s in prev.samples if now - s[0] < self.stable_window_s - _EPS),
            (now, max(0.0, float(ctx.inflight_requests))),
        )
        per_pod = self.target_concurrency * self.target_utilisation
        stable = window_mean(samples, now, self.stable_window_s)
        panic_val = window_mean(samples, now, self.panic_window_s)
        want_stable = math.ceil(stable / per_pod - _EPS) if stable > 0 else 0
        want_panic = math.ceil(panic_val / per_pod - _EPS) if panic_val > 0 else 0

        ready = max(1, ctx.ready_replicas)
        max_up = math.ceil(self.max_scale_up_rate * ready)
        max_down = math.floor(ready / self.max_scale_down_rate)
        want_stable = max(min(want_stable, max_up), max_down)
        want_panic = max(min(want_panic, max_up), max_down)

        over = want_panic / ready >= self.panic_threshold
        panic_since = prev.panic_since_s
        max_panic = prev.max_panic_pods
        if panic_since is None and over:
            panic_since = now
        elif panic_since is not None and over:
            panic_since = now  # Knative restarts the panic period on each signal.
        elif panic_since is not None and now - panic_since >= self.stable_window_s:
            panic_since = None
            max_panic = 0

        if panic_since is not None:
            desired = max(want_panic, max_panic)  # never scale down while panicking
            max_panic = desired
            reason = "panic"
        else:
            desired = want_stable
            reason = "stable"
        history = (
            *(h for h in prev.desired_history if now - h[0] <= self.scale_down_delay_s),
            (now, desired),
        )
        if self.scale_down_delay_s > 0:
            desired = max(desired, delayed_floor(history, now, self.scale_down_delay_s))
        desired = apply_bounds(desired, self.min_replicas, self.max_replicas)
        state = KpaState(
            samples=samples,
            panic_since_s=panic_since,
            max_panic_pods=max_panic,
            desired_history=history,
            desired=desired,
            panic=panic_since is not None,
            reason=reason,
        )
        return desired, state

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> KpaAutoscaler:
        params = dict(params)
        known = set(cls.__dataclass_fields__) - {"name"}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"unknown kpa autoscaler parameter(s): {', '.join(unknown)}")
        return cls(**params)


def build_autoscaler(name: str, params: Mapping[str, Any] | None = None) -> Autoscaler:
    """``static`` (peak provisioning), ``kpa`` (Knative-style concurrency target) or ``fleetgate`` (MU)."""
    params = dict(params or {})
    if name == "static":
        return StaticAutoscaler.from_params(params)
    if name == "kpa":
        return KpaAutoscaler.from_params(params)
    if name == "fleetgate":
        return FleetgateAutoscaler(policy=AutoscalePolicy.from_params(params))
    raise ValueError(f"unknown autoscaler {name!r}; choose one of {', '.join(AUTOSCALER_NAMES)}")


__all__ = [
    "KpaAutoscaler",
    "KpaState",
    "StaticAutoscaler",
    "build_autoscaler",
    "limit_scale_down",
    "limit_scale_up",
]
