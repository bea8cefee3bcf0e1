"""Unit tests for core/calibrate.py: NNLS, fit quality, holdout split, sweep design, profile fitting."""

from __future__ import annotations

import random

import numpy as np
import pytest

from fleetgate.core.calibrate import (
    Measurement,
    default_design,
    design_matrix,
    fit_cost_profile,
    holdout_split,
    mape,
    mixed_design,
    nnls,
    predicted_seconds,
    r2_score,
    sweep_design,
)
from fleetgate.core.calibrate_batched import BatchedPerf, BatchRun, fit_batched_perf
from fleetgate.core.units import LONG_INPUT_SCALE


def _kkt_ok(a: np.ndarray, b: np.ndarray, x: np.ndarray, tol: float = 1e-6) -> bool:
    g = a.T @ (a @ x - b)
    pos = x > 1e-12
    return bool((x >= 0).all() and (np.abs(g[pos]) < tol).all() and (g[~pos] > -tol).all())


def test_nnls_satisfies_kkt_on_random_problems() -> None:
    rng = np.random.default_rng(7)
    for _ in range(100):
        m, n = int(rng.integers(3, 25)), int(rng.integers(1, 6))
        a = rng.normal(size=(m, n))
        b = rng.normal(size=m)
        assert _kkt_ok(a, b, nnls(a, b))


def test_nnls_recovers_nonnegative_truth_and_clips_negative() -> None:
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert nnls(a, a @ np.array([2.0, 3.0])) == pytest.approx([2.0, 3.0])
    x = nnls(a, np.array([-1.0, 2.0, 1.0]))
    assert x[0] == 0.0 and x[1] > 0


def test_nnls_scales_columns() -> None:
    # per-request and per-token coefficients differ by orders of magnitude
    inp = np.array([10, 100, 1000, 5000, 20, 300], dtype=float)
    a = np.column_stack([np.ones_like(inp), inp])
    truth = np.array([0.5, 2e-5])
    assert nnls(a, a @ truth) == pytest.approx(truth, rel=1e-9)


def test_nnls_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError):
        nnls(np.ones((3, 2)), np.ones(4))


def test_r2_and_mape() -> None:
    assert r2_score([1, 2, 3], [1, 2, 3]) == 1.0
    assert r2_score([1, 2, 3], [2, 2, 2]) == pytest.approx(0.0)
    assert mape([1.0, 2.0], [1.1, 1.8]) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        mape([0.0], [1.0])


def test_holdout_split_deterministic_and_disjoint() -> None:
    tr1, ho1 = holdout_split(20, 0.25, random.Random(1))
    tr2, ho2 = holdout_split(20, 0.25, random.Random(1))
    assert (tr1, ho1) == (tr2, ho2)
    assert len(ho1) == 5 and sorted(tr1 + ho1) == list(range(20))
    assert holdout_split(20, 0.25, random.Random(2)) != (tr1, ho1)
    tr, ho = holdout_split(2, 0.1, random.Random(0))
    assert len(tr) == 1 and len(ho) == 1


def test_sweep_design() -> None:
    d = sweep_design([100, 10], [5], [4, 1, 4])
    assert [(p.input_tokens, p.output_tokens) for p in d] == [(10, 5), (100, 5)]
    assert d[0].concurrencies == (1, 4)
    assert len(default_design(quick=True)) == 9
    with pytest.raises(ValueError):
        sweep_design([], [1], [1])


def _synthetic(quad: float = 0.0, noise: float = 0.0, seed: int = 0, ctx: float = 0.0) -> list[Measurement]:
    rng = np.random.default_rng(seed)
    out = []
    for i in (16, 128, 512, 1024, 2048, 4096):
        for o in (4, 32, 128, 256):
            secs = 0.02 + 1e-4 * i + 5e-3 * o + quad * i * i / LONG_INPUT_SCALE
            secs += ctx * o * (i + o / 2) / LONG_INPUT_SCALE
            secs *= 1 + noise * rng.normal()
            out.append(Measurement(i, o, secs))
    return out


