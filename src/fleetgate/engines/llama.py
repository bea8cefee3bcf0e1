"""Run llama.cpp's native ``llama-server`` as a local replica: command-line builder and process lifecycle.

The binary is built from the ``vendor/llama.cpp`` folder of the llama-cpp-python source package
(``make llama-server``) and the model is the project's tiny random-weight Llama (``make tiny-model``); both
are cached under ``~/.cache/fleetgate``. The process itself is a ``providers.local.process.EngineProcess``
(shared with the vLLM CPU launcher): start a command, wait for ``/health``, freeze/thaw it with
SIGSTOP/SIGCONT (hang drills), stop or restart it on the same port.

Random weights rarely emit end-of-sequence, so clients that need exact output lengths send ``max_tokens`` with
``"ignore_eos": true`` (llama-server accepts it in the request body and turns it into a -inf logit bias on the
end-of-generation tokens); ``LlamaServerConfig.ignore_eos`` sets the same for every request.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Process handling lives once, in providers.local.process; re-exported for the launchers, tests and benches.
from fleetgate.providers.local.process import EngineProcess, descendant_pids, free_port

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
CACHE_ENV = "FLEETGATE_CACHE"
BINARY_ENV = "FLEETGATE_LLAMA_SERVER"
GGUF_ENV = "FLEETGATE_TINY_GGUF"
HF_MODEL_ENV = "FLEETGATE_TINY_HF"
DEFAULT_ALIAS = "tiny-llama"


def cache_dir() -> Path:
    """Root of fleetgate's build caches (outside the repository; ``make`` targets rebuild them)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "fleetgate")


def default_binary() -> Path:
    """Where ``scripts/build_llama_server.sh`` puts llama-server (``$FLEETGATE_LLAMA_SERVER`` overrides)."""
    env = os.environ.get(BINARY_ENV)
    if env:
        return Path(env)
    return cache_dir() / "llama.cpp" / LLAMA_CPP_PYTHON_VERSION / "bin" / "llama-server"


def default_gguf() -> Path:
    """Where ``scripts/build_tiny_model.sh`` puts the tiny model's GGUF (``$FLEETGATE_TINY_GGUF``
    overrides)."""
    env = os.environ.get(GGUF_ENV)
    if env:
        return Path(env)
    return cache_dir() / "models" / "tiny-llama" / "tiny-llama-f32.gguf"


def default_hf_model() -> Path:
    """The tiny model's Hugging Face folder (what vLLM serves); ``$FLEETGATE_TINY_HF`` overrides."""
    env = os.environ.get(HF_MODEL_ENV)
    if env:
        return Path(env)
    return cache_dir() / "models" / "tiny-llama" / "hf"


def missing_llama_parts() -> list[str]:
    """Human-readable list of what is not built yet (empty when llama-server can run)."""
    missing = []
    if not os.access(default_binary(), os.X_OK):
        missing.append(f"llama-server binary {default_binary()} (run `make llama-server`)")
    if not default_gguf().is_file():
        missing.append(f"tiny model {default_gguf()} (run `make tiny-model`)")
    return missing


@dataclass(frozen=True)
class LlamaServerConfig:
    """Flags for one llama-server replica. ``ctx_size`` is the total KV context shared by the ``parallel``
    slots (llama.cpp splits it evenly unless the KV cache is unified)."""

    port: int
    model: Path = field(default_factory=default_gguf)
    binary: Path = field(default_factory=default_binary)
    host: str = "127.0.0.1"
    parallel: int = 2
    ctx_size: int = 4096
    threads: int = 1
    batch_size: int = 512
    alias: str = DEFAULT_ALIAS
    ignore_eos: bool = False
    seed: int = 0
    extra_args: tuple[str, ...] = ()


def build_llama_command(cfg: LlamaServerConfig) -> list[str]:
    """The llama-server argv for ``cfg``: metrics on, fixed slots and threads, no web UI, local host only."""
    cmd = [
        str(cfg.binary),
        "--model",
        str(cfg.model),
        "--alias",
        cfg.alias,
        "--host",
        cfg.host,
        "--port",
        str(cfg.port),
        "--parallel",
        str(cfg.parallel),
        "--ctx-size",
        str(cfg.ctx_size),
        "--threads",
        str(cfg.threads),
        "--threads-batch",
        str(cfg.threads),
        "--batch-size",
        str(cfg.batch_size),
        "--seed",
        str(cfg.seed),
        "--metrics",
        "--no-webui",
        "--cont-batching",
    ]
    if cfg.ignore_eos:
        cmd.append("--ignore-eos")
    cmd.extend(cfg.extra_args)
    return cmd


def llama_command_template(**kwargs: object) -> list[str]:
    """The llama-server argv with ``{port}`` and ``{model}`` placeholders, for ``local.command`` in a
    fleetgate config (``fleetgate up`` fills them in per replica). ``kwargs`` go to ``LlamaServerConfig``."""
    cmd = build_llama_command(LlamaServerConfig(port=0, **kwargs))  # type: ignore[arg-type]
    cmd[cmd.index("--port") + 1] = "{port}"
    cmd[cmd.index("--alias") + 1] = "{model}"
    return cmd


def llama_server(cfg: LlamaServerConfig, *, log_path: Path | None = None) -> EngineProcess:
    """An (unstarted) ``EngineProcess`` for a llama-server replica."""
    return EngineProcess(
        build_llama_command(cfg),
        host=cfg.host,
        port=cfg.port,
        health_path="/health",
        log_path=log_path,
        name=f"llama-server:{cfg.port}",
    )


def start_llama_replicas(
    n: int,
    *,
    ports: Sequence[int] | None = None,
    log_dir: Path | None = None,
    timeout: float = 60.0,
    **kwargs: object,
) -> list[EngineProcess]:
    """Start ``n`` llama-server replicas side by side and wait until all are healthy.

    ``kwargs`` go to ``LlamaServerConfig`` (parallel, ctx_size, threads, alias, ...). On failure every replica
    already started is stopped before the error propagates.
    """
    ports = list(ports) if ports is not None else [free_port() for _ in range(n)]
    procs: list[EngineProcess] = []
    try:
        for port in ports[:n]:
            cfg = LlamaServerConfig(port=port, **kwargs)  # type: ignore[arg-type]
            log = log_dir / f"llama-server-{port}.log" if log_dir is not None else None
            proc = llama_server(cfg, log_path=log)
            proc.start()
            procs.append(proc)
        for proc in procs:
            proc.wait_ready(timeout=timeout)
    except BaseException:
        for proc in procs:
            proc.stop()
        raise
    return procs


__all__ = [
    "EngineProcess",
    "LlamaServerConfig",
    "build_llama_command",
    "descendant_pids",
    "free_port",
    "llama_command_template",
    "llama_server",
    "start_llama_replicas",
]
