"""Trace loaders and generators: formats, scaling, non-Poisson arrivals, determinism."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fleetgate.sim.traces import (
    LognormalLengths,
    TraceFormatError,
    detect_format,
    gamma_renewal_arrivals,
    interarrival_cv,
    load_rate_table,
    load_trace,
    synthetic_trace,
    tenant_cv,
)


def test_detects_and_loads_azure(azure_path: Path) -> None:
    assert detect_format(azure_path) == "azure"
    trace = load_trace(azure_path)
    assert len(trace) == 19366
    assert trace.requests[0].arrival_s == 0.0
    assert 3400 < trace.duration_s < 3600  # ~58 minutes
    inputs = sorted(r.input_tokens for r in trace.requests)
    assert inputs[len(inputs) // 2] == pytest.approx(1020, abs=5)


def test_detects_and_loads_mooncake(mooncake_path: Path) -> None:
    assert detect_format(mooncake_path) == "mooncake"
    trace = load_trace(mooncake_path)
    assert len(trace) == 12031
    assert trace.duration_s == pytest.approx(3537.0, abs=1.0)
    for r in trace.requests[:200]:
        assert len(r.hash_ids) == -(-r.input_tokens // 512)


def test_time_and_rate_scaling(mooncake_path: Path) -> None:
    base = load_trace(mooncake_path)
    fast = load_trace(mooncake_path, rate_scale=2.0)
    slow = load_trace(mooncake_path, time_scale=3.0)
    assert fast.duration_s == pytest.approx(base.duration_s / 2)
    assert slow.duration_s == pytest.approx(base.duration_s * 3)
    assert len(fast) == len(base)


def test_servegen_table_and_tenant_replay(servegen_path: Path) -> None:
    table = load_rate_table(servegen_path)
    assert table.window_s == 600.0
    assert len(table.rates) == 162
    assert table.duration_s == pytest.approx(14 * 86400)
    top = table.tenants_by_volume()[0]
    one = load_trace(servegen_path, tenant=top, duration_s=1200, seed=3)
    assert {r.tenant for r in one.requests} == {top}
    expected = float(table.rates[top][:2].sum() * 600)
    assert abs(len(one) - expected) < 0.1 * expected
    # Non-Poisson: gaps are burstier than exponential.
    assert interarrival_cv([r.arrival_s for r in one.requests]) > 1.1
    again = load_trace(servegen_path, tenant=top, duration_s=1200, seed=3)
    assert [r.arrival_s for r in again.requests] == [r.arrival_s for r in one.requests]
    doubled = load_trace(servegen_path, tenant=top, duration_s=1200, seed=3, rate_scale=2.0)
    assert abs(len(doubled) - 2 * expected) < 0.1 * 2 * expected


def test_gamma_renewal_matches_rate_and_cv() -> None:
    rng = np.random.default_rng(1)
    t_s = np.array([0.0, 600.0, 1200.0])
    rates = np.array([10.0, 0.0, 20.0])
    arr = gamma_renewal_arrivals(t_s, 600.0, rates, 1.5, rng)
    assert abs(np.sum(arr < 600) - 6000) < 600
    assert np.sum((arr >= 600) & (arr < 1200)) == 0  # a window of rate 0 gets nothing
    assert abs(np.sum(arr >= 1200) - 12000) < 1200
    assert 1.35 < interarrival_cv(arr[arr < 600]) < 1.65


def test_tenant_cv_is_stable_and_median_near_target() -> None:
    cvs = [tenant_cv(f"client_{i}") for i in range(200)]
    assert tenant_cv("client_3") == tenant_cv("client_3")
    assert 1.05 < float(np.median(cvs)) < 1.35


def test_lognormal_lengths_fit_percentiles() -> None:
    inp, out = LognormalLengths().sample(200_000, np.random.default_rng(0))
    assert np.percentile(inp, 50) == pytest.approx(601, rel=0.03)
    assert np.percentile(inp, 95) == pytest.approx(2404, rel=0.05)
    assert np.percentile(out, 50) == pytest.approx(53, rel=0.05)


def test_synthetic_shared_prefixes_and_spec() -> None:
    trace = synthetic_trace(500, 20.0, seed=1, prefix_groups=5, prefix_blocks=3)
    firsts = {r.hash_ids[0] for r in trace.requests if r.hash_ids}
    assert firsts <= {0, 3, 6, 9, 12}
    spec = load_trace("synthetic:n=300,rate=30,cv=2", seed=2)
    assert len(spec) == 300
    with pytest.raises(TraceFormatError):
        load_trace("synthetic:bogus=1")


def test_unknown_format_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(TraceFormatError, match="cannot tell"):
        load_trace(bad)
