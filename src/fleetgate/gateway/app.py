"""The aiohttp application: OpenAI routes, health, readiness and metrics. Built from injected parts only."""

from __future__ import annotations

from collections.abc import Callable

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from fleetgate.core.errors import ServiceUnavailableError
from fleetgate.gateway.errors import (
    draining_error,
    error_middleware,
    error_response,
)
from fleetgate.gateway.fleet import Fleet
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
) -> web.Application:
    """The gateway app. ``ready`` says whether the process accepts traffic (False while draining)."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[error_middleware])

    async def models(request: web.Request) -> web.Response:
        data = [
            {"id": model, "object": "model", "created": created, "owned_by": "fleetgate"}
            for model in fleet.deployments
        ]
        return web.Response(
            body=orjson.dumps({"object": "list", "data": data}), content_type="application/json"
        )

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(body=b'{"status":"ok"}', content_type="application/json")

    async def readyz(request: web.Request) -> web.Response:
        if not ready() or proxy.shutting_down:
            return error_response(draining_error(), request["request_id"])
        missing = [d.model for d in fleet.deployments.values() if not d.routable()]
        if missing:
            err = ServiceUnavailableError(f"no routable replica for: {', '.join(missing)}", retry_after_s=1.0)
            return error_response(err, request["request_id"])
        return web.Response(body=b'{"status":"ready"}', content_type="application/json")

    async def prometheus(request: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(metrics.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def close_when_draining(request: web.Request, response: web.StreamResponse) -> None:
        # While draining, each response closes its keep-alive connection (clients reconnect elsewhere).
        if proxy.shutting_down:
            response.force_close()  # the connection closes after this response ...
            response.headers["Connection"] = "close"  # ... and the client is told (headers already built)

    app.on_response_prepare.append(close_when_draining)
    app.router.add_post("/v1/chat/completions", proxy.chat)
    app.router.add_post("/v1/completions", proxy.completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", prometheus)
    add_openapi_route(app, lambda: fleet.deployments)  # GET /openapi.json (fleetgate.gateway.openapi)
    return app
