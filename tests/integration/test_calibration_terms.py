"""Measured cost terms on the simulated engine: the prefix-cache discount and the cost of an image token.

``calibrate_engine(..., measure_cache=True, measure_images=True)`` against a real ``fleetgate engine sim``
process: cold vs shared-prefix runs give ``cache_discount`` (the simulated engine skips the prefill of cached
blocks, so a cached token costs little), text vs text + image runs give ``image_mu_per_token`` (it prefills an
image's 576 tokens as part of the prompt). The llama.cpp figures are in
tests/integration/test_engine_rates_llama.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from fleetgate.core.calibrate import sweep_design
from fleetgate.engines.calibration import calibrate_engine


@pytest.mark.timeout(180)
def test_cache_discount_and_image_cost_are_measured(start_engine: Callable[..., Any]) -> None:
    url = start_engine("fleetgate-sim", "--max-num-seqs", "8", time_scale="0.5").wait_ready()
    run = asyncio.run(
        calibrate_engine(
            url,
            "fleetgate-sim",
            design=sweep_design([64, 512, 1024], [4, 32], [8, 16]),
            requests_per_worker=2,
            progress=False,
            measure_cache=True,
            measure_images=True,
        )
    )
    profile = run.calibration.profile
    cache, image = run.cache, run.image
    print(f"\nalpha {profile.alpha:.3g} MU/token; cache {cache}; image {image}")
    assert cache is not None and cache["cached_tokens_per_request"] > 0.5 * cache["input_tokens"]
    assert cache["cache_discount"] is not None and 0.0 <= cache["cache_discount"] <= 0.5
    assert profile.cache_discount == cache["cache_discount"]  # no longer the shipped 0.1
    assert image is not None and image["image_tokens_per_request"] == 576
    assert image["image_mu_per_token"] is not None
    # what an image token costs, measured (one run here: 0.36 x the fitted alpha, which averages prompts of
    # 64-1,024 tokens; the marginal cost of 576 more tokens on a 260-token prompt is lower): positive and
    # not above twice the text price
    assert 0.0 < image["image_mu_per_token"] <= 2.0 * profile.alpha
    assert profile.image_mu_per_token == image["image_mu_per_token"]
