"""Fit a continuous-batching step model from published batch measurements (e.g. Splitwise's perf_model.csv)
and derive the MU profile at saturation from it (split out of ``core.calibrate``, which fits live sweeps)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fleetgate.core.calibrate import (
    FloatArray,
    Measurement,
    fit_seconds,
    fit_weighted_nnls,
    holdout_split,
    mape,
    predicted_seconds,
    profile_from_seconds,
    r2_score,
)
from fleetgate.core.types import RandomSource
from fleetgate.core.units import CostProfile


@dataclass(frozen=True, slots=True)
class BatchRun:
    """One measured batch: ``batch`` identical requests of ``prompt`` input and ``tokens`` output tokens.

    ``prefill_s`` is the time to prefill the whole batch, ``step_s`` the mean decode step time, ``e2e_s``
    the end-to-end latency of the batch (each request's latency).
    """

    prompt: int
    batch: int
    tokens: int
    prefill_s: float
    step_s: float
    e2e_s: float

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.prompt, self.batch, self.tokens)


@dataclass(frozen=True)
class BatchedPerf:
    """A continuous-batching step model fitted from batch measurements (all times in seconds).

    ``prefill(prompts) = prefill_base_s + prefill_s_per_token*sum(p) + prefill_s_per_token2*sum(p^2)/1e6``;
    ``step(batch, contexts) = decode_step_base_s + decode_step_per_seq_s*batch
    + decode_step_per_kilotoken_s*sum(context)/1000``.
    """

    prefill_base_s: float
    prefill_s_per_token: float
    prefill_s_per_token2: float
    decode_step_base_s: float
    decode_step_per_seq_s: float
    decode_step_per_kilotoken_s: float
    max_batch: int

    def prefill_time(self, prompt: int, batch: int = 1) -> float:
        return (
            self.prefill_base_s
            + self.prefill_s_per_token * batch * prompt
            + self.prefill_s_per_token2 * batch * prompt * prompt / 1e6
        )

    def step_time(self, batch: int, mean_context: float) -> float:
        return (
            self.decode_step_base_s
            + self.decode_step_per_seq_s * batch
            + self.decode_step_per_kilotoken_s * batch * mean_context / 1000.0
        )

    def e2e_time(self, prompt: int, batch: int, tokens: int) -> float:
        """Latency of a batch of ``batch`` identical requests: prefill, then ``tokens`` decode steps."""
        return self.prefill_time(prompt, batch) + tokens * self.step_time(batch, prompt + tokens / 2.0)

    def replica_seconds(self, prompt: int, tokens: int, batch: int | None = None) -> float:
        """Share of the replica one request uses when it runs in a full batch (``max_batch`` by default)."""
        b = self.max_batch if batch is None else batch
        return self.e2e_time(prompt, b, tokens) / b

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefill_base_s": self.prefill_base_s,
            "prefill_s_per_token": self.prefill_s_per_token,
            "prefill_s_per_token2": self.prefill_s_per_token2,
            "decode_step_base_s": self.decode_step_base_s,
            "decode_step_per_seq_s": self.decode_step_per_seq_s,
            "decode_step_per_kilotoken_s": self.decode_step_per_kilotoken_s,
            "max_batch": self.max_batch,
        }


@dataclass(frozen=True)
class BatchedFit:
    """The step model, the MU profile derived from it at saturation, and fit quality."""

    perf: BatchedPerf
    profile: CostProfile
    e2e_r2_holdout: float
    e2e_mape_holdout: float
    e2e_mape_train: float
    mu_approx_mape: float
    n_train: int
    n_holdout: int
    dropped: int
    train_shapes: list[tuple[int, int, int]] = field(default_factory=list)
    holdout_shapes: list[tuple[int, int, int]] = field(default_factory=list)


def consistent_runs(runs: Sequence[BatchRun], tolerance: float = 0.25) -> tuple[list[BatchRun], int]:
    """Drop runs whose e2e contradicts their own prefill + tokens x step (generation cut short or stalled)."""
    kept = [r for r in runs if abs(r.e2e_s - (r.prefill_s + r.tokens * r.step_s)) <= tolerance * r.e2e_s]
    return kept, len(runs) - len(kept)


def fit_batched_perf(
    runs: Sequence[BatchRun],
    rng: RandomSource,
    *,
    name: str,
    model: str = "",
    hardware: str = "",
    engine: str = "",
    capacity_mu_per_min: float = 100.0,
    holdout_fraction: float = 0.3,
    long_input_gain: float = 0.15,
    extra_perf: dict[str, Any] | None = None,
) -> BatchedFit:
    """Fit prefill and decode-step models (NNLS, relative error) on training shapes; score e2e on held-out.

    The split is by request shape (prompt, batch, tokens), so repeats of a shape never straddle it. The MU
    profile is the replica share of one request at ``max_batch`` (the largest measured batch):
    the MU form is fitted (NNLS, relative error) to the step model's per-request replica seconds at batch B
    over prompts 128-8192 x outputs 16-1024; ``mu_approx_mape`` reports how close it stays.
    """
    kept, dropped = consistent_runs(runs)
    if len(kept) < 6:
        raise ValueError("too few consistent runs to fit")
    shapes = sorted({r.shape for r in kept})
    tr_idx, _ = holdout_split(len(shapes), holdout_fraction, rng)
    train_shapes = {shapes[i] for i in tr_idx}
    train = [r for r in kept if r.shape in train_shapes]
    hold = [r for r in kept if r.shape not in train_shapes]

    def prefill_x(r: BatchRun, quad: bool) -> list[float]:
        row = [1.0, float(r.batch * r.prompt)]
        return [*row, r.batch * r.prompt * r.prompt / 1e6] if quad else row

    yp = np.asarray([r.prefill_s for r in train])

    def solve_prefill(quad: bool) -> tuple[FloatArray, float]:
        x = np.asarray([prefill_x(r, quad) for r in train])
        c = fit_weighted_nnls(x, yp)
        return c, float(np.sqrt(np.mean(((x @ c - yp) / yp) ** 2)))

    c_lin, e_lin = solve_prefill(False)
    c_quad, e_quad = solve_prefill(True)
    cp = c_quad if (c_quad[2] > 0 and e_quad <= (1 - long_input_gain) * e_lin) else np.append(c_lin, 0.0)
    xs = np.asarray([[1.0, r.batch, r.batch * (r.prompt + r.tokens / 2.0) / 1000.0] for r in train])
    cs = fit_weighted_nnls(xs, np.asarray([r.step_s for r in train]))
    max_batch = max(r.batch for r in kept)
    perf = BatchedPerf(
        prefill_base_s=float(cp[0]),
        prefill_s_per_token=float(cp[1]),
        prefill_s_per_token2=float(cp[2]),
        decode_step_base_s=float(cs[0]),
        decode_step_per_seq_s=float(cs[1]),
        decode_step_per_kilotoken_s=float(cs[2]),
        max_batch=max_batch,
    )

    def e2e_quality(rs: Sequence[BatchRun]) -> tuple[float, float]:
        if not rs:
            return math.nan, math.nan
        y = [r.e2e_s for r in rs]
        p = [perf.e2e_time(r.prompt, r.batch, r.tokens) for r in rs]
        return r2_score(y, p), mape(y, p)

    _, mape_tr = e2e_quality(train)
    r2_ho, mape_ho = e2e_quality(hold)

    # Fit the MU form to the step model's per-request replica share at saturation over a grid of shapes
    # (relative error, extra terms only when they help), the same way live calibration fits measurements.
    b = max_batch
    grid = [
        (p, t) for p in (128, 256, 512, 1024, 2048, 4096, 8192) for t in (16, 32, 64, 128, 256, 512, 1024)
    ]
    grid_m = [Measurement(p, t, perf.replica_seconds(p, t)) for p, t in grid]
    secs, used = fit_seconds(grid_m, gain=long_input_gain)
    profile = profile_from_seconds(
        secs,
        capacity_mu_per_min=capacity_mu_per_min,
        name=name,
        model=model,
        hardware=hardware,
        engine=engine,
    )
    mu_err = mape([m.replica_seconds for m in grid_m], predicted_seconds(profile, grid_m))
    perf_dict = perf.as_dict() | {
        "saturation_batch": b,
        **(extra_perf or {}),
    }
    fit_report = {
        "r2": r2_ho,
        "mape_holdout": mape_ho,
        "target": "end-to-end latency of held-out (prompt, batch, tokens) shapes",
        "mape_train": mape_tr,
        "n_train_runs": len(train),
        "n_holdout_runs": len(hold),
        "n_train_shapes": len(train_shapes),
        "n_holdout_shapes": len(shapes) - len(train_shapes),
        "dropped_inconsistent_runs": dropped,
        "prefill_quadratic_term": bool(perf.prefill_s_per_token2 > 0),
        "extra_terms": list(used),
        "mu_vs_step_model_mape": mu_err,
        "seconds_coefficients": secs,
    }
    profile = replace(profile, perf=perf_dict, fit=fit_report)
    return BatchedFit(
        perf=perf,
        profile=profile,
        e2e_r2_holdout=r2_ho,
        e2e_mape_holdout=mape_ho,
        e2e_mape_train=mape_tr,
        mu_approx_mape=mu_err,
        n_train=len(train),
        n_holdout=len(hold),
        dropped=dropped,
        train_shapes=sorted(train_shapes),
        holdout_shapes=sorted(set(shapes) - train_shapes),
    )