def test_fit_recovers_linear_profile_and_normalises() -> None:
    cal = fit_cost_profile(_synthetic(), random.Random(3), capacity_mu_per_min=100.0)
    secs = cal.seconds_coefficients
    assert secs["gamma"] == pytest.approx(0.02, rel=1e-6)
    assert secs["alpha"] == pytest.approx(1e-4, rel=1e-6)
    assert secs["beta"] == pytest.approx(5e-3, rel=1e-6)
    assert cal.terms == ()
    p = cal.profile
    # MU = capacity * seconds / 60
    assert p.alpha == pytest.approx(1e-4 * 100 / 60, rel=1e-6)
    assert p.replica_seconds(p.cost(1000, 100)) == pytest.approx(0.02 + 0.1 + 0.5, rel=1e-6)
    assert cal.r2_holdout == pytest.approx(1.0) and cal.mape_holdout < 1e-6
    assert p.fit["n_holdout"] == len(cal.holdout) == 6


def test_fit_adds_long_input_term_only_when_data_asks() -> None:
    cal = fit_cost_profile(_synthetic(quad=0.05), random.Random(3))
    assert cal.terms == ("delta",) and cal.profile.delta > 0 and cal.profile.epsilon == 0
    assert cal.mape_holdout < 0.01
    ctx = fit_cost_profile(_synthetic(ctx=0.01), random.Random(3))
    assert ctx.terms == ("epsilon",)
    assert ctx.seconds_coefficients["epsilon"] == pytest.approx(0.01, rel=1e-6)
    noisy_linear = fit_cost_profile(_synthetic(noise=0.02, seed=4), random.Random(3))
    assert noisy_linear.terms == ()
    assert noisy_linear.mape_holdout < 0.05
    forced = fit_cost_profile(_synthetic(), random.Random(3), terms=["delta"])
    assert forced.terms == ("delta",)
    with pytest.raises(ValueError, match="unknown cost term"):
        fit_cost_profile(_synthetic(), random.Random(3), terms=["zeta"])


def _batched_runs(noise: float = 0.01, seed: int = 0) -> list[BatchRun]:
    """Synthetic batch measurements from a known step model (Splitwise-like one-factor design)."""
    truth = BatchedPerf(0.02, 7e-5, 0.0, 0.03, 1.6e-4, 2e-4, 64)
    rng = np.random.default_rng(seed)
    shapes = [(p, 1, 128) for p in (128, 256, 512, 1024, 2048, 4096, 8192)]
    shapes += [(512, b, 128) for b in (2, 4, 8, 16, 32, 64)]
    shapes += [(512, 1, t) for t in (256, 512, 1024)]
    runs = []
    for p, b, t in shapes:
        for _ in range(3):
            pre = truth.prefill_time(p, b) * (1 + noise * rng.normal())
            step = truth.step_time(b, p + t / 2) * (1 + noise * rng.normal())
            runs.append(BatchRun(p, b, t, pre, step, pre + t * step))
    # a stalled run whose e2e contradicts its own timings is dropped
    runs.append(BatchRun(512, 64, 128, 1.0, 0.05, 80.0))
    return runs


def test_fit_batched_perf_recovers_step_model_and_profile() -> None:
    fit = fit_batched_perf(_batched_runs(), random.Random(0), name="syn", model="m", hardware="h")
    assert fit.dropped == 1
    assert fit.e2e_mape_holdout < 0.03
    assert fit.perf.max_batch == 64
    assert fit.perf.decode_step_base_s == pytest.approx(0.03, rel=0.1)
    assert fit.perf.prefill_s_per_token == pytest.approx(7e-5, rel=0.1)
    p = fit.profile
    assert p.name == "syn" and p.perf["saturation_batch"] == 64
    assert p.fit["mape_holdout"] == fit.e2e_mape_holdout
    # MU is the per-request replica share at the saturation batch
    for prompt, tokens in ((256, 64), (2048, 512)):
        assert p.replica_seconds(p.cost(prompt, tokens)) == pytest.approx(
            fit.perf.replica_seconds(prompt, tokens), rel=0.02
        )
    assert set(fit.holdout_shapes).isdisjoint(fit.train_shapes)


def test_fit_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        fit_cost_profile([Measurement(1, 1, 1.0)] * 2, random.Random(0))
    with pytest.raises(ValueError):
        fit_cost_profile([Measurement(1, 1, 0.0)] * 5, random.Random(0))


