"""``fleetgate calibrate``: measure how much replica time each request shape consumes on a live engine.

Method (docs/model-units.md): for every (input, output) shape of a designed sweep, and for a few mixed runs
that interleave several shapes, a closed loop of ``c`` clients sends requests (prompts that share no prefix
with any other, so no prefix-cache hits; exact output lengths via ``max_tokens`` + ``ignore_eos``/
``min_tokens``), climbing a concurrency ladder until completed requests per second stop growing (the replica
is saturated). The saturated throughput gives the replica seconds one request consumes (``1 / req/s``, on
the wall clock or on the engine's own busy clock, e.g. its CPU time). ``core.calibrate`` fits the cost
profile (NNLS) on a random train split and reports R^2 and MAPE on the held-out measurements. Token counts
are taken from the engine's own ``usage`` (its tokenizer, its chat template), so any OpenAI-compatible
engine works."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from fleetgate.core.calibrate import (
    Calibration,
    Measurement,
    SweepPoint,
    default_design,
    fit_cost_profile,
    mixed_design,
)
from fleetgate.core.calibrate_plan import SweepPlan
from fleetgate.engines.calibration_cache import measure_terms
from fleetgate.engines.calibration_probe import (
    CalibrationError,
    EngineProbe,
    LevelResult,
    Shape,
    cycle_of,
    jittered,
    merge_levels,
    process_cpu_seconds,
    process_tree_cpu_seconds,
)

#: Prompt lengths at which the calibrated prefill rate is reported (it falls with length: attention).
PREFILL_REPORT_TOKENS = (128, 512, 2048)


@dataclass
class CalibrationRun:
    """Everything one calibration produced."""

    calibration: Calibration
    measurements: list[Measurement]
    ladders: list[dict[str, Any]]
    replica_clock: str = "wall"
    #: the measured prefix-cache and image terms (``engines.calibration_cache``), when measured
    cache: dict[str, Any] | None = None
    image: dict[str, Any] | None = None

    def to_json(self, engine: str, model: str, quick: bool) -> dict[str, Any]:
        cal = self.calibration
        data = cal.profile.to_dict()
        data.update(
            {
                "r2": cal.r2_holdout,
                "mape_holdout": cal.mape_holdout,
                "r2_train": cal.r2_train,
                "mape_train": cal.mape_train,
                "r2_all": cal.r2_all,
                "mape_all": cal.mape_all,
                "engine_url": engine,
                "requested_model": model,
                "quick": quick,
                "method": (
                    "closed-loop saturation per shape (and mixed runs); replica_seconds = busy s per"
                    " request or 1 / saturated req/s; NNLS weighted by 1/measured"
                ),
                "replica_clock": self.replica_clock,
                "prefill_tokens_per_s": {
                    str(n): cal.prefill_tokens_per_s([n]) for n in PREFILL_REPORT_TOKENS
                },
                "cache_measurement": self.cache,
                "image_measurement": self.image,
                "holdout_indices": cal.holdout,
                "measurements": [m.as_dict() for m in self.measurements],
                "ladders": self.ladders,
            }
        )
        return data


@dataclass
class _Swept:
    """A shape measured in the first pass: what later passes repeat, and its best rung merged so far."""

    point: SweepPoint
    cycle: list[Shape]
    per_worker: int
    least: int
    best: LevelResult


async def calibrate_engine(
    engine: str,
    model: str,
    *,
    design: Sequence[SweepPoint] | None = None,
    quick: bool = False,
    capacity_mu_per_min: float = 100.0,
    seed: int = 0,
    api_key: str | None = None,
    extra_body: Mapping[str, Any] | None = None,
    requests_per_worker: int | None = None,
    progress: bool = True,
    name: str | None = None,
    busy_clock: Callable[[], float] | None = None,
    min_requests: int = 8,
    min_busy_s: float = 1.0,
    jitter: float = 0.0,
    budget_s: float | None = None,
    progress_lines: bool | None = None,
    measure_cache: bool = False,
    measure_images: bool = False,
    rounds: int = 1,
) -> CalibrationRun:
    """Run the sweep against ``engine`` and fit the profile (see the module docstring).

    ``busy_clock`` (e.g. ``lambda: process_cpu_seconds(pid)`` for a local one-thread CPU engine) measures
    replica time on the replica's own busy seconds instead of the wall clock. ``budget_s``: plan the sweep
    to this many seconds (``core.calibrate_plan``). ``progress_lines``: one plain line per shape with an
    ETA instead of the live bar (default: when stdout is not a terminal, e.g. in CI or a log file).
    ``measure_cache`` / ``measure_images``: measure those cost terms too (``engines.calibration_cache``).
    ``rounds``: measure every shape in that many passes over the sweep, in alternating order (forward,
    reverse, ...), each later pass at the concurrency the first one found best, and merge a shape's passes
    (busy clock only). On a shared host whose speed swings during the sweep (this project's VMs: 1.7x
    within seconds) every shape then samples the host over the whole sweep rather than over its own few
    seconds, so the shapes' relative costs, which the fit separates into terms, are not skewed by when
    each ran.
    """
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    if rounds > 1 and (busy_clock is None or budget_s is not None):
        raise ValueError("rounds > 1 needs a busy clock and no budget (each pass measures every shape)")
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if design is not None:
        points = list(design)
    else:
        points = default_design(quick)
        if not quick:  # the full sweep also measures shapes interleaved (see docs/model-units.md)
            points += mixed_design(
                sorted({p.input_tokens for p in points}),
                sorted({p.output_tokens for p in points}),
                points[0].concurrencies,
                4,
                random.Random(seed + 1),
            )
    plan = SweepPlan.build(points, budget_s)
    lines = progress and (not sys.stdout.isatty() if progress_lines is None else progress_lines)
    started = time.monotonic()
    if lines:
        budget = f"; budget {budget_s:.0f} s" if budget_s is not None else ""
        print(f"calibrate: {len(plan.points)} shapes planned{budget}", flush=True)
    rpw = requests_per_worker if requests_per_worker is not None else (2 if quick else 6)
    pass_busy_s = min_busy_s / rounds if busy_clock is not None else 0.0  # a shape's passes add up to it
    measurements: list[Measurement] = []
    ladders: list[dict[str, Any]] = []
    swept: list[_Swept] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        probe = EngineProbe(
            session, engine, model, api_key=api_key, extra_body=extra_body, busy_clock=busy_clock
        )
        with Progress(
            TextColumn("[bold]calibrate[/] {task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} shapes"),
            TimeElapsedColumn(),
            disable=not progress or lines,
            transient=False,
        ) as bar:
            task = bar.add_task("words per token", total=len(points))
            words_cache: dict[int, int] = {}
            for point in plan.points:
                if not plan.should_start(point, time.monotonic() - started):
                    if lines:
                        print(
                            f"calibrate: budget reached: {plan.done} of {len(plan.points)} shapes measured",
                            flush=True,
                        )
                    break
                shape_t0 = time.monotonic()
                wanted = point.mix or ((point.input_tokens, point.output_tokens),)
                for inp, _ in wanted:
                    if inp not in words_cache:
                        words_cache[inp] = await probe.words_for(inp)
                cycle = [Shape(words_cache[i], o) for i, o in wanted]
                if jitter > 0 and not point.mix:
                    cycle = jittered(cycle[0], jitter)
                label = (
                    f"in={point.input_tokens} out={point.output_tokens}"
                    if not point.mix
                    else "mix " + "+".join(f"{i}x{o}" for i, o in point.mix)
                )
                bar.update(task, description=label)

                def show(level: LevelResult, label: str = label) -> None:
                    bar.update(
                        task, description=f"{label} c={level.concurrency} {level.throughput_rps:.2f} req/s"
                    )

                # a mixed run sends whole cycles of its shapes, so each is counted as often as it is sent
                least = -(-min_requests // len(cycle)) * len(cycle)
                per_worker = -(-rpw // len(cycle)) * len(cycle) if point.mix else rpw
                sat = await probe.saturate(
                    cycle_of(cycle),
                    point.concurrencies,
                    requests_per_worker=per_worker,
                    min_requests=least,
                    on_level=show,
                    min_busy_s=pass_busy_s,
                    cycle=len(cycle),
                )
                swept.append(_Swept(point, cycle, per_worker, least, sat.best))
                ladders.append(
                    {
                        "input_tokens": point.input_tokens,
                        "output_tokens": point.output_tokens,
                        "mix": [list(m) for m in point.mix],
                        "words": [c.words for c in cycle],
                        "levels": [lv.as_dict() for lv in sat.levels],
                    }
                )
                bar.advance(task)
                plan.finished(point, time.monotonic() - shape_t0)
                if lines:
                    elapsed = time.monotonic() - started
                    eta = plan.eta_s(elapsed)
                    best = sat.best
                    print(
                        f"calibrate: {plan.done}/{len(plan.points)} {label}: {best.throughput_rps:.2f} req/s "
                        f"at c={best.concurrency}; {elapsed:.0f} s elapsed, "
                        f"ETA {'?' if eta is None else f'{eta:.0f} s'}",
                        flush=True,
                    )
            for r in range(1, rounds):
                order = range(len(swept) - 1, -1, -1) if r % 2 else range(len(swept))
                for k in order:
                    done = swept[k]
                    again = await probe.saturate(
                        cycle_of(done.cycle),
                        [done.best.concurrency],
                        requests_per_worker=done.per_worker,
                        min_requests=done.least,
                        min_busy_s=pass_busy_s,
                        cycle=len(done.cycle),
                    )
                    done.best = merge_levels(done.best, again.best)
                    ladders[k].setdefault("rounds", []).append(again.best.as_dict())
                if lines:
                    print(f"calibrate: pass {r + 1}/{rounds} done", flush=True)
    for done in swept:
        best = done.best
        measurements.append(
            Measurement(
                input_tokens=round(best.mean_prompt_tokens),
                output_tokens=round(best.mean_completion_tokens),
                replica_seconds=1.0 / best.throughput_rps,
                concurrency=best.concurrency,
                requests=best.requests,
                throughput_rps=best.throughput_rps,
                latency_s=best.mean_latency_s,
                mix=tuple(best.usages) if done.point.mix or jitter > 0 else (),
            )
        )
    cal = fit_cost_profile(
        measurements,
        random.Random(seed),
        name=name or f"{model}-calibrated",
        model=model,
        engine=engine,
        capacity_mu_per_min=capacity_mu_per_min,
    )
    cal, cache, image = await measure_terms(
        engine, model, cal, cache=measure_cache, images=measure_images, api_key=api_key,
        extra_body=extra_body, busy_clock=busy_clock,
    )  # fmt: skip
    return CalibrationRun(
        calibration=cal,
        measurements=measurements,
        ladders=ladders,
        replica_clock="wall" if busy_clock is None else "busy (engine process CPU time)",
        cache=cache,
        image=image,
    )


def run_calibration(
    engine: str,
    model: str,
    out: Path,
    plot: Path | None,
    quick: bool,
    engine_pid: int | None = None,
    budget_s: float | None = None,
    images: bool = False,
    rounds: int = 1,
) -> None:
    """The ``fleetgate calibrate`` command: sweep, fit, write JSON (and PNG), print the fit quality.

    ``engine_pid``: a local engine process whose CPU time (with its children's) is the replica time (CPU
    engines on a shared machine); by default the wall clock. ``rounds``: passes per shape (needs
    ``engine_pid`` and no ``budget_s``; see ``calibrate_engine``).
    """
    import typer

    if rounds > 1 and (engine_pid is None or budget_s is not None):
        typer.echo("calibration failed: --rounds above 1 needs --engine-pid and no --budget-s", err=True)
        raise typer.Exit(2)

    if plot is not None:
        from fleetgate.plots import PlotsUnavailableError, require

        try:
            require()  # before the sweep, not after it
        except PlotsUnavailableError as exc:
            typer.echo(f"calibration failed: --plot: {exc}", err=True)
            raise typer.Exit(2) from exc
    clock: Callable[[], float] | None = None
    if engine_pid is not None:
        pid = engine_pid
        try:
            process_cpu_seconds(pid)
        except OSError as exc:
            typer.echo(f"calibration failed: cannot read CPU time of process {pid}: {exc}", err=True)
            raise typer.Exit(1) from exc

        def clock() -> float:
            return process_tree_cpu_seconds(pid)

    try:
        run = asyncio.run(
            calibrate_engine(
                engine,
                model,
                quick=quick,
                busy_clock=clock,
                jitter=0.0 if quick else 0.3,
                budget_s=budget_s,
                measure_cache=not quick,
                measure_images=images,
                rounds=rounds,
            )
        )
    except CalibrationError as exc:
        typer.echo(f"calibration failed: {exc}", err=True)
        raise typer.Exit(1) from exc
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(run.to_json(engine, model, quick), indent=2) + "\n")
    if plot is not None:
        from fleetgate.engines.calibration_plot import plot_calibration

        plot_calibration(run, plot, title=f"{model} @ {engine}")
    cal = run.calibration
    p = cal.profile
    typer.echo(
        f"alpha={p.alpha:.6g} beta={p.beta:.6g} gamma={p.gamma:.6g} delta={p.delta:.6g} "
        f"epsilon={p.epsilon:.6g} MU (capacity {p.capacity_mu_per_min:g} MU/min/replica)"
    )
    if run.cache is not None:
        typer.echo(
            f"prefix cache: {run.cache['cached_tokens_per_request']:.0f} cached tokens per request; "
            f"cache_discount={run.cache['cache_discount']} (shipped default 0.1)"
        )
    rates = [(n, cal.prefill_tokens_per_s([n])) for n in PREFILL_REPORT_TOKENS]
    typer.echo(
        "prefill tokens/s per replica: "
        + ", ".join(f"{r:.0f} at {n} tokens" for n, r in rates if r is not None)
    )
    typer.echo(
        f"fit: held-out R^2={cal.r2_holdout:.4f} MAPE={cal.mape_holdout:.2%} "
        f"(train R^2={cal.r2_train:.4f} MAPE={cal.mape_train:.2%}; {len(cal.train)} train / "
        f"{len(cal.holdout)} held-out shapes; profile refitted on all: MAPE={cal.mape_all:.2%}); wrote {out}"
    )
