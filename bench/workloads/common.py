"""Shared pieces of the seeded workload generators: bursty arrivals and block-id allocation."""

from __future__ import annotations

import numpy as np


class Blocks:
    """Allocates fresh prefix block ids (two prompts share KV exactly as far as their leading ids agree)."""

    def __init__(self, first: int = 0) -> None:
        self.next_id = first

    def take(self, n: int) -> list[int]:
        out = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return out


def bursty_arrivals(
    rng: np.random.Generator, count: int, rate: float, burst: float, period_s: float
) -> list[float]:
    """``count`` arrival times of a Poisson process whose rate alternates between ``burst`` x and
    1 / ``burst`` x ``rate`` every ``period_s`` (thinning at the peak rate)."""
    out: list[float] = []
    t = 0.0
    peak = rate * burst
    while len(out) < count:
        t += float(rng.exponential(1.0 / peak))
        high = int(t // period_s) % 2 == 0
        if rng.random() < (1.0 if high else 1.0 / (burst * burst)):
            out.append(t)
    return out


def zipf_weights(n: int, s: float = 1.1) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()
