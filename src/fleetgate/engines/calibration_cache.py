"""The cache and image terms of a calibration, measured instead of assumed (``cache_discount``,
``image_mu_per_token``).

Two saturated runs of the same shape back to back on the live engine: *cold* (prompts that share nothing, as
in the main sweep) and *cached* (every prompt starts with the same long prefix, ``shared_fraction`` of its
words, so the engine serves that part from its prefix cache; the engine's own ``cached_tokens`` says how
much). The replica seconds saved, over what those cached tokens cost to prefill by the fitted profile, is
the fraction the cache saves; ``cache_discount`` (the fraction of alpha a cached token still costs) is one
minus it (``core.calibrate.prefix_cache_discount``).

Images, on a multimodal engine (or the simulated one): the same text shape without and with one image part;
the extra replica seconds over the image tokens the engine reports is what an image token costs
(``image_mu_per_token``; the shipped profiles price it like a text token, alpha).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from fleetgate.core.calibrate import Calibration, image_cost_per_token, prefix_cache_discount
from fleetgate.engines.calibration_probe import CalibrationError, EngineProbe, LevelResult, Shape


@dataclass(frozen=True)
class CacheMeasurement:
    """The cold and cached runs and the discount they imply (``None``: the engine reported no hits)."""

    input_tokens: float
    output_tokens: float
    cached_tokens_per_request: float
    cold_replica_s: float
    cached_replica_s: float
    cache_discount: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens_per_request": self.cached_tokens_per_request,
            "cold_replica_s": self.cold_replica_s,
            "cached_replica_s": self.cached_replica_s,
            "cache_discount": self.cache_discount,
            "method": "cold vs shared-prefix saturated runs of one shape; discount = 1 - saved / full price",
        }


async def _saturated(
    probe: EngineProbe,
    shape: Shape,
    counter: Callable[[], float],
    ladder: Sequence[int],
    requests_per_worker: int,
    min_requests: int,
) -> tuple[LevelResult, float]:
    """The best level of a saturated run of ``shape`` and how much ``counter`` grew per request sent."""
    before = counter()
    sat = await probe.saturate(
        lambda _i: shape, ladder, requests_per_worker=requests_per_worker, min_requests=min_requests
    )
    sent = sum(lv.requests for lv in sat.levels)
    return sat.best, (counter() - before) / max(sent, 1)


async def measure_prefix_cache(
    engine: str,
    model: str,
    calibration: Calibration,
    *,
    input_tokens: int = 1024,
    output_tokens: int = 4,
    shared_fraction: float = 0.75,
    ladder: Sequence[int] = (4, 8),
    requests_per_worker: int = 4,
    min_requests: int = 16,
    api_key: str | None = None,
    extra_body: Mapping[str, Any] | None = None,
    busy_clock: Callable[[], float] | None = None,
) -> CacheMeasurement:
    """Measure cold and cached replica seconds of one shape and derive the cache discount."""
    if not 0.0 < shared_fraction < 1.0:
        raise ValueError("shared_fraction must be in (0, 1)")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        probe = EngineProbe(
            session, engine, model, api_key=api_key, extra_body=extra_body, busy_clock=busy_clock
        )
        words = await probe.words_for(input_tokens)
        shared = round(words * shared_fraction)
        cold_shape = Shape(words, output_tokens)
        cached_shape = Shape(words - shared, output_tokens, shared_words=shared)
        await probe.send(cached_shape)  # the first request puts the shared prefix into the cache

        def run(shape: Shape) -> Awaitable[tuple[LevelResult, float]]:
            """The saturated run of ``shape`` and the cached prompt tokens per request it saw."""
            return _saturated(
                probe, shape, lambda: probe.cached_tokens, ladder, requests_per_worker, min_requests
            )

        cold, _ = await run(cold_shape)
        cached, hit_tokens = await run(cached_shape)
    cold_s, cached_s = 1.0 / cold.throughput_rps, 1.0 / cached.throughput_rps
    prompt = cached.mean_prompt_tokens
    if abs(prompt - cold.mean_prompt_tokens) > 0.1 * cold.mean_prompt_tokens:
        raise CalibrationError(
            f"cold and cached prompts differ in length ({cold.mean_prompt_tokens:.0f} vs {prompt:.0f} tokens)"
        )
    discount = None
    if hit_tokens >= 1.0:
        discount = prefix_cache_discount(cold_s, cached_s, prompt, hit_tokens, calibration)
    return CacheMeasurement(
        input_tokens=prompt,
        output_tokens=cached.mean_completion_tokens,
        cached_tokens_per_request=hit_tokens,
        cold_replica_s=cold_s,
        cached_replica_s=cached_s,
        cache_discount=discount,
    )


@dataclass(frozen=True)
class ImageMeasurement:
    """A text-only and a text + image run of one shape, and the image cost per image token they imply."""

    text_replica_s: float
    image_replica_s: float
    image_tokens_per_request: float
    image_mu_per_token: float | None
    alpha_mu_per_token: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "text_replica_s": self.text_replica_s,
            "image_replica_s": self.image_replica_s,
            "image_tokens_per_request": self.image_tokens_per_request,
            "image_mu_per_token": self.image_mu_per_token,
            "alpha_mu_per_token": self.alpha_mu_per_token,
            "method": "one shape without and with one image, saturated; extra replica s / image tokens",
        }


async def measure_image_cost(
    engine: str,
    model: str,
    calibration: Calibration,
    *,
    input_tokens: int = 256,
    output_tokens: int = 4,
    ladder: Sequence[int] = (4, 8),
    requests_per_worker: int = 4,
    min_requests: int = 16,
    api_key: str | None = None,
    extra_body: Mapping[str, Any] | None = None,
    busy_clock: Callable[[], float] | None = None,
) -> ImageMeasurement:
    """What one image token costs on a multimodal engine (``image_mu_per_token``), measured: the same text
    shape with and without one image part; the engine's ``prompt_tokens_details.image_tokens`` counts."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        probe = EngineProbe(
            session, engine, model, api_key=api_key, extra_body=extra_body, busy_clock=busy_clock
        )
        words = await probe.words_for(input_tokens)

        def run(shape: Shape) -> Awaitable[tuple[LevelResult, float]]:
            return _saturated(
                probe, shape, lambda: probe.image_tokens, ladder, requests_per_worker, min_requests
            )

        text, _ = await run(Shape(words, output_tokens))
        image, image_tokens = await run(Shape(words, output_tokens, images=1))
    text_s, image_s = 1.0 / text.throughput_rps, 1.0 / image.throughput_rps
    profile = calibration.profile
    rate = None
    if image_tokens >= 1.0:
        rate = image_cost_per_token(text_s, image_s, image_tokens, profile.capacity_mu_per_min)
    return ImageMeasurement(text_s, image_s, image_tokens, rate, profile.alpha)


async def measure_terms(
    engine: str,
    model: str,
    calibration: Calibration,
    *,
    cache: bool,
    images: bool,
    **probe: Any,
) -> tuple[Calibration, dict[str, Any] | None, dict[str, Any] | None]:
    """Measure the asked-for terms and put them in the calibration's profile (a term the engine gives no
    evidence for, no cache hits or no image tokens, keeps the shipped value)."""
    cache_doc = image_doc = None
    profile = calibration.profile
    if cache:
        measured = await measure_prefix_cache(engine, model, calibration, **probe)
        cache_doc = measured.as_dict()
        if measured.cache_discount is not None:
            profile = replace(profile, cache_discount=measured.cache_discount)
    if images:
        img = await measure_image_cost(engine, model, calibration, **probe)
        image_doc = img.as_dict()
        if img.image_mu_per_token is not None:
            profile = replace(profile, image_mu_per_token=img.image_mu_per_token)
    return replace(calibration, profile=profile), cache_doc, image_doc
