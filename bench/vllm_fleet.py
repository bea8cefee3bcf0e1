"""vLLM CPU replicas of the tiny model for the live router comparison (``router_compare.py --engine vllm``):
the flags a deployment sets (automatic prefix caching, priority scheduling, a KV cache sized in blocks), each
replica pinned to its own CPU, fresh replicas (cold caches) for every contender.

Why one CPU per replica: vLLM's API server, engine core and worker wait for each other on a shared-memory
queue by spinning (``sched_yield``) for a second after every message, so replicas spread over shared cores
burn each other's time; pinned, a spinning process yields straight to the one it waits for (docs/
benchmarks.md, "Model units: capacity predicted vs measured (real vLLM CPU build, tiny model)"). Routers and
the client are not pinned: every contender runs on exactly the same layout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from live_procs import Proc, free_port, spawn, wait_http

from fleetgate.engines.llama import DEFAULT_ALIAS
from fleetgate.engines.vllm_cpu import VllmCpuConfig, build_vllm_command, missing_vllm_parts, vllm_env

VLLM_MODEL = DEFAULT_ALIAS  # the name VllmCpuConfig serves the tiny model under


@dataclass(frozen=True)
class VllmFleet:
    """How ``--engine vllm`` replicas run: vLLM's CPU build with the tiny model.

    ``kv_blocks`` of ``block_size`` tokens (``--num-gpu-blocks-override``; on the CPU backend the blocks live
    in host memory) bound each replica's prefix cache the way a real model's KV size bounds it on a GPU, so
    the replay's working set does not fit one replica and where a conversation's turns land decides the hit
    rate. ``block_size`` 32 is the smallest the CPU attention backend takes (it wants a multiple of 32;
    its default 128 would leave the scaled-down prompts few full blocks to share).
    """

    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    max_model_len: int = 8192
    block_size: int = 32
    kv_blocks: int = 1024
    threads: int = 1

    def config(self, port: int) -> VllmCpuConfig:
        extra = ("--block-size", str(self.block_size), "--num-gpu-blocks-override", str(self.kv_blocks))
        return VllmCpuConfig(
            port=port, max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            threads=self.threads, extra_args=extra,
        )  # fmt: skip

    def cache_tokens(self) -> int:
        """Prefix-cache capacity of one replica in tokens, as an operator knows it from the flags."""
        return self.kv_blocks * self.block_size


def start_vllm(fleet: VllmFleet, replicas: int, logdir: Path, tag: str) -> list[Proc]:
    """Fresh vLLM CPU replicas (cold prefix caches), replica ``i`` pinned to CPU ``i mod ncpu``, each ready
    on /health (allow a minute or two: the CPU build starts in 25-85 s here)."""
    missing = missing_vllm_parts()
    if missing:
        raise RuntimeError("vLLM CPU not built: " + "; ".join(missing))
    ncpu = os.cpu_count() or 1
    procs = []
    for i in range(replicas):
        port = free_port()
        cfg = fleet.config(port)
        proc = spawn(f"{tag}-vllm{i}", build_vllm_command(cfg), logdir, {i % ncpu}, env=vllm_env(cfg))
        proc.url = f"http://127.0.0.1:{port}"
        procs.append(proc)
    for proc in procs:
        assert proc.url is not None
        wait_http(proc.url + "/health", proc, timeout=300.0)
    return procs
