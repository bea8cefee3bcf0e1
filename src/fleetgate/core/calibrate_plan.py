"""Planning a calibration sweep against a time budget, and its progress estimate (sans-IO).

Why: a full sweep against a slow engine can run for tens of minutes. With a budget, shapes run in a
space-filling order (each next shape the one farthest, in log input and output length, from those already
measured; pure shapes before mixed runs), so whatever part of the design fits in the budget covers it evenly;
a shape starts only while its estimated duration still fits. The estimate scales the seconds measured so
far per unit of work (output tokens plus input tokens / 8, a rough decode-vs-prefill weight) to the next
shape. At least ``min_shapes`` run whatever the budget (the fit needs them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleetgate.core.calibrate import SweepPoint

#: Shapes a fit needs at least (3 coefficients plus held-out shapes).
MIN_SHAPES = 6


def _work(point: SweepPoint) -> float:
    return point.output_tokens + point.input_tokens / 8 + 1.0


def spread_order(points: Sequence[SweepPoint]) -> list[SweepPoint]:
    """``points`` in a space-filling order: the smallest first, then greedily the farthest from the chosen."""
    pure = [p for p in points if not p.mix]
    mixed = [p for p in points if p.mix]
    if not pure:
        return list(points)

    def coords(p: SweepPoint) -> tuple[float, float]:
        return math.log(p.input_tokens + 1), math.log(p.output_tokens + 1)

    span_x = max(coords(p)[0] for p in pure) - min(coords(p)[0] for p in pure) or 1.0
    span_y = max(coords(p)[1] for p in pure) - min(coords(p)[1] for p in pure) or 1.0

    def dist(a: SweepPoint, b: SweepPoint) -> float:
        (ax, ay), (bx, by) = coords(a), coords(b)
        return math.hypot((ax - bx) / span_x, (ay - by) / span_y)

    rest = sorted(pure, key=_work)
    chosen = [rest.pop(0)]
    while rest:
        best = max(range(len(rest)), key=lambda i: (min(dist(rest[i], c) for c in chosen), -i))
        chosen.append(rest.pop(best))
    return chosen + mixed


@dataclass(slots=True)
class SweepPlan:
    """Which shapes run, in which order, and how long the rest will take."""

    points: list[SweepPoint]
    budget_s: float | None = None
    min_shapes: int = MIN_SHAPES
    _seconds: float = 0.0
    _work: float = 0.0
    done: int = field(default=0)

    @classmethod
    def build(cls, points: Sequence[SweepPoint], budget_s: float | None) -> SweepPlan:
        ordered = spread_order(points) if budget_s is not None else list(points)
        return cls(ordered, budget_s, min(MIN_SHAPES, len(ordered)))

    def estimate_s(self, point: SweepPoint) -> float | None:
        """Seconds ``point`` should take, from what was measured so far (``None`` before any)."""
        if self._work <= 0:
            return None
        return self._seconds / self._work * _work(point)

    def should_start(self, point: SweepPoint, elapsed_s: float) -> bool:
        """Whether ``point`` still fits the budget (always, without one or below ``min_shapes``)."""
        if self.budget_s is None or self.done < self.min_shapes:
            return True
        estimate = self.estimate_s(point)
        return estimate is None or elapsed_s + estimate <= self.budget_s

    def finished(self, point: SweepPoint, seconds: float) -> None:
        self.done += 1
        self._seconds += seconds
        self._work += _work(point)

    def eta_s(self, elapsed_s: float) -> float | None:
        """Seconds left for the shapes not yet run (capped by the budget), ``None`` before any estimate."""
        if self._work <= 0:
            return None
        left = sum(self._seconds / self._work * _work(p) for p in self.points[self.done :])
        if self.budget_s is not None:
            left = min(left, max(self.budget_s - elapsed_s, 0.0))
        return left
