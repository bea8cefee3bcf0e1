"""Command line: ``fleetgate up | serve | engine | calibrate | simulate | bench | validate-config``.

Each part owns its sub-command group in its own package (``simengine/cli.py``, ``sim/cli.py``,
``bench/cli.py``); heavy imports happen inside the commands so that ``fleetgate --help`` stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from fleetgate.bench.cli import app as bench_app
from fleetgate.health.cli import app as health_app
from fleetgate.sim.cli import app as simulate_app
from fleetgate.simengine.cli import app as engine_app

app = typer.Typer(
    name="fleetgate",
    help="A platform layer that makes LLM inference reliable at scale for many tenants.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(engine_app, name="engine", help="Run an inference engine replica (simulated or real).")
app.add_typer(simulate_app, name="simulate", help="Discrete-event / fluid fleet simulator on real traces.")
app.add_typer(bench_app, name="bench", help="Load generation and trace replay against live endpoints.")
app.add_typer(health_app, name="health", help="Health prober: sidecar /livez and one-shot probes.")


def _print_version(value: bool) -> None:
    if value:
        from fleetgate import __version__

        typer.echo(f"fleetgate {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """A platform layer that makes LLM inference reliable at scale for many tenants."""


def _load(config: Path | None, *, serving: bool = True, implied_models: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    """The validated config, or exit 2 with every problem on its own line (never a traceback).
    ``serving``: also what ``serve`` needs (something to serve, reservations for served models ...)."""
    from fleetgate.config import ConfigError, load_config
    from fleetgate.config_checks import serve_problems

    try:
        if config is not None and config.is_file() and not config.read_text().strip():
            raise ConfigError(f"{config}: the file is empty (expected a mapping with `deployments`)")
        cfg = load_config(config, os.environ)
        problems = serve_problems(cfg, implied_models) if serving else []
        if problems:
            raise ConfigError("\n".join(problems))
    except ConfigError as exc:
        typer.echo(f"invalid config: {config}\n{exc}", err=True)
        raise typer.Exit(2) from exc
    from fleetgate.control import local_section_warning

    warning = local_section_warning(cfg, implied_models[0] if implied_models else "fleetgate-sim")
    if warning is not None:
        typer.echo(warning, err=True)
    return cfg


def _start_failed(exc: BaseException) -> None:
    """A start-up error as one line (its message names the field), exit 2."""
    typer.echo(f"fleetgate: cannot start: {exc}", err=True)
    raise typer.Exit(2) from exc


@app.command("validate-config")
def validate_config(config: Annotated[Path, typer.Argument(help="YAML config file.")]) -> None:
    """Check a config file for `fleetgate serve` and print every problem found, each with its path."""
    cfg = _load(config)
    typer.echo(f"ok: {len(cfg.deployments)} deployment(s)")


@app.command()
def serve(config: Annotated[Path, typer.Option("--config", "-c", help="YAML config file.")]) -> None:
    """Run the gateway in front of the replicas named in the config."""
    from fleetgate.config import ConfigError
    from fleetgate.runtime import run_serve

    cfg = _load(config)
    try:
        run_serve(cfg)
    except (ConfigError, ValueError, OSError) as exc:
        _start_failed(exc)


@app.command()
def up(
    replicas: Annotated[
        int | None, typer.Option(help="Local replicas to start (default: the config's, else 2).")
    ] = None,
    port: Annotated[int, typer.Option(help="Gateway port.")] = 8080,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Optional YAML config.")] = None,
    model: Annotated[str, typer.Option(help="Model name the local replicas serve.")] = "fleetgate-sim",
) -> None:
    """Start the embedded default: `serve` with the model on local (simulated) engine replicas."""
    from fleetgate.config import ConfigError
    from fleetgate.runtime import run_up

    cfg = _load(config, implied_models=(model,))
    try:
        run_up(cfg, replicas=replicas, port=port, model=model)
    except (ConfigError, ValueError, OSError) as exc:
        _start_failed(exc)


@app.command()
def calibrate(
    engine: Annotated[str, typer.Option(help="Engine base URL, e.g. http://127.0.0.1:8001")],
    model: Annotated[str, typer.Option(help="Model name to request.")],
    out: Annotated[Path, typer.Option(help="Where to write the cost profile JSON.")],
    plot: Annotated[Path | None, typer.Option(help="PNG of predicted vs measured.")] = None,
    quick: Annotated[bool, typer.Option(help="A smaller sweep (for tests and demos).")] = False,
    engine_pid: Annotated[
        int | None, typer.Option(help="Local engine process: measure replica time as its CPU time.")
    ] = None,
    budget_s: Annotated[
        float | None,
        typer.Option(
            "--budget-s",
            min=1,
            help="Plan the sweep to about this many seconds (shapes spread over the design).",
        ),
    ] = None,
    images: Annotated[
        bool, typer.Option(help="Also measure what an image token costs (a multimodal engine).")
    ] = False,
    rounds: Annotated[
        int,
        typer.Option(
            min=1,
            help="Measure every shape in this many passes, alternating order (with --engine-pid, no "
            "--budget-s): on a host whose speed swings, each shape then samples all of the sweep.",
        ),
    ] = 1,
) -> None:
    """Fit a model-unit cost profile by a designed sweep against a live engine (progress lines with an ETA
    when stdout is not a terminal); the full sweep also measures the prefix-cache discount."""
    from fleetgate.engines.calibration import run_calibration

    run_calibration(
        engine=engine, model=model, out=out, plot=plot, quick=quick, engine_pid=engine_pid, budget_s=budget_s,
        images=images, rounds=rounds,
    )  # fmt: skip


def main() -> None:
    """Console entry point."""
    app()


if __name__ == "__main__":
    main()
