"""Property tests for model units: monotone costs, cache discount, normalisation, NNLS optimality."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgate.core.calibrate import nnls
from fleetgate.core.types import Usage
from fleetgate.core.units import CostProfile, OutputHistory

coef = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)
profiles = st.builds(
    CostProfile,
    alpha=coef,
    beta=coef,
    gamma=coef,
    delta=coef,
    capacity_mu_per_min=st.floats(min_value=1.0, max_value=1e4),
    cache_discount=st.floats(min_value=0.0, max_value=1.0),
)
tokens = st.integers(min_value=0, max_value=200_000)


@given(profiles, tokens, tokens, tokens, tokens)
def test_cost_monotone_and_nonnegative(p: CostProfile, i: int, o: int, extra: int, cached: int) -> None:
    base = p.cost(i, o, cached_tokens=cached)
    assert base >= 0
    assert p.cost(i + extra, o, cached_tokens=cached) >= base - 1e-9 * max(base, 1)
    assert p.cost(i, o + extra, cached_tokens=cached) >= base - 1e-9 * max(base, 1)
    # caching never makes a request dearer
    assert p.cost(i, o, cached_tokens=cached) <= p.cost(i, o) + 1e-9 * max(base, 1)


@given(profiles, tokens, st.integers(0, 5000), st.integers(0, 5000), st.floats(0, 5000))
def test_estimate_covers_settle_when_output_within_budget(
    p: CostProfile, i: int, max_tokens: int, actual: int, p90: float
) -> None:
    budget = min(max_tokens, p90)
    est = p.estimate(i, max_tokens, observed_output_p90=p90)
    if actual <= budget:
        assert p.settle(Usage(prompt_tokens=i, completion_tokens=actual)) <= est + 1e-9 * max(est, 1)


@given(profiles, tokens, tokens, st.floats(min_value=1.0, max_value=1e4))
def test_renormalising_keeps_replica_seconds(p: CostProfile, i: int, o: int, cap: float) -> None:
    q = p.with_capacity(cap)
    a = p.replica_seconds(p.cost(i, o))
    b = q.replica_seconds(q.cost(i, o))
    assert abs(a - b) <= 1e-9 * max(a, 1.0)


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=300))
def test_output_history_p90_is_an_observed_value_and_bounded(values: list[int]) -> None:
    h = OutputHistory(window=50, min_samples=1)
    for v in values:
        h.observe("t", v)
    recent = values[-50:]
    p90 = h.p90("t")
    assert p90 in recent
    assert sum(1 for v in recent if v <= p90) >= 0.9 * len(recent)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(3, 30), st.integers(1, 5))
def test_nnls_kkt(seed: int, m: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(m, n)) * rng.uniform(0.01, 100, size=n)
    b = rng.normal(size=m)
    x = nnls(a, b)
    g = a.T @ (a @ x - b)
    scale = max(float(np.abs(a.T @ b).max()), 1.0)
    assert (x >= 0).all()
    assert (np.abs(g[x > 0]) <= 1e-6 * scale).all()
    assert (g[x == 0] >= -1e-6 * scale).all()
