"""One set of rails for every autoscaler (Ray Serve style): bounds, scale-down delay, cooldown, rate limits.

A policy proposes a count; the rails keep it inside ``[min_replicas, max_replicas]`` and hold a scale-down
until the proposal has stayed lower for ``scale_down_delay_s``. Every registered policy ends its ``decide``
with its :class:`Rails` (``Rails.apply``, or, where a policy interleaves them with its own holds like
fleetgate's panic mode, the same methods step by step), and :class:`Railed` puts outer rails (the
simulator's ``--min-replicas``/``--max-replicas``, an operator's bounds) around any autoscaler.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleetgate.core.autoscale.base import (
    AutoscaleContext,
    AutoscaleSummary,
    ReportingAutoscaler,
)

#: The largest replica count any autoscaler asks for (a bound that never binds in practice).
NO_MAX = 1_000_000


def apply_bounds(desired: int, min_replicas: int, max_replicas: int) -> int:
    """Clamp to ``[min_replicas, max_replicas]``."""
    return max(min_replicas, min(max_replicas, desired))


def limit_scale_up(current: int, desired: int, max_rate: float) -> int:
    """At most ``max_rate`` x the current count (and always at least one replica more is allowed)."""
    if desired <= current:
        return desired
    cap = max(current + 1, math.ceil(current * max_rate))
    return min(desired, cap)


def limit_scale_down(
    current: int, desired: int, *, max_step: int | None = None, max_rate: float | None = None
) -> int:
    """At most ``max_step`` replicas fewer, and never below ``current / max_rate`` (Knative's rule)."""
    if desired >= current:
        return desired
    floor = desired
    if max_step is not None:
        floor = max(floor, current - max_step)
    if max_rate is not None and max_rate > 0:
        floor = max(floor, math.floor(current / max_rate))
    return min(current, floor)


def in_cooldown(now_s: float, last_event_s: float, cooldown_s: float) -> bool:
    """Whether ``cooldown_s`` has not yet passed since ``last_event_s``."""
    return now_s - last_event_s < cooldown_s


def delayed_floor(history: Sequence[tuple[float, int]], now_s: float, delay_s: float) -> int:
    """The largest desire recorded in the last ``delay_s`` (0 when none): scale-down waits for it to fall."""
    return max((d for t, d in history if now_s - t <= delay_s), default=0)


History = tuple[tuple[float, int], ...]


@dataclass(frozen=True, slots=True)
class Rails:
    """Bounds and the scale-down delay of one autoscaler (its other holds are the policy's own)."""

    min_replicas: int = 0
    max_replicas: int = NO_MAX
    scale_down_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.max_replicas < max(self.min_replicas, 1):
            raise ValueError("need 0 <= min_replicas <= max_replicas and max_replicas >= 1")
        if self.scale_down_delay_s < 0:
            raise ValueError("scale_down_delay_s must be >= 0")

    def bound(self, desired: int) -> int:
        """``desired`` clamped to ``[min_replicas, max_replicas]``."""
        return apply_bounds(desired, self.min_replicas, self.max_replicas)

    def remember(self, history: History, now_s: float, proposed: int, keep_s: float | None = None) -> History:
        """``history`` with ``proposed`` added and entries older than ``keep_s`` (default: the delay) gone."""
        keep = self.scale_down_delay_s if keep_s is None else keep_s
        return (*(h for h in history if now_s - h[0] <= keep), (now_s, proposed))

    def delay_floor(self, history: History, now_s: float) -> int:
        """The largest proposal of the last ``scale_down_delay_s``: a scale-down waits for it to fall."""
        return delayed_floor(history, now_s, self.scale_down_delay_s)

    def apply(self, now_s: float, proposed: int, history: History) -> tuple[int, History]:
        """The count to run for a policy's ``proposed`` one, and the history to keep for the next call."""
        history = self.remember(history, now_s, proposed)
        desired = proposed
        if self.scale_down_delay_s > 0:
            desired = max(desired, self.delay_floor(history, now_s))
        return self.bound(desired), history


@dataclass(frozen=True, slots=True)
class Railed:
    """Outer bounds around any autoscaler (the simulator's and an operator's ``min``/``max`` replicas).

    Only bounds: a delay needs memory, which belongs in the policy's own state (its :class:`Rails`).
    """

    inner: ReportingAutoscaler
    rails: Rails

    def __post_init__(self) -> None:
        if self.rails.scale_down_delay_s:
            raise ValueError("outer rails take bounds only; put the delay in the policy's parameters")

    @property
    def name(self) -> str:
        return self.inner.name

    def decide(self, ctx: AutoscaleContext) -> tuple[int, Any]:
        desired, state = self.inner.decide(ctx)
        return self.rails.bound(int(desired)), state

    def summary(self, ctx: AutoscaleContext, state: Any) -> AutoscaleSummary:
        return self.inner.summary(ctx, state)
