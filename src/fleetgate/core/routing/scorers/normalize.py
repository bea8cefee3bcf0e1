"""Turning raw costs into scores in [0, 1]."""

from __future__ import annotations


def lower_is_better(values: list[float]) -> list[float]:
    """Min-max scale so the lowest value scores 1 and the highest 0; all equal -> all 1."""
    lo = min(values)
    hi = max(values)
    if hi <= lo:
        return [1.0] * len(values)
    inv = 1.0 / (hi - lo)
    return [(hi - v) * inv for v in values]