def test_steady_state_window_handles_batched_completions() -> None:
    from fleetgate.engines.calibration_probe import steady_state_window

    # a batch of 8 finishes together every second: 4 batches -> 8 req/s in steady state
    times = [float(b) for b in range(1, 5) for _ in range(8)]
    lo, hi, span = steady_state_window(times, elapsed=4.0)
    assert (hi - lo) / span == pytest.approx(8.0)
    # evenly spaced completions, 1 every 0.1 s
    times = [0.1 * k for k in range(1, 41)]
    lo, hi, span = steady_state_window(times, elapsed=4.0)
    assert (hi - lo) / span == pytest.approx(10.0)
    # too few: everything over the elapsed time
    assert steady_state_window([1.0, 2.0], elapsed=4.0) == (0, 2, 4.0)


def test_process_cpu_seconds_counts_own_work() -> None:
    import os

    from fleetgate.engines.calibration_probe import process_cpu_seconds

    before = process_cpu_seconds(os.getpid())
    x = 0
    for k in range(3_000_000):
        x += k * k
    assert x > 0
    assert process_cpu_seconds(os.getpid()) > before


def test_mixed_design_interleaves_long_prefill_and_long_decode() -> None:
    ins, outs = [16, 512, 2048], [4, 64, 192]
    pts = mixed_design(ins, outs, [8, 4], 5, random.Random(1))
    assert len(pts) == 5 and mixed_design(ins, outs, [8], 0, random.Random(1)) == []
    for p in pts:
        assert len(p.mix) == 3 and len(set(p.mix)) == 3
        assert all(i in ins and o in outs for i, o in p.mix)
        assert any(i == 2048 for i, _ in p.mix) and any(o == 192 for _, o in p.mix)
        assert p.concurrencies == (4, 8)
        assert p.input_tokens == round(sum(i for i, _ in p.mix) / 3)
    assert pts == mixed_design(ins, outs, [8, 4], 5, random.Random(1))  # the injected source decides
    with pytest.raises(ValueError):
        mixed_design([16], [4], [1], 1, random.Random(0))


def test_mixed_measurement_is_the_mean_of_its_requests() -> None:
    from fleetgate.core.units import CostProfile

    mix = ((100, 10), (2000, 4), (16, 200))
    m = Measurement(705, 71, 0.5, mix=mix)
    row = design_matrix([m], terms=("delta",))[0]
    want = np.mean([[1.0, i, o, i * i / LONG_INPUT_SCALE] for i, o in mix], axis=0)
    assert row == pytest.approx(want)
    prof = CostProfile(alpha=0.01, beta=0.05, gamma=0.1, delta=0.3)
    mean_mu = sum(prof.cost(i, o) for i, o in mix) / 3
    assert predicted_seconds(prof, [m])[0] == pytest.approx(prof.replica_seconds(mean_mu))
    # the non-linear term makes the mean shape a different (wrong) answer
    assert predicted_seconds(prof, [Measurement(705, 71, 0.5)])[0] != pytest.approx(
        prof.replica_seconds(mean_mu)
    )
    assert m.as_dict()["mix"] == [[100, 10], [2000, 4], [16, 200]]
    assert Measurement(5, 6, 1.0).shapes() == ((5, 6),)


def test_fit_on_homogeneous_and_mixed_runs_recovers_the_profile() -> None:
    def secs(i: int, o: int) -> float:
        return 0.02 + 1e-4 * i + 5e-3 * o + 0.05 * i * i / LONG_INPUT_SCALE

    data = _synthetic(quad=0.05)
    rng = random.Random(5)
    for p in mixed_design([16, 512, 2048, 4096], [4, 128, 256], [8], 8, rng):
        reqs = [p.mix[k % 3] for k in range(12)]
        data.append(
            Measurement(
                p.input_tokens, p.output_tokens, float(np.mean([secs(*r) for r in reqs])), mix=tuple(reqs)
            )
        )
    cal = fit_cost_profile(data, random.Random(2))
    assert cal.terms == ("delta",)
    assert cal.seconds_coefficients["alpha"] == pytest.approx(1e-4, rel=1e-6)
    assert cal.seconds_coefficients["delta"] == pytest.approx(0.05, rel=1e-6)
    assert cal.mape_holdout < 1e-6


