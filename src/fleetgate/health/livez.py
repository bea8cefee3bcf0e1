"""``/livez`` for Kubernetes sidecar mode: the engine container's liveness probe points here.

In sidecar mode the prober runs next to one engine in the same pod with remediation off
(``HealthPolicy(remediate=False)``): when the engine hangs, ``/livez`` answers 503 and the kubelet restarts
the engine container after the probe's ``failureThreshold``; the prober then sees it start again and
``/livez`` returns 200 once it has answered ``successes_to_healthy`` probes. ``/readyz`` mirrors routability
(healthy or suspect) for a readiness probe.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from fleetgate.core.health import HealthPolicy
from fleetgate.core.types import HealthState
from fleetgate.health.monitor import HealthMonitor

MONITOR_KEY: web.AppKey[HealthMonitor] = web.AppKey("fleetgate_health_monitor", HealthMonitor)


async def _livez(request: web.Request) -> web.Response:
    monitor = request.app[MONITOR_KEY]
    name = request.match_info.get("replica")
    status, body = monitor.livez(name)
    return web.json_response(body, status=status)


async def _readyz(request: web.Request) -> web.Response:
    monitor = request.app[MONITOR_KEY]
    name = request.match_info.get("replica")
    names = [name] if name else list(monitor.states())
    body = {n: monitor.state(n).value for n in names}
    ok = bool(names) and all(monitor.routable(n) for n in names)
    return web.json_response(body, status=200 if ok else 503)


def add_livez_routes(app: web.Application, monitor: HealthMonitor) -> None:
    """Add ``/livez``, ``/livez/{replica}``, ``/readyz``, ``/readyz/{replica}`` to an existing app."""
    app[MONITOR_KEY] = monitor
    app.router.add_get("/livez", _livez)
    app.router.add_get("/livez/{replica}", _livez)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/readyz/{replica}", _readyz)


def build_livez_app(monitor: HealthMonitor) -> web.Application:
    """A small app with the livez/readyz routes whose lifecycle starts and stops the monitor."""
    app = web.Application()
    add_livez_routes(app, monitor)

    async def lifecycle(_: web.Application):  # type: ignore[no-untyped-def]
        await monitor.start()
        yield
        await monitor.stop()

    app.cleanup_ctx.append(lifecycle)
    return app


async def run_sidecar(
    *,
    engine_url: str,
    model: str,
    host: str = "127.0.0.1",
    port: int = 8081,
    policy: HealthPolicy | None = None,
    probe_path: str = "/v1/completions",
) -> None:
    """Probe one engine and serve ``/livez`` until cancelled (remediation is left to the kubelet)."""
    pol = policy or HealthPolicy(remediate=False)
    monitor = HealthMonitor(
        model=model,
        policy=pol,
        initial_state=HealthState.STARTING,
        scrape_interval_s=2.0,
        probe_path=probe_path,
    )
    monitor.set_replicas({"engine": engine_url})
    runner = web.AppRunner(build_livez_app(monitor))
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        await asyncio.Event().wait()
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()
