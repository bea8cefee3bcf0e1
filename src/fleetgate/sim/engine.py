"""Per-replica engine models for the simulator: ``simengine.perfmodel`` parameterised from a cost profile.

The GPU profiles in ``fleetgate/profiles`` (fitted to Splitwise measurements) carry a ``perf`` block with the
step-time coefficients; they map onto ``PerfParams`` as follows:

- ``decode_step_base_s``            -> ``step_overhead_s`` (fixed cost of one iteration)
- ``decode_step_per_seq_s``         -> ``decode_s_per_seq``
- ``decode_step_per_kilotoken_s``   -> ``decode_s_per_kv_token`` (/ 1000)
- ``prefill_s_per_token`` (+ ``prefill_s_per_token2``) -> ``prefill_s_per_token`` (+ ``_sq``)
- ``max_batch``                     -> ``max_num_seqs``

KV capacity is not in the Splitwise data; it defaults to ``kv_tokens_per_gpu`` (100,000 tokens, roughly
what a 70B model with GQA leaves per 80 GB GPU after weights at tensor parallel 4) times the profile's
``gpus``
unless the profile's perf block or ``overrides`` set ``kv_capacity_tokens``. The prefix cache holds as many
trace blocks as the KV cache holds tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fleetgate.core.units import CostProfile
from fleetgate.sim.entities import EngineModel
from fleetgate.sim.speed import SpeedVariation, SpeedVaryingEngine
from fleetgate.simengine.perfmodel import EngineModel as PerfEngine
from fleetgate.simengine.perfmodel import PerfParams

KV_TOKENS_PER_GPU = 100_000


def perf_params_from_profile(
    profile: CostProfile, *, hash_block_tokens: int = 16, overrides: Mapping[str, Any] | None = None
) -> PerfParams:
    """Engine parameters for one replica described by ``profile`` (see the module docstring)."""
    perf = dict(profile.perf or {})
    kw: dict[str, Any] = {}
    if "decode_step_base_s" in perf:
        kw["step_overhead_s"] = float(perf["decode_step_base_s"])
    if "decode_step_per_seq_s" in perf:
        kw["decode_s_per_seq"] = float(perf["decode_step_per_seq_s"])
    if "decode_step_per_kilotoken_s" in perf:
        kw["decode_s_per_kv_token"] = float(perf["decode_step_per_kilotoken_s"]) / 1000.0
    if "prefill_s_per_token" in perf:
        kw["prefill_s_per_token"] = float(perf["prefill_s_per_token"])
    if perf.get("prefill_s_per_token2"):
        kw["prefill_s_per_token_sq"] = float(perf["prefill_s_per_token2"])
    if "max_batch" in perf:
        kw["max_num_seqs"] = int(perf["max_batch"])
    kv = int(perf.get("kv_capacity_tokens") or KV_TOKENS_PER_GPU * int(perf.get("gpus", 1) or 1))
    kw["kv_capacity_tokens"] = kv
    kw["max_model_len"] = kv
    kw["prefix_cache_blocks"] = max(0, kv // max(1, hash_block_tokens))
    kw.update(dict(overrides or {}))
    return PerfParams.from_mapping(kw)


def engine_factory(
    profile: CostProfile,
    *,
    hash_block_tokens: int = 16,
    overrides: Mapping[str, Any] | None = None,
    speed: SpeedVariation | None = None,
) -> Callable[[str], EngineModel]:
    """A factory of fresh engine models (one per replica name) for ``sim.des.Simulator``; ``speed``: replicas
    whose speed differs or wanders (``sim.speed``), else every replica is the same engine."""
    params = perf_params_from_profile(profile, hash_block_tokens=hash_block_tokens, overrides=overrides)

    def make(name: str) -> EngineModel:
        # (the simulator reads first tokens and finishes only: no per-token emission tracking)
        engine = PerfEngine(params, track_emitted=False)
        if speed is not None and speed.active:
            return SpeedVaryingEngine(engine, speed, name)
        return engine

    return make
