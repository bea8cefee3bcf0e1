"""``fleetgate health ...``: the prober as a Kubernetes sidecar, and a one-shot probe for debugging."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True)


@app.command()
def sidecar(
    engine: Annotated[
        str, typer.Option(help="Engine base URL next to this sidecar, e.g. http://127.0.0.1:8000")
    ],
    model: Annotated[str, typer.Option(help="Model name to send in probes.")],
    host: Annotated[str, typer.Option(help="Listen address for /livez.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port for /livez.")] = 8081,
    probe_path: Annotated[str, typer.Option(help="Probe endpoint on the engine.")] = "/v1/completions",
) -> None:
    """Probe one engine and serve /livez (503 once it hangs) for the engine container's liveness probe."""
    import asyncio
    import logging

    from fleetgate.core.health import HealthPolicy
    from fleetgate.health.livez import run_sidecar

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        asyncio.run(
            run_sidecar(
                engine_url=engine,
                model=model,
                host=host,
                port=port,
                policy=HealthPolicy(remediate=False),
                probe_path=probe_path,
            )
        )
    except KeyboardInterrupt:
        pass


@app.command()
def probe(
    engine: Annotated[str, typer.Option(help="Engine base URL, e.g. http://127.0.0.1:8000")],
    model: Annotated[str, typer.Option(help="Model name to send.")],
    probe_path: Annotated[str, typer.Option(help="Probe endpoint on the engine.")] = "/v1/completions",
) -> None:
    """Send one health probe (1 output token, highest priority) and print the result."""
    import asyncio

    from fleetgate.health.monitor import HealthMonitor

    async def once() -> tuple[bool, float, str]:
        mon = HealthMonitor(model=model, probe_path=probe_path)
        mon.set_replicas({"engine": engine})
        try:
            res = await mon.probe("engine")
            return res.ok, res.latency_s, res.error
        finally:
            await mon.stop()

    ok, latency, error = asyncio.run(once())
    typer.echo(
        f"{'ok' if ok else 'FAILED'} latency={latency * 1000:.1f}ms{(' error=' + error) if error else ''}"
    )
    raise typer.Exit(0 if ok else 1)