def test_prompts_never_share_a_prefix_across_probes() -> None:
    from fleetgate.engines.calibration_probe import EngineProbe

    a = EngineProbe(None, "http://127.0.0.1:1", "m")  # type: ignore[arg-type]
    b = EngineProbe(None, "http://127.0.0.1:1", "m")  # type: ignore[arg-type]
    assert a.nonce != b.nonce
    pa, pb = a.prompt(200), b.prompt(200)
    assert pa.split(" ")[3:] != pb.split(" ")[3:]  # fillers differ too, not only the heads
    assert len(pa.split(" ")) == 4 + 200
    # same probe: every request is new, even with the same shape
    assert a.prompt(50) != a.prompt(50)
    # an injected nonce makes prompts reproducible
    c, d = (EngineProbe(None, "http://x", "m", nonce="n0") for _ in range(2))  # type: ignore[arg-type]
    assert c.prompt(30) == d.prompt(30)


def test_merged_rungs_count_every_request_over_all_busy_time() -> None:
    from fleetgate.engines.calibration_probe import LevelResult, merge_levels

    a = LevelResult(8, 10, 2.0, 20.0, 0.1, 100.0, 4.0, 5.0, busy_s=0.5, usages=[(100, 4)] * 10)
    b = LevelResult(8, 30, 5.0, 20.0, 0.3, 200.0, 8.0, 6.0, busy_s=2.5, usages=[(200, 8)] * 30)
    m = merge_levels(a, b)
    assert m.requests == 40 and m.busy_s == 3.0
    assert m.throughput_rps == pytest.approx(40 / 3.0)
    assert m.mean_prompt_tokens == pytest.approx(175.0)
    assert m.mean_latency_s == pytest.approx(0.25)
    assert len(m.usages) == 40


def test_holdout_scores_the_split_fit_and_the_profile_uses_every_point() -> None:
    data = _synthetic(quad=0.05, noise=0.03, seed=7)
    cal = fit_cost_profile(data, random.Random(4))
    assert cal.split_profile is not None and cal.holdout
    # held-out quality is that of the train-split fit ...
    hold = [data[i] for i in cal.holdout]
    want = mape([m.replica_seconds for m in hold], predicted_seconds(cal.split_profile, hold))
    assert cal.mape_holdout == pytest.approx(want)
    # ... while the shipped profile is fitted on all points (and differs, since the data is noisy)
    every = fit_cost_profile(data, random.Random(4), holdout_fraction=0.0)
    assert cal.profile.alpha == pytest.approx(every.profile.alpha)
    assert cal.profile.delta == pytest.approx(every.profile.delta)
    assert cal.profile.alpha != pytest.approx(cal.split_profile.alpha, rel=1e-9)
    assert cal.mape_all == pytest.approx(mape([m.replica_seconds for m in data], cal.predicted_seconds(data)))
    assert cal.profile.fit["mape_all"] == cal.mape_all
    only_split = fit_cost_profile(data, random.Random(4), refit_all=False)
    assert only_split.profile.alpha == pytest.approx(cal.split_profile.alpha)


def test_jittered_shapes_keep_the_means_and_break_lockstep() -> None:
    from fleetgate.engines.calibration_probe import Shape, jittered

    js = jittered(Shape(100, 64), 0.3)
    assert len(js) == 8 and len(set(js)) == 8
    assert sum(j.words for j in js) / 8 == pytest.approx(100, abs=1)
    assert sum(j.output_tokens for j in js) / 8 == pytest.approx(64, abs=1)
    assert min(j.output_tokens for j in js) >= 0.7 * 64 and max(j.output_tokens for j in js) <= 1.3 * 64
    # input and output factors are not in the same order (long prompts are not always long answers)
    assert [j.words for j in js] == sorted(j.words for j in js)
    assert [j.output_tokens for j in js] != sorted(j.output_tokens for j in js)
    assert jittered(Shape(0, 1), 0.3)[0] == Shape(0, 1)  # never below one output token
    with pytest.raises(ValueError):
        jittered(Shape(1, 1), 1.0)
