"""``fleetgate simulate``: the fleet simulator on a trace; ``fleetgate simulate compare``: several policies.

Heavy imports happen inside the commands so ``fleetgate --help`` stays fast.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(no_args_is_help=False, invoke_without_command=True)

TraceOpt = Annotated[
    str | None,
    typer.Option(
        "--trace",
        help="Trace (Azure CSV, Mooncake JSONL, ServeGen rates) or synthetic:n=..,rate=..,groups=..",
    ),
]
FormatOpt = Annotated[str, typer.Option("--format", help="auto, azure, mooncake, servegen or synthetic.")]
ReplicasOpt = Annotated[int, typer.Option("--replicas", help="Replicas at start (and for static scaling).")]
ProfileOpt = Annotated[
    str, typer.Option("--profile", help="Cost/perf profile name (fleetgate/profiles) or JSON path.")
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of every random choice in the run.")]
RateOpt = Annotated[float, typer.Option("--rate-scale", help="Replay at X times the rate.")]
TimeOpt = Annotated[float, typer.Option("--time-scale", help="Multiply every timestamp by X.")]
TenantOpt = Annotated[str | None, typer.Option("--tenant", help="Replay one tenant's column (ServeGen).")]
LengthsOpt = Annotated[
    str | None,
    typer.Option("--lengths", help="Length source for rate tables: servegen, azure, mooncake, or a path."),
]
StartOpt = Annotated[float, typer.Option("--start-s", help="Skip the first seconds of the trace.")]
DurationOpt = Annotated[float | None, typer.Option("--duration-s", help="Simulate only this many seconds.")]
MaxReqOpt = Annotated[int | None, typer.Option("--max-requests", help="Stop after this many requests.")]
ModeOpt = Annotated[str, typer.Option("--mode", help="des (per request), fluid (time-stepped) or auto.")]
AutoscaleOpt = Annotated[
    str | None, typer.Option("--autoscale", help="static, kpa or fleetgate (default: fixed replicas).")
]
AutoscaleParamOpt = Annotated[
    list[str] | None, typer.Option("--autoscale-param", help="Autoscaler parameter key=value (repeatable).")
]
PolicyParamOpt = Annotated[
    list[str] | None, typer.Option("--policy-param", help="Routing policy parameter key=value (repeatable).")
]
EngineParamOpt = Annotated[
    list[str] | None,
    typer.Option("--engine-param", help="Engine PerfParams override key=value (repeatable)."),
]
StepOpt = Annotated[float, typer.Option("--step-s", help="Fluid mode time step (seconds).")]
ColdOpt = Annotated[float, typer.Option("--cold-start-s", help="Seconds before a new replica serves.")]
SloOpt = Annotated[float | None, typer.Option("--slo-ttft-p95", help="TTFT p95 SLO (s) for slo_attainment.")]
MinOpt = Annotated[int, typer.Option("--min-replicas", help="Lower bound applied to autoscaling.")]
MaxOpt = Annotated[int, typer.Option("--max-replicas", help="Upper bound applied to autoscaling.")]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Write the JSON summary here.")]
ReportOpt = Annotated[
    Path | None, typer.Option("--report", help="Write Markdown + PNG plots into this folder.")
]
ProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")]
ScenarioOpt = Annotated[
    Path | None,
    typer.Option(
        "--scenario", help="Capacity scenario YAML: one GPU pool, several deployments (docs/capacity.md)."
    ),
]
CapacityOpt = Annotated[
    str,
    typer.Option("--capacity", help="With --scenario: fleetgate (pool allocator), static or independent."),
]


def _options(**kw: Any) -> Any:
    from fleetgate.sim.runner import SimOptions, parse_params

    try:
        return SimOptions(
            trace=kw["trace"],
            fmt=kw["fmt"],
            policy=kw["policy"],
            policy_params=parse_params(kw["policy_param"]),
            replicas=kw["replicas"],
            profile=kw["profile"],
            seed=kw["seed"],
            rate_scale=kw["rate_scale"],
            time_scale=kw["time_scale"],
            tenant=kw["tenant"],
            lengths=kw["lengths"],
            start_s=kw["start_s"],
            duration_s=kw["duration_s"],
            max_requests=kw["max_requests"],
            mode=kw["mode"],
            autoscale=kw["autoscale"],
            autoscale_params=parse_params(kw["autoscale_param"]),
            cold_start_s=kw["cold_start_s"],
            slo_ttft_p95_s=kw["slo"],
            min_replicas=kw["min_replicas"],
            max_replicas=kw["max_replicas"],
            engine_params=parse_params(kw["engine_param"]),
            step_s=kw["step_s"],
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def _with_progress(enabled: bool, label: str, fn: Callable[[Callable[[int, int], None] | None], Any]) -> Any:
    if not enabled:
        return fn(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=True,
    ) as prog:
        task = prog.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total)

        return fn(update)


def _run_one(opts: Any, progress: bool) -> tuple[dict[str, Any], Any]:
    from fleetgate.sim.runner import run
    from fleetgate.sim.traces import TraceFormatError

    try:
        result: tuple[dict[str, Any], Any] = _with_progress(
            progress, f"{opts.policy}", lambda cb: run(opts, progress=cb)
        )
        return result
    except (FileNotFoundError, TraceFormatError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


@app.callback()
def simulate(
    ctx: typer.Context,
    trace: TraceOpt = None,
    fmt: FormatOpt = "auto",
    policy: Annotated[str, typer.Option("--policy", help="Routing policy name.")] = "fleetgate",
    replicas: ReplicasOpt = 16,
    profile: ProfileOpt = "llama2-70b-h100-tp4",
    seed: SeedOpt = 0,
    rate_scale: RateOpt = 1.0,
    time_scale: TimeOpt = 1.0,
    tenant: TenantOpt = None,
    lengths: LengthsOpt = None,
    start_s: StartOpt = 0.0,
    duration_s: DurationOpt = None,
    max_requests: MaxReqOpt = None,
    mode: ModeOpt = "auto",
    autoscale: AutoscaleOpt = None,
    autoscale_param: AutoscaleParamOpt = None,
    policy_param: PolicyParamOpt = None,
    engine_param: EngineParamOpt = None,
    step_s: StepOpt = 1.0,
    cold_start_s: ColdOpt = 180.0,
    slo: SloOpt = None,
    min_replicas: MinOpt = 0,
    max_replicas: MaxOpt = 1024,
    json_out: JsonOpt = None,
    report: ReportOpt = None,
    progress: ProgressOpt = True,
    scenario: ScenarioOpt = None,
    capacity: CapacityOpt = "fleetgate",
) -> None:
    """Simulate a fleet on a trace with one routing policy (and optionally an autoscaler); with --scenario,
    several deployments sharing one GPU pool (fluid mode) under --capacity."""
    if ctx.invoked_subcommand is not None:
        return
    if scenario is not None:
        _refuse_given(ctx, "with --scenario (the scenario file sets them)", _SCENARIO_OPTIONS)
        _run_capacity(scenario, capacity, json_out, progress)
        return
    if "capacity" in _given(ctx):
        typer.echo("error: --capacity needs --scenario", err=True)
        raise typer.Exit(2)
    if trace is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(2)
    from fleetgate.sim.runner import json_dumps

    _require_plots(report)
    opts = _options(
        **{k: v for k, v in locals().items() if k not in ("ctx", "json_out", "report", "progress")}
    )
    summary, result = _run_one(opts, progress)
    data = json_dumps(summary)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_bytes(data + b"\n")
    if report is not None:
        from fleetgate.sim.report import write_report

        name = summary.get("policy") or policy
        if autoscale:
            name = f"{name}/{autoscale}"
        write_report(report, {name: result}, {name: summary}, f"fleetgate simulate: {opts.trace}", _cmdline())
    typer.echo(data.decode())


@app.command("compare")
def compare(
    policies: Annotated[str, typer.Option("--policies", help="Comma-separated policy names.")] = (
        "random,round_robin,least_requests,p2c,cache_aware,fleetgate"
    ),
    trace: TraceOpt = None,
    fmt: FormatOpt = "auto",
    replicas: ReplicasOpt = 16,
    profile: ProfileOpt = "llama2-70b-h100-tp4",
    seed: SeedOpt = 0,
    rate_scale: RateOpt = 1.0,
    time_scale: TimeOpt = 1.0,
    tenant: TenantOpt = None,
    lengths: LengthsOpt = None,
    start_s: StartOpt = 0.0,
    duration_s: DurationOpt = None,
    max_requests: MaxReqOpt = None,
    mode: ModeOpt = "auto",
    autoscale: AutoscaleOpt = None,
    autoscale_param: AutoscaleParamOpt = None,
    engine_param: EngineParamOpt = None,
    step_s: StepOpt = 1.0,
    cold_start_s: ColdOpt = 180.0,
    slo: SloOpt = None,
    min_replicas: MinOpt = 0,
    max_replicas: MaxOpt = 1024,
    json_out: JsonOpt = None,
    report: ReportOpt = None,
    progress: ProgressOpt = True,
) -> None:
    """Run several routing policies on one trace and write one table (Markdown; JSON with --json)."""
    if trace is None:
        typer.echo("error: --trace is required", err=True)
        raise typer.Exit(2)
    import orjson

    from fleetgate.sim.report import markdown_table, write_report

    _require_plots(report)

    names = [p.strip() for p in policies.split(",") if p.strip()]
    summaries: dict[str, dict[str, Any]] = {}
    results: dict[str, Any] = {}
    base = {k: v for k, v in locals().items() if k not in ("policies", "json_out", "report", "progress")}
    for name in names:
        kw = {
            k: base[k]
            for k in base
            if k not in ("names", "summaries", "results", "orjson", "markdown_table", "write_report")
        }
        opts = _options(policy=name, policy_param=None, **kw)
        summaries[name], results[name] = _run_one(opts, progress)
    table = markdown_table(list(summaries.values()))
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        clean = {k: {kk: vv for kk, vv in v.items() if not kk.startswith("_")} for k, v in summaries.items()}
        json_out.write_bytes(orjson.dumps(clean, option=orjson.OPT_INDENT_2) + b"\n")
    if report is not None:
        write_report(report, results, summaries, f"fleetgate simulate compare: {trace}", _cmdline())
    typer.echo(table)


#: The ``simulate`` options that apply to ``--scenario``; any other one given with it is an error.
_SCENARIO_OPTIONS = frozenset({"scenario", "capacity", "json_out", "progress"})


def _given(ctx: typer.Context) -> dict[str, str]:
    """The options set on the command line or from the environment (not left at their default): parameter
    name -> its first flag. (Compared by name: typer ships its own copy of click's ``ParameterSource``.)"""
    out: dict[str, str] = {}
    for param in ctx.command.params:
        if param.name is None:
            continue
        source = ctx.get_parameter_source(param.name)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            out[param.name] = param.opts[0] if param.opts else param.name
    return out


def _refuse_given(ctx: typer.Context, why: str, allowed: frozenset[str]) -> None:
    """Exit 2 with one line naming the options given outside ``allowed``."""
    bad = [flag for name, flag in _given(ctx).items() if name not in allowed]
    if bad:
        typer.echo(f"error: {', '.join(bad)} cannot be used {why}", err=True)
        raise typer.Exit(2)


def _run_capacity(scenario: Path, capacity: str, json_out: Path | None, progress: bool) -> None:
    """``--scenario``: the capacity simulation (``sim.capacity``); its JSON to stdout and ``--json``."""
    from fleetgate.sim.capacity import run_scenario
    from fleetgate.sim.capacity_scenario import CAPACITY_MODES, ScenarioError, load_scenario
    from fleetgate.sim.runner import json_dumps

    if capacity not in CAPACITY_MODES:
        typer.echo(f"error: --capacity {capacity!r}: one of {', '.join(CAPACITY_MODES)}", err=True)
        raise typer.Exit(2)
    try:
        sc = load_scenario(scenario)
        summary = _with_progress(
            progress,
            capacity,
            lambda cb: run_scenario(sc, capacity, scenario_dir=scenario.parent, progress=cb),
        )
    except (ScenarioError, FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    data = json_dumps(summary)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_bytes(data + b"\n")
    typer.echo(data.decode())


def _cmdline() -> str:
    return "fleetgate simulate " + " ".join(shlex.quote(a) for a in sys.argv[2:])


def _require_plots(report: Path | None) -> None:
    """``--report`` draws PNGs: without the ``plots`` extra, say so before the run, in one line."""
    if report is None:
        return
    from fleetgate.plots import PlotsUnavailableError, require

    try:
        require()
    except PlotsUnavailableError as exc:
        typer.echo(f"error: --report: {exc}", err=True)
        raise typer.Exit(2) from exc
