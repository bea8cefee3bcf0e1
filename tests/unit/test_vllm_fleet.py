"""bench/vllm_fleet.py: the flags ``router_compare.py --engine vllm`` starts vLLM CPU replicas with, and the
cache size it tells fleetgate (what an operator knows from those flags)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from vllm_fleet import VLLM_MODEL, VllmFleet

from fleetgate.engines.vllm_cpu import build_vllm_command, vllm_env


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_replica_flags_bound_the_prefix_cache_in_blocks() -> None:
    fleet = VllmFleet(kv_blocks=512, block_size=64, max_num_seqs=4)
    cfg = fleet.config(18555)
    cmd = build_vllm_command(cfg)
    # the KV cache is sized in blocks, not by VLLM_CPU_KVCACHE_SPACE's whole GiB
    assert _flag(cmd, "--num-gpu-blocks-override") == "512"
    assert _flag(cmd, "--block-size") == "64"
    assert _flag(cmd, "--max-num-seqs") == "4"
    assert _flag(cmd, "--served-model-name") == VLLM_MODEL
    assert "--enable-prefix-caching" in cmd and _flag(cmd, "--scheduling-policy") == "priority"
    assert vllm_env(cfg)["OMP_NUM_THREADS"] == "1"
    assert fleet.cache_tokens() == 512 * 64


def test_default_block_size_is_one_the_cpu_backend_takes() -> None:
    # vLLM 0.32's CPU attention backend rejects block sizes that are not a multiple of 32 at start-up
    assert VllmFleet().block_size % 32 == 0
