"""Summary statistics of a simulation run, shared by the discrete-event and fluid modes.

All results are plain dicts of floats/ints with a fixed key order so that the same seed gives byte-identical
JSON (only ``wall_s`` differs between runs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Keys every run reports, in this order (fluid runs fill what they can and add their own).
SUMMARY_KEYS: tuple[str, ...] = (
    "mode",
    "policy",
    "trace",
    "seed",
    "replicas",
    "requests",
    "completed",
    "rejected",
    "ttft_p50_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "ttft_mean_s",
    "e2e_p50_s",
    "e2e_p95_s",
    "e2e_mean_s",
    "output_tokens_per_s",
    "cache_hit_rate",
    "replica_seconds",
    "replica_hours",
    "max_over_mean_load",
    "max_over_mean_load_p50",
    "slo_ttft_p95_s",
    "slo_attainment",
    "sim_duration_s",
    "wall_s",
    "requests_per_wall_s",
)


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """Linear-interpolated percentile (``nan`` for no values)."""
    arr = np.asarray(values, dtype=np.float64)
    return float(np.percentile(arr, q)) if arr.size else math.nan


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """Quantile ``q`` in [0, 1] of a weighted sample (step function; ``nan`` when the weights sum to 0)."""
    total = float(weights.sum())
    if values.size == 0 or total <= 0:
        return math.nan
    order = np.argsort(values, kind="stable")
    cw = np.cumsum(weights[order])
    idx = int(np.searchsorted(cw, q * total, side="left"))
    return float(values[order][min(idx, values.size - 1)])


def load_imbalance(window_load: np.ndarray) -> tuple[float, float]:
    """(max, median) over windows of max-replica load / mean-replica load.

    ``window_load[w, r]`` is the MU replica ``r`` served in window ``w``, ``nan`` where the replica was not
    ready for that whole window (so starting/draining replicas do not count as idle). Windows with no load
    are skipped.
    """
    if window_load.size == 0:
        return (math.nan, math.nan)
    ratios = []
    for row in window_load:
        vals = row[~np.isnan(row)]
        if vals.size == 0:
            continue
        mean = float(vals.mean())
        if mean <= 0:
            continue
        ratios.append(float(vals.max()) / mean)
    if not ratios:
        return (math.nan, math.nan)
    return (max(ratios), float(np.median(ratios)))


def slo_attainment(minute_p95: np.ndarray, slo_s: float | None) -> float:
    """Share of minutes (with traffic) whose p95 TTFT met ``slo_s`` (``nan`` when no SLO is set)."""
    if slo_s is None:
        return math.nan
    vals = minute_p95[~np.isnan(minute_p95)]
    return float(np.mean(vals <= slo_s)) if vals.size else math.nan


def per_minute_p95(times: np.ndarray, ttft: np.ndarray, horizon_s: float) -> np.ndarray:
    """p95 TTFT of the requests arriving in each minute (``nan`` for minutes without arrivals)."""
    n = max(1, math.ceil(horizon_s / 60.0))
    out = np.full(n, math.nan)
    if times.size == 0:
        return out
    idx = np.minimum((times // 60.0).astype(np.int64), n - 1)
    order = np.argsort(idx, kind="stable")
    idx_s, ttft_s = idx[order], ttft[order]
    bounds = np.searchsorted(idx_s, np.arange(n + 1))
    for m in range(n):
        a, b = bounds[m], bounds[m + 1]
        if b > a:
            out[m] = float(np.percentile(ttft_s[a:b], 95))
    return out


def clean(value: Any) -> Any:
    """JSON-safe: NaN/inf become ``None``; floats rounded to 9 significant digits for stable text."""
    if isinstance(value, float | np.floating):
        f = float(value)
        if not math.isfinite(f):
            return None
        return float(f"{f:.9g}")
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def ordered(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with the standard keys first (in ``SUMMARY_KEYS`` order), then the rest sorted."""
    out = {k: summary.get(k) for k in SUMMARY_KEYS if k in summary}
    for k in sorted(summary):
        if k not in out:
            out[k] = summary[k]
    result: dict[str, Any] = clean(out)
    return result
