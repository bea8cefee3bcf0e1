"""Unit tests for the model-unit cost profile (core/units.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetgate.core.types import Usage
from fleetgate.core.units import (
    DEFAULT_PROFILE,
    LONG_INPUT_SCALE,
    CostProfile,
    OutputHistory,
    image_tokens_for,
)
from fleetgate.profiles import bundled_profile_names, load_profile

P = CostProfile(name="t", alpha=0.002, beta=0.02, gamma=0.1, capacity_mu_per_min=100.0)


def test_linear_cost() -> None:
    assert P.cost(1000, 200) == pytest.approx(0.1 + 2.0 + 4.0)


def test_estimate_uses_min_of_max_tokens_and_p90() -> None:
    assert P.estimate(1000, 200) == pytest.approx(P.cost(1000, 200))
    assert P.estimate(1000, 200, observed_output_p90=50.0) == pytest.approx(P.cost(1000, 50))
    assert P.estimate(1000, 20, observed_output_p90=50.0) == pytest.approx(P.cost(1000, 20))
    assert P.estimate(1000, None, observed_output_p90=50.0) == pytest.approx(P.cost(1000, 50))
    assert P.estimate(1000, None) == pytest.approx(P.cost(1000, P.default_output_tokens))


def test_settle_uses_real_counts() -> None:
    usage = Usage(prompt_tokens=1000, completion_tokens=37)
    assert P.settle(usage) == pytest.approx(0.1 + 2.0 + 0.74)


def test_prefix_cache_discount() -> None:
    p = CostProfile(alpha=0.002, beta=0.0, gamma=0.0, cache_discount=0.25)
    full = p.cost(1000, 0)
    half_cached = p.cost(1000, 0, cached_tokens=500)
    assert half_cached == pytest.approx(0.002 * (500 + 0.25 * 500))
    assert half_cached < full
    # cached tokens beyond the prompt are clamped
    assert p.cost(100, 0, cached_tokens=10_000) == pytest.approx(0.002 * 0.25 * 100)
    assert p.settle(Usage(prompt_tokens=1000, cached_tokens=500)) == pytest.approx(half_cached)


def test_long_input_term_only_on_uncached_part() -> None:
    p = CostProfile(alpha=0.0, beta=0.0, gamma=0.0, delta=1.0, cache_discount=0.0)
    assert p.cost(2000, 0) == pytest.approx(2000 * 2000 / LONG_INPUT_SCALE)
    assert p.cost(2000, 0, cached_tokens=1500) == pytest.approx(500 * 2000 / LONG_INPUT_SCALE)


def test_image_term_defaults_to_alpha() -> None:
    assert P.cost(0, 0, image_tokens=100) == pytest.approx(0.1 + 0.2)
    p = CostProfile(alpha=0.002, image_mu_per_token=0.01)
    assert p.cost(0, 0, image_tokens=100) == pytest.approx(1.0)
    assert p.settle(Usage(image_tokens=100)) == pytest.approx(1.0)


def test_image_tokens_geometry() -> None:
    assert image_tokens_for(336, 336, patch_size=14) == 576
    assert image_tokens_for(448, 448, patch_size=14, merge_size=2) == 256
    assert image_tokens_for(10, 10, patch_size=14, merge_size=2) == 1
    assert image_tokens_for(4000, 3000, fixed_tokens=576) == 576
    assert image_tokens_for(4000, 3000, patch_size=14, max_tokens=1024, extra_tokens=2) == 1026
    with pytest.raises(ValueError):
        image_tokens_for(0, 10)


def test_normalisation_and_rescale() -> None:
    # 1 MU = 0.6 replica seconds at 100 MU/min
    assert P.replica_seconds(1.0) == pytest.approx(0.6)
    assert P.mu_for_seconds(60.0) == pytest.approx(100.0)
    q = P.with_capacity(50.0)
    assert q.cost(1000, 200) == pytest.approx(P.cost(1000, 200) / 2)
    assert q.replica_seconds(q.cost(1000, 200)) == pytest.approx(P.replica_seconds(P.cost(1000, 200)))
    assert P.saturated_requests_per_min(2.0) == pytest.approx(50.0)


def test_validation() -> None:
    with pytest.raises(ValueError):
        CostProfile(alpha=-1.0)
    with pytest.raises(ValueError):
        CostProfile(capacity_mu_per_min=0.0)
    with pytest.raises(ValueError):
        CostProfile(cache_discount=1.5)


def test_roundtrip_and_load(tmp_path: Path) -> None:
    p = CostProfile(name="x", alpha=0.1, beta=0.2, gamma=0.3, delta=0.4, perf={"max_batch": 8}, fit={"r2": 1})
    path = tmp_path / "p.json"
    data = p.to_dict() | {"measurements": [{"a": 1}]}
    path.write_text(json.dumps(data))
    q = load_profile(str(path))
    assert q == p
    assert q.perf["max_batch"] == 8
    assert load_profile(None) is DEFAULT_PROFILE
    with pytest.raises(ValueError, match="unknown cost profile"):
        load_profile(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_profile(str(bad))


def test_bundled_profiles_load() -> None:
    for name in bundled_profile_names():
        prof = load_profile(name)
        assert prof.alpha >= 0 and prof.beta > 0


def test_output_history_p90() -> None:
    h = OutputHistory(window=10, min_samples=5)
    assert h.p90("a") is None
    for v in range(1, 5):
        h.observe("a", v)
    assert h.p90("a") is None
    for v in range(5, 21):
        h.observe("a", v)
    # window keeps 11..20; nearest-rank p90 of 10 values is the 9th
    assert h.count("a") == 10
    assert h.p90("a") == 19.0
    assert h.p90("b") is None


def test_output_history_bounded_tenants() -> None:
    h = OutputHistory(window=4, min_samples=1, max_tenants=2)
    h.observe("a", 1)
    h.observe("b", 2)
    h.observe("a", 3)  # a is now most recent
    h.observe("c", 4)  # evicts b
    assert len(h) == 2
    assert h.p90("b") is None
    assert h.p90("a") == 3.0


def test_estimate_request_uses_tenant_history() -> None:
    from fleetgate.core.types import RequestInfo

    h = OutputHistory(window=10, min_samples=2)
    req = RequestInfo(request_id="r", model="m", tenant="t", input_tokens=500, max_output_tokens=400)
    assert P.estimate_request(req, h) == pytest.approx(P.cost(500, 400))
    h.observe("t", 30)
    h.observe("t", 50)
    assert P.estimate_request(req, h) == pytest.approx(P.cost(500, 50))
    assert P.estimate_request(req) == pytest.approx(P.cost(500, 400))


def test_epsilon_decode_context_term() -> None:
    p = CostProfile(epsilon=2.0)
    assert p.cost(1000, 100) == pytest.approx(2.0 * 100 * (1000 + 50) / LONG_INPUT_SCALE)
    assert p.with_capacity(200.0).epsilon == pytest.approx(4.0)


def test_settle_charges_image_tokens_once() -> None:
    """Engines report image tokens inside prompt_tokens: settle must not charge them as text too."""
    profile = CostProfile(name="t", alpha=1.0, beta=2.0, gamma=3.0, image_mu_per_token=0.5)
    text_only = profile.settle(Usage(prompt_tokens=100, completion_tokens=10))
    with_image = profile.settle(Usage(prompt_tokens=676, completion_tokens=10, image_tokens=576))
    assert with_image == pytest.approx(text_only + 0.5 * 576)
