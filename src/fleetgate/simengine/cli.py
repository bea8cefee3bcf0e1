"""``fleetgate engine ...``: run an engine replica. ``fleetgate engine sim`` is the simulated engine."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True)


@app.callback()
def _engine() -> None:
    """Run an inference engine replica (simulated or real)."""


@app.command("sim")
def sim(
    port: Annotated[
        int, typer.Option(help="Port to listen on (0 picks a free one; the ready line names it).")
    ] = 8000,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    model: Annotated[str, typer.Option(help="Model name served (requests must name it).")] = "fleetgate-sim",
    served_model_name: Annotated[
        list[str] | None, typer.Option("--served-model-name", help="Extra model names accepted (repeatable).")
    ] = None,
    profile: Annotated[
        Path | None,
        typer.Option(help="YAML performance profile (PerfParams fields, optionally under 'perf:')."),
    ] = None,
    time_scale: Annotated[
        float,
        typer.Option(help="Real seconds per model second: 1 = real time, 0.01 = 100x faster, 0 = instant."),
    ] = 1.0,
    fault: Annotated[
        str | None,
        typer.Option(help="Start with a fault: hang | crash[=S] | slow[=X] | error_rate[=P] | stall[=N]."),
    ] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="Most requests in a batch.")] = None,
    kv_capacity_tokens: Annotated[int | None, typer.Option(help="KV cache size in tokens.")] = None,
    block_tokens: Annotated[int | None, typer.Option(help="KV / prefix-cache block size in tokens.")] = None,
    max_num_batched_tokens: Annotated[
        int | None, typer.Option(help="Token budget per iteration (chunked prefill); 0 disables chunking.")
    ] = None,
    prefix_cache_blocks: Annotated[
        int | None, typer.Option(help="Prefix cache capacity in blocks (0 disables; default: KV size).")
    ] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Longest prompt + completion accepted.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for sampled EOS and error_rate faults.")] = 0,
    eos_probability: Annotated[
        float, typer.Option(help="Chance per output token of a sampled EOS (ignored with ignore_eos).")
    ] = 0.0,
    default_max_tokens: Annotated[
        int, typer.Option(help="Output length when a request sets no max_tokens.")
    ] = 256,
    image_tokens: Annotated[int, typer.Option(help="Prompt tokens charged per image part.")] = 576,
) -> None:
    """Run the OpenAI-compatible simulated engine; prints 'engine ready on http://HOST:PORT' when up."""
    from fleetgate.core.errors import InvalidRequestError
    from fleetgate.simengine.faults import NO_FAULT, parse_fault
    from fleetgate.simengine.perfmodel import PerfParams
    from fleetgate.simengine.server import SimEngineConfig, run

    try:
        params = PerfParams.from_yaml(profile) if profile is not None else PerfParams()
        overrides: dict[str, object] = {
            "max_num_seqs": max_num_seqs,
            "kv_capacity_tokens": kv_capacity_tokens,
            "block_tokens": block_tokens,
            "prefix_cache_blocks": prefix_cache_blocks,
            "max_model_len": max_model_len,
        }
        params = params.with_overrides(**overrides)
        if max_num_batched_tokens is not None:
            params = replace(params, max_num_batched_tokens=max_num_batched_tokens or None)
        active = parse_fault(fault) if fault else NO_FAULT
        config = SimEngineConfig(
            model=model,
            host=host,
            port=port,
            params=params,
            time_scale=time_scale,
            fault=active,
            seed=seed,
            eos_probability=eos_probability,
            default_max_tokens=default_max_tokens,
            image_tokens=image_tokens,
            served_model_names=tuple(served_model_name or ()),
        )
    except (ValueError, OSError, InvalidRequestError) as exc:
        typer.echo(f"invalid engine settings: {exc}", err=True)
        raise typer.Exit(2) from exc
    run(config)


def _mount_real_engines() -> None:
    """``fleetgate engine llama`` and ``fleetgate engine vllm`` live in engines/realcli.py."""
    from fleetgate.engines.realcli import llama, vllm

    app.command("llama")(llama)
    app.command("vllm")(vllm)


_mount_real_engines()
