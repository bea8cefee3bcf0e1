"""Fit model-unit coefficients from measurements; sweep designs and fit-quality statistics.

The measured quantity is *replica seconds per request*: how much of one replica a request of a given shape
consumes when the replica is saturated (``1 / completed requests per second`` in a saturated run of that
shape). It is fitted as ``gamma + alpha*input + beta*output (+ delta*input^2/LONG_INPUT_SCALE)`` by
non-negative least squares (Lawson-Hanson, implemented here on numpy), weighted by ``1/measured`` so that the
fit minimises *relative* error (what MAPE and capacity planning care about). Seconds then become MU by the
normalisation ``MU = capacity_mu_per_min * seconds / 60``. Randomness (the train/holdout split) is injected.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from fleetgate.core.types import RandomSource
from fleetgate.core.units import LONG_INPUT_SCALE, CostProfile

FloatArray = npt.NDArray[np.float64]


# -- non-negative least squares --------------------------------------------------------------------------


def nnls(
    a: npt.ArrayLike, b: npt.ArrayLike, *, max_iter: int | None = None, tol: float | None = None
) -> FloatArray:
    """Solve ``min ||A x - b||_2`` subject to ``x >= 0`` (Lawson & Hanson's active-set method).

    Columns are scaled to unit norm internally so that coefficients of very different magnitudes (per-token
    vs per-request) are treated alike; the result is in the caller's units.
    """
    A = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64).ravel()
    if A.ndim != 2 or A.shape[0] != y.shape[0]:
        raise ValueError(f"shape mismatch: A {A.shape}, b {y.shape}")
    m, n = A.shape
    if n == 0:
        return np.zeros(0)
    norms = np.linalg.norm(A, axis=0)
    norms[norms == 0] = 1.0
    As = A / norms
    tol = (
        10 * np.finfo(np.float64).eps * max(m, n) * max(float(np.abs(As).max(initial=0.0)), 1.0)
        if tol is None
        else tol
    )
    max_iter = 3 * n + 30 if max_iter is None else max_iter
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = As.T @ (y - As @ x)
    it = 0
    while (~passive).any() and (w[~passive] > tol).any():
        # move the most promising active-set variable into the passive set
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            it += 1
            if it > max_iter * 10:
                break
            s = np.zeros(n)
            s[passive] = np.linalg.lstsq(As[:, passive], y, rcond=None)[0]
            if (s[passive] > tol).all():
                x = s
                break
            # step back towards x until the first passive variable hits zero
            mask = passive & (s <= tol)
            denom = x[mask] - s[mask]
            ratios = np.where(denom > 0, x[mask] / np.where(denom > 0, denom, 1.0), np.inf)
            step = float(min(ratios.min(initial=np.inf), 1.0))
            x = x + step * (s - x)
            passive &= x > tol
            x[~passive] = 0.0
            if not passive.any():
                break
        w = As.T @ (y - As @ x)
        if it > max_iter * 10:
            break
    return np.maximum(x, 0.0) / norms


# -- fit quality ------------------------------------------------------------------------------------------


def r2_score(measured: npt.ArrayLike, predicted: npt.ArrayLike) -> float:
    """Coefficient of determination (1 = perfect; can be negative)."""
    y = np.asarray(measured, dtype=np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    ss_res = float(((y - p) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum()) if y.size else 0.0
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


def mape(measured: npt.ArrayLike, predicted: npt.ArrayLike) -> float:
    """Mean absolute percentage error, as a fraction (0.05 = 5%)."""
    y = np.asarray(measured, dtype=np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    if y.size == 0:
        return math.nan
    if (y == 0).any():
        raise ValueError("MAPE is undefined for zero measurements")
    return float(np.mean(np.abs((p - y) / y)))


def holdout_split(n: int, fraction: float, rng: RandomSource) -> tuple[list[int], list[int]]:
    """Shuffle ``range(n)`` with ``rng`` and return (train, holdout) index lists, both non-empty if n >= 2."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError("holdout fraction must be in [0, 1)")
    keys = [(rng.random(), i) for i in range(n)]
    order = [i for _, i in sorted(keys)]
    k = round(n * fraction)
    if fraction > 0 and n >= 2:
        k = min(max(k, 1), n - 1)
    return sorted(order[k:]), sorted(order[:k])


# -- sweep design -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One request shape to measure, with the concurrency ladder to climb until saturation.

    ``mix`` (optional): a run that cycles through these (input, output) shapes instead of one shape
    (``input_tokens``/``output_tokens`` are then their means). Mixed runs measure what the shapes cost
    when the engine interleaves them, which is how a real workload runs.
    """

    input_tokens: int
    output_tokens: int
    concurrencies: tuple[int, ...]
    mix: tuple[tuple[int, int], ...] = ()


def sweep_design(
    input_lengths: Sequence[int], output_lengths: Sequence[int], concurrencies: Sequence[int]
) -> list[SweepPoint]:
    """Full factorial design of input x output lengths, each climbing the same concurrency ladder."""
    if not input_lengths or not output_lengths or not concurrencies:
        raise ValueError("design needs at least one input length, output length and concurrency")
    ladder = tuple(sorted(set(int(c) for c in concurrencies)))
    if ladder[0] < 1:
        raise ValueError("concurrency must be >= 1")
    return [
        SweepPoint(int(i), int(o), ladder)
        for i, o in itertools.product(sorted(set(input_lengths)), sorted(set(output_lengths)))
    ]


def mixed_design(
    input_lengths: Sequence[int],
    output_lengths: Sequence[int],
    concurrencies: Sequence[int],
    runs: int,
    rng: RandomSource,
    *,
    shapes_per_run: int = 3,
) -> list[SweepPoint]:
    """``runs`` mixed runs, each cycling through ``shapes_per_run`` distinct grid shapes drawn with ``rng``.

    Each run takes one of the longest inputs, one of the longest outputs and random others, so every run
    interleaves long prefills with long decodes (the case where per-shape costs could stop adding up).
    """
    grid = [(int(i), int(o)) for i in sorted(set(input_lengths)) for o in sorted(set(output_lengths))]
    if runs <= 0:
        return []
    if len(grid) < shapes_per_run or shapes_per_run < 2:
        raise ValueError("a mixed run needs at least 2 distinct grid shapes")
    ladder = tuple(sorted(set(int(c) for c in concurrencies)))
    max_in, max_out = max(i for i, _ in grid), max(o for _, o in grid)

    def draw(pool: Sequence[tuple[int, int]]) -> tuple[int, int]:
        return pool[min(int(rng.random() * len(pool)), len(pool) - 1)]

    points = []
    for _ in range(runs):
        chosen: list[tuple[int, int]] = []
        long_in = [g for g in grid if g[0] == max_in and g[1] != max_out]
        long_out = [g for g in grid if g[1] == max_out and g[0] != max_in]
        for pool in (long_in, long_out):
            if pool and len(chosen) < shapes_per_run:
                chosen.append(draw(pool))
        while len(chosen) < shapes_per_run:
            g = draw(grid)
            if g not in chosen:
                chosen.append(g)
        mix = tuple(chosen)
        points.append(
            SweepPoint(
                round(sum(i for i, _ in mix) / len(mix)),
                round(sum(o for _, o in mix) / len(mix)),
                ladder,
                mix=mix,
            )
        )
    return points


def default_design(quick: bool = False) -> list[SweepPoint]:
    """The standard calibration sweep (``quick``: a 3x3 design with a short ladder, for tests and demos)."""
    if quick:
        return sweep_design([32, 256, 1024], [4, 32, 96], [4, 16, 32])
    return sweep_design([16, 128, 512, 1024, 2048], [4, 32, 96, 256], [1, 2, 4, 8, 16, 32, 64])


# -- fitting ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Measurement:
    """Replica seconds one request of this shape consumed at saturation (plus how it was measured).

    ``mix`` (optional): the (input, output) token counts of every request of a mixed run; then
    ``replica_seconds`` is the run's mean per request and the model is scored on the mean of its
    predictions over these requests (``input_tokens``/``output_tokens`` are only the means, for display).
    """

    input_tokens: int
    output_tokens: int
    replica_seconds: float
    cached_tokens: int = 0
    concurrency: int = 0
    requests: int = 0
    throughput_rps: float = 0.0
    latency_s: float = 0.0
    mix: tuple[tuple[int, int], ...] = ()

    def shapes(self) -> tuple[tuple[int, int], ...]:
        """The (input, output) shapes whose mean this measurement is."""
        return self.mix or ((self.input_tokens, self.output_tokens),)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        d = asdict(self)
        d["mix"] = [list(m) for m in self.mix]
        return d


#: Optional long-context terms of the cost model, by coefficient name (see core/units.py).
EXTRA_TERMS: tuple[str, ...] = ("delta", "epsilon")


def _term(name: str, inp: float, out: float) -> float:
    if name == "delta":
        return inp * inp / LONG_INPUT_SCALE
    if name == "epsilon":
        return out * (inp + out / 2.0) / LONG_INPUT_SCALE
    raise ValueError(f"unknown cost term {name!r}; expected one of {EXTRA_TERMS}")


def design_matrix(measurements: Sequence[Measurement], *, terms: Sequence[str] = ()) -> FloatArray:
    """Rows ``[1, input, output, *extra terms]`` matching the coefficients ``gamma, alpha, beta, *terms``."""
    rows = []
    for m in measurements:
        shapes = m.shapes()
        acc = np.zeros(3 + len(terms))
        for i, o in shapes:
            inp, out = float(i), float(o)
            acc += [1.0, inp, out, *(_term(t, inp, out) for t in terms)]
        rows.append(acc / len(shapes))
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), 3 + len(terms))


def fit_weighted_nnls(x: FloatArray, y: FloatArray, *, relative: bool = True) -> FloatArray:
    """NNLS of ``x c ~ y``; ``relative`` weights each row by ``1/y`` (minimises relative error)."""
    if relative:
        if (y <= 0).any():
            raise ValueError("relative fitting needs positive measurements")
        return nnls(x / y[:, None], np.ones_like(y))
    return nnls(x, y)


def fit_seconds(
    measurements: Sequence[Measurement], *, terms: Sequence[str] | None = None, gain: float = 0.15
) -> tuple[dict[str, float], tuple[str, ...]]:
    """Fit replica seconds per request; returns coefficients (seconds) by name and the extra terms used.

    ``terms=None`` selects extra terms greedily: a term is added when it cuts the leave-one-out relative RMS
    error on these measurements by at least ``gain`` (the data "asks for it"; cross-validation keeps a
    term from merely soaking up noise). Pass a sequence to force a set.
    """
    y = np.asarray([m.replica_seconds for m in measurements], dtype=np.float64)
    n = len(measurements)

    def solve(ts: Sequence[str]) -> FloatArray:
        return fit_weighted_nnls(design_matrix(measurements, terms=ts), y)

    def cv_error(ts: Sequence[str]) -> float:
        x = design_matrix(measurements, terms=ts)
        if n <= x.shape[1] + 1:  # too few points to leave one out: no extra terms
            return math.inf
        rel = []
        for i in range(n):
            keep = np.arange(n) != i
            c = fit_weighted_nnls(x[keep], y[keep])
            rel.append((x[i] @ c - y[i]) / y[i])
        return float(np.sqrt(np.mean(np.square(rel))))

    if terms is None:
        chosen: list[str] = []
        err = cv_error(chosen)
        improved = True
        while improved and math.isfinite(err):
            improved = False
            best: tuple[float, str] | None = None
            for t in EXTRA_TERMS:
                if t in chosen:
                    continue
                e = cv_error([*chosen, t])
                if e <= (1.0 - gain) * err and (best is None or e < best[0]) and solve([*chosen, t])[-1] > 0:
                    best = (e, t)
            if best is not None:
                err = best[0]
                chosen.append(best[1])
                improved = True
        used = tuple(chosen)
        coef = solve(used)
    else:
        used = tuple(terms)
        for t in used:
            _term(t, 0.0, 0.0)
        coef = solve(used)
    secs = {"gamma": float(coef[0]), "alpha": float(coef[1]), "beta": float(coef[2])}
    for t in EXTRA_TERMS:
        secs[t] = float(coef[3 + used.index(t)]) if t in used else 0.0
    return secs, used


def profile_from_seconds(
    secs: Mapping[str, float], *, capacity_mu_per_min: float = 100.0, **kwargs: Any
) -> CostProfile:
    """A CostProfile from coefficients in replica seconds (normalisation: MU = capacity x seconds / 60)."""
    k = capacity_mu_per_min / 60.0
    return CostProfile(
        alpha=secs.get("alpha", 0.0) * k,
        beta=secs.get("beta", 0.0) * k,
        gamma=secs.get("gamma", 0.0) * k,
        delta=secs.get("delta", 0.0) * k,
        epsilon=secs.get("epsilon", 0.0) * k,
        capacity_mu_per_min=capacity_mu_per_min,
        **kwargs,
    )


def predicted_seconds(profile: CostProfile, measurements: Sequence[Measurement]) -> FloatArray:
    """Replica seconds ``profile`` predicts for each measurement's (input, output) shape."""
    out = []
    for m in measurements:
        shapes = m.shapes()
        mu = math.fsum(profile.cost(i, o) for i, o in shapes) / len(shapes)
        out.append(profile.replica_seconds(mu))
    return np.asarray(out, dtype=np.float64)


@dataclass(frozen=True)
class Calibration:
    """A fitted profile and its quality on the training and held-out measurements."""

    profile: CostProfile
    seconds_coefficients: dict[str, float]
    r2_train: float
    mape_train: float
    r2_holdout: float
    mape_holdout: float
    terms: tuple[str, ...]
    train: list[int] = field(default_factory=list)
    holdout: list[int] = field(default_factory=list)
    split_profile: CostProfile | None = None
    split_terms: tuple[str, ...] = ()
    r2_all: float = math.nan
    mape_all: float = math.nan

    def predicted_seconds(self, measurements: Sequence[Measurement]) -> FloatArray:
        """Replica seconds the fitted profile predicts for each measurement's shape."""
        return predicted_seconds(self.profile, measurements)

    def prefill_seconds(self, prompt_tokens: float) -> float:
        """Replica seconds the fit charges for prefilling ``prompt_tokens`` (alpha, long-input term)."""
        c = self.seconds_coefficients
        n = max(float(prompt_tokens), 0.0)
        return c.get("alpha", 0.0) * n + c.get("delta", 0.0) * n * n / LONG_INPUT_SCALE

    def prefill_tokens_per_s(self, prompts: Sequence[float]) -> float | None:
        """Prompt tokens per second the fit implies for prefilling these prompts (what the online rate
        learner, ``core.engine_rates``, should find on the same engine for the same traffic)."""
        seconds = math.fsum(self.prefill_seconds(n) for n in prompts)
        return math.fsum(prompts) / seconds if seconds > 0 else None

    def fit_report(self) -> dict[str, Any]:
        """The quality numbers stored in the profile's ``fit`` field."""
        return {
            "r2": self.r2_holdout,
            "mape_holdout": self.mape_holdout,
            "r2_train": self.r2_train,
            "mape_train": self.mape_train,
            "r2_all": self.r2_all,
            "mape_all": self.mape_all,
            "n_train": len(self.train),
            "n_holdout": len(self.holdout),
            "extra_terms": list(self.terms),
            "split_extra_terms": list(self.split_terms),
            "holdout_scores": "the same procedure fitted on the train split only, scored on the rest",
            "seconds_coefficients": dict(self.seconds_coefficients),
        }


def fit_cost_profile(
    measurements: Sequence[Measurement],
    rng: RandomSource,
    *,
    name: str = "calibrated",
    model: str = "",
    hardware: str = "",
    engine: str = "",
    capacity_mu_per_min: float = 100.0,
    holdout_fraction: float = 0.25,
    terms: Sequence[str] | None = None,
    term_gain: float = 0.15,
    perf: dict[str, Any] | None = None,
    refit_all: bool = True,
) -> Calibration:
    """Fit alpha/beta/gamma (plus long-context terms the data asks for) and score it on held-out points.

    The held-out R^2/MAPE are those of the procedure (term selection included) fitted on the train split
    alone; the returned profile is then fitted the same way on every measurement (``refit_all``), and its
    own quality on all of them is ``r2_all``/``mape_all``. ``split_profile`` is the train-split fit.
    """
    if len(measurements) < 3:
        raise ValueError("need at least 3 measurements to fit 3 coefficients")
    y_all = np.asarray([m.replica_seconds for m in measurements], dtype=np.float64)
    if (y_all <= 0).any() or not np.isfinite(y_all).all():
        raise ValueError("replica_seconds must be positive and finite")
    train, hold = holdout_split(len(measurements), holdout_fraction, rng)
    if len(train) < 3:
        train, hold = list(range(len(measurements))), []
    meta: dict[str, Any] = {
        "name": name,
        "model": model,
        "hardware": hardware,
        "engine": engine,
        "perf": dict(perf or {}),
    }
    # held-out quality: the whole procedure (term selection included) on the train split only
    split_secs, split_used = fit_seconds([measurements[i] for i in train], terms=terms, gain=term_gain)
    split_profile = profile_from_seconds(split_secs, capacity_mu_per_min=capacity_mu_per_min, **meta)
    # the shipped profile: the same procedure on every measurement (a held-out shape is information too;
    # with ~16 costly shapes, leaving out a corner of the design shifts the long-context terms a lot)
    if refit_all and hold:
        secs, used = fit_seconds(measurements, terms=terms, gain=term_gain)
        profile = profile_from_seconds(secs, capacity_mu_per_min=capacity_mu_per_min, **meta)
    else:
        secs, used, profile = split_secs, split_used, split_profile

    def quality(prof: CostProfile, idx: list[int]) -> tuple[float, float]:
        if not idx:
            return math.nan, math.nan
        pred = predicted_seconds(prof, [measurements[i] for i in idx])
        return r2_score(y_all[idx], pred), mape(y_all[idx], pred)

    r2_tr, mape_tr = quality(split_profile, train)
    r2_ho, mape_ho = quality(split_profile, hold)
    r2_all, mape_all = quality(profile, list(range(len(measurements))))
    cal = Calibration(
        profile=profile,
        seconds_coefficients=secs,
        r2_train=r2_tr,
        mape_train=mape_tr,
        r2_holdout=r2_ho,
        mape_holdout=mape_ho,
        terms=used,
        train=train,
        holdout=hold,
        split_profile=split_profile,
        split_terms=split_used,
        r2_all=r2_all,
        mape_all=mape_all,
    )
    return replace(cal, profile=replace(profile, fit=cal.fit_report()))


def prefix_cache_discount(
    cold_s: float, cached_s: float, prompt_tokens: float, cached_tokens: float, calibration: Calibration
) -> float:
    """The fraction of alpha a prefix-cached prompt token still costs, from two measurements of one shape.

    ``cold_s``/``cached_s``: replica seconds per request without and with ``cached_tokens`` of its
    ``prompt_tokens`` served from the cache. The fit says what those tokens cost at full price (the prefill
    of the whole prompt minus that of the uncached rest); the cache saved ``cold_s - cached_s`` of it.
    Clamped to [0, 1] (noise can make a saving look larger than the full price, or negative).
    """
    full = calibration.prefill_seconds(prompt_tokens) - calibration.prefill_seconds(
        prompt_tokens - cached_tokens
    )
    if full <= 0:
        return 1.0
    return min(max(1.0 - (cold_s - cached_s) / full, 0.0), 1.0)


def image_cost_per_token(
    text_s: float, image_s: float, image_tokens: float, capacity_mu_per_min: float
) -> float:
    """MU per image token from replica seconds per request without and with ``image_tokens`` of images
    (never negative: noise can make the image run look cheaper)."""
    if image_tokens <= 0:
        raise ValueError("image_tokens must be positive")
    return max(image_s - text_s, 0.0) / image_tokens * capacity_mu_per_min / 60.0
