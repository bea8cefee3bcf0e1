"""The aiohttp application: OpenAI routes, health, readiness and metrics. Built from injected parts only."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aiohttp import web

from fleetgate.core.errors import ServiceUnavailableError
from fleetgate.gateway.cors import add_cors
from fleetgate.gateway.errors import (
    REQUEST_ID,
    draining_error,
    error_middleware,
    error_response,
)
from fleetgate.gateway.exposition import render_metrics
from fleetgate.gateway.fleet import Fleet
from fleetgate.gateway.info import add_info_routes
from fleetgate.gateway.metrics import GatewayMetrics
from fleetgate.gateway.openapi import add_openapi_route
from fleetgate.gateway.proxy import Proxy


def create_app(
    *,
    proxy: Proxy,
    fleet: Fleet,
    metrics: GatewayMetrics,
    max_body_bytes: int,
    created: int,
    ready: Callable[[], bool] = lambda: True,
    models_require_key: bool = True,
    cors_allowed_origins: Sequence[str] = (),
    metrics_access: Callable[[str | None], None] | None = None,
) -> web.Application:
    """The gateway app. ``ready`` says whether the process accepts traffic (False while draining).
    ``metrics_access`` checks the ``Authorization`` header of ``GET /metrics`` (raises a 401/403 error;
    none: open): the metrics name every tenant, its reservation, usage and latency."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[error_middleware])
    add_cors(app, cors_allowed_origins)

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(body=b'{"status":"ok"}', content_type="application/json")

    async def readyz(request: web.Request) -> web.Response:
        if not ready() or proxy.shutting_down:
            return error_response(draining_error(), request[REQUEST_ID])
        missing = [d.model for d in fleet.deployments.values() if not d.routable()]
        if missing:
            err = ServiceUnavailableError(f"no routable replica for: {', '.join(missing)}", retry_after_s=1.0)
            return error_response(err, request[REQUEST_ID])
        return web.Response(body=b'{"status":"ready"}', content_type="application/json")

    async def prometheus(request: web.Request) -> web.Response:
        if metrics_access is not None:
            metrics_access(request.headers.get("Authorization"))
        return _exposition(metrics, request)

    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        # (one hook for both: each hook is a coroutine per response)
        # Whatever an engine answers (text/html included) is never rendered as this origin's page (/ui).
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        # While draining, each response closes its keep-alive connection (clients reconnect elsewhere).
        if proxy.shutting_down:
            response.force_close()  # the connection closes after this response ...
            response.headers["Connection"] = "close"  # ... and the client is told (headers already built)

    app.on_response_prepare.append(on_prepare)
    app.router.add_post("/v1/chat/completions", proxy.chat)
    app.router.add_post("/v1/completions", proxy.completions)
    add_info_routes(  # /v1/models, /v1/models/{model}, /health, /version
        app,
        models=lambda: fleet.deployments,
        created=created,
        authenticate=proxy.admission.authenticate,
        models_require_key=models_require_key,
        draining=lambda: not ready() or proxy.shutting_down,
    )
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", prometheus)
    add_openapi_route(app, lambda: fleet.deployments)  # GET /openapi.json (fleetgate.gateway.openapi)
    return app


def _exposition(metrics: GatewayMetrics, request: web.Request) -> web.Response:
    body, content_type = render_metrics(metrics.registry, request.headers.get("Accept"))
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = content_type
    return resp


def create_metrics_app(metrics: GatewayMetrics) -> web.Application:
    """``GET /metrics`` alone, without a key: for a separate listen address that only Prometheus reaches."""
    app = web.Application(middlewares=[error_middleware])

    async def prometheus(request: web.Request) -> web.Response:
        return _exposition(metrics, request)

    app.router.add_get("/metrics", prometheus)
    return app
