"""Knative's Pod Autoscaler (KPA), concurrency mode: the baseline fleetgate's MU autoscaler is compared to.

Implements the same :class:`~fleetgate.core.autoscale.base.Autoscaler` interface as fleetgate's policy, so the
simulator and the live loop drive both with identical contexts and cold starts. Pure: no clocks, no I/O.

The model follows Knative Serving's documented defaults: a per-replica concurrency target
(``container-concurrency-target-default`` 100, used at ``container-concurrency-target-percentage`` 70 %),
a 60 s stable window, a panic window of 10 % of it (6 s), panic when the panic window wants >= 2x the ready
replicas, never scaling down while panicking, scale-up at most 1000x and scale-down at most by half per
decision (``max-scale-up-rate`` / ``max-scale-down-rate``), and no scale-down delay. For LLM serving the
concurrency target has to be set per model (``target_concurrency``): requests of very different sizes count
the same, which is exactly the weakness model units address. Bounds and the optional delay are the shared
rails (``rails.Rails.apply``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from fleetgate.core.autoscale.base import (
    EPS,
    AutoscaleContext,
    AutoscaleSummary,
    context_summary,
    window_mean,
)
from fleetgate.core.autoscale.rails import Rails
from fleetgate.core.plugins import PluginParams

_EPS = EPS


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


class KpaAutoscaler(PluginParams):
    """Knative Pod Autoscaler, concurrency mode: target in-flight requests per replica (its own Params)."""

    target_concurrency: float = Field(default=100.0, gt=0, description="In-flight requests per replica.")
    target_utilisation: float = Field(default=0.7, gt=0, le=1, description="Share of the target used.")
    stable_window_s: float = Field(default=60.0, description="Window of the mean concurrency (s).")
    panic_window_s: float = Field(default=6.0, description="Window of the short-term concurrency (s).")
    panic_threshold: float = Field(default=2.0, description="Panic when short-term wants this x ready.")
    max_scale_up_rate: float = Field(default=1000.0, description="At most this x ready per decision.")
    max_scale_down_rate: float = Field(default=2.0, description="At least ready / this per decision.")
    scale_down_delay_s: float = Field(default=0.0, ge=0, description="Scale-down delay (s; Knative: 0).")
    min_replicas: int = Field(default=1, description="Fewest replicas.")
    max_replicas: int = Field(default=1024, description="Most replicas.")

    @model_validator(mode="after")
    def _check(self) -> KpaAutoscaler:
        if not 0 < self.panic_window_s <= self.stable_window_s:
            raise ValueError("need 0 < panic_window_s <= stable_window_s")
        if self.min_replicas < 0 or self.max_replicas < max(1, self.min_replicas):
            raise ValueError("need 0 <= min_replicas <= max_replicas and max_replicas >= 1")
        return self

    @property
    def name(self) -> str:
        return "kpa"

    @property
    def rails(self) -> Rails:
        return Rails(self.min_replicas, self.max_replicas, self.scale_down_delay_s)

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
        desired, history = self.rails.apply(now, desired, prev.desired_history)
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

    def summary(self, ctx: AutoscaleContext, state: Any) -> AutoscaleSummary:
        if isinstance(state, KpaState):
            return context_summary(ctx, state.reason, state.panic)
        return context_summary(ctx)
