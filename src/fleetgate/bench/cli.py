"""``fleetgate bench``: load generation and trace replay against live OpenAI-compatible endpoints."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(no_args_is_help=True)


def _fmt_ms(v: Any) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


@app.command()
def replay(
    trace: Annotated[Path, typer.Option(help="Trace file: Mooncake JSONL (hash_ids) or Azure CSV.")],
    gateway: Annotated[str, typer.Option(help="Base URL of any OpenAI-compatible endpoint.")],
    model: Annotated[str, typer.Option(help="Model name to request.")],
    time_scale: Annotated[float, typer.Option(help="Multiply trace timestamps (2 = half the rate).")] = 1.0,
    rate_scale: Annotated[float, typer.Option(help="Replay at this many times the trace's rate.")] = 1.0,
    tokens_scale: Annotated[
        float, typer.Option(help="Scale prompt lengths (a 512-token block -> 512*X words; 1/32 -> 16).")
    ] = 1.0 / 32.0,
    output_scale: Annotated[
        float | None, typer.Option(help="Scale output lengths (default: --tokens-scale).")
    ] = None,
    max_output_tokens: Annotated[int | None, typer.Option(help="Cap on max_tokens.")] = None,
    max_requests: Annotated[int | None, typer.Option(help="Replay only the first N requests.")] = None,
    start: Annotated[float, typer.Option(help="Skip the trace's first S seconds (before scaling).")] = 0.0,
    duration: Annotated[
        float | None, typer.Option(help="Replay only S seconds of (scaled) arrivals.")
    ] = None,
    concurrency_limit: Annotated[
        int | None, typer.Option(help="Most requests in flight (client queueing still counts in latency).")
    ] = None,
    metrics_url: Annotated[
        list[str] | None, typer.Option("--metrics-url", help="Engine /metrics URL (repeatable).")
    ] = None,
    router_metrics_url: Annotated[
        str | None, typer.Option(help="The router's /metrics (routing-latency histograms, if any).")
    ] = None,
    api: Annotated[str, typer.Option(help="chat or completions.")] = "chat",
    api_key: Annotated[str | None, typer.Option(help="Bearer token to send.")] = None,
    seed: Annotated[int, typer.Option(help="Prompt text seed.")] = 0,
    window: Annotated[float, typer.Option(help="Load-balance window in seconds.")] = 60.0,
    scrape_interval: Annotated[float, typer.Option(help="Seconds between /metrics scrapes.")] = 2.0,
    timeout: Annotated[float, typer.Option(help="Per-request timeout in seconds.")] = 600.0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the report as JSON here.")] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
) -> None:
    """Replay a trace open-loop (arrivals at their scaled times): latency, throughput, cache hits."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fleetgate.bench.prompts import PromptSynth
    from fleetgate.bench.replay import ReplayOptions, plan_requests, run_replay
    from fleetgate.sim.traces import MOONCAKE_BLOCK_TOKENS, load_trace, scale_trace

    if api not in ("chat", "completions"):
        raise typer.BadParameter("--api must be chat or completions")
    tr = load_trace(trace, start_s=start)
    tr = scale_trace(tr, time_scale=time_scale, rate_scale=rate_scale)
    if duration is not None:
        tr.requests = [r for r in tr.requests if r.arrival_s < duration]
    if max_requests is not None:
        tr.requests = tr.requests[:max_requests]
    if not tr.requests:
        typer.echo("no requests to replay", err=True)
        raise typer.Exit(1)
    synth = PromptSynth(tokens_scale=tokens_scale, source_block_tokens=MOONCAKE_BLOCK_TOKENS, seed=seed)
    planned = plan_requests(tr, synth, output_scale=output_scale, max_output_tokens=max_output_tokens)
    opts = ReplayOptions(
        base_url=gateway,
        model=model,
        api=api,
        metrics_urls=list(metrics_url or []),
        router_metrics_url=router_metrics_url,
        concurrency_limit=concurrency_limit,
        request_timeout_s=timeout,
        scrape_interval_s=scrape_interval,
        window_s=window,
        api_key=api_key,
    )
    console = Console(stderr=True)
    span = planned[-1].at_s
    console.print(f"replaying {len(planned)} requests over {span:.1f} s against {gateway}")
    with Progress(
        TextColumn("[bold]replay"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("sent {task.fields[sent]} errors {task.fields[errors]}"),
        TimeElapsedColumn(),
        console=console,
        disable=quiet,
    ) as progress:
        task = progress.add_task("replay", total=len(planned), sent=0, errors=0)

        def on_progress(sent: int, done: int, errors: int) -> None:
            progress.update(task, completed=done, sent=sent, errors=errors)

        report = asyncio.run(run_replay(planned, opts, on_progress=on_progress))
    report["config"] = {
        "trace": str(trace),
        "gateway": gateway,
        "model": model,
        "time_scale": time_scale,
        "rate_scale": rate_scale,
        "tokens_scale": tokens_scale,
        "output_scale": output_scale,
        "requests": len(planned),
        "span_s": span,
    }
    ttft, e2e = report["ttft_s"], report["e2e_s"]
    hit = report.get("prefix_cache_hit_rate")
    console.print(
        f"ok {report['ok']}/{report['requests']}  errors {report['errors']} {report['error_kinds'] or ''}\n"
        f"TTFT ms p50/p95/p99 {_fmt_ms(ttft['p50'])}/{_fmt_ms(ttft['p95'])}/{_fmt_ms(ttft['p99'])}  "
        f"e2e ms p50/p95/p99 {_fmt_ms(e2e['p50'])}/{_fmt_ms(e2e['p95'])}/{_fmt_ms(e2e['p99'])}\n"
        f"output tok/s {report['output_tokens_per_s']:.1f}  "
        f"prefix-cache hit rate {'-' if hit is None else f'{hit:.3f}'}  "
        f"max/mean replica load {report.get('load_max_over_mean_window') or '-'}"
    )
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2))
    else:
        typer.echo(json.dumps(report))
