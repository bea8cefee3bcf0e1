"""Informational routes: model listing and lookup (OpenAI), ``/health`` and ``/version`` (as engines serve).

Why: clients and tools probe these before a run: guidellm checks ``GET /health``, the openai SDK's
``models.retrieve`` reads ``GET /v1/models/{model}``, vLLM-style tooling reads ``GET /version``. With tenants
configured the model routes need a valid key (``gateway.models_require_key``), as OpenAI's do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson
from aiohttp import web

from fleetgate import __version__
from fleetgate.core.errors import NotFoundError, ServiceUnavailableError


def add_info_routes(
    app: web.Application,
    *,
    models: Callable[[], Iterable[str]],
    created: int,
    authenticate: Callable[[str | None], Any],
    models_require_key: bool,
    draining: Callable[[], bool],
) -> None:
    """``GET /v1/models``, ``GET /v1/models/{model}``, ``GET /health``, ``GET /version``."""

    def model_object(model: str) -> dict[str, Any]:
        return {"id": model, "object": "model", "created": created, "owned_by": "fleetgate"}

    def check_key(request: web.Request) -> None:
        if models_require_key:
            authenticate(request.headers.get("Authorization"))  # raises AuthenticationError (401)

    async def list_models(request: web.Request) -> web.Response:
        check_key(request)
        data = [model_object(m) for m in models()]
        return _json({"object": "list", "data": data})

    async def retrieve_model(request: web.Request) -> web.Response:
        check_key(request)
        model = request.match_info["model"]
        if model not in set(models()):
            raise NotFoundError(f"The model `{model}` does not exist.", param="model")
        return _json(model_object(model))

    async def health(request: web.Request) -> web.Response:
        # Like an engine's /health: 200 while this process serves, 503 once it drains.
        if draining():
            raise ServiceUnavailableError("The gateway is shutting down.", retry_after_s=1.0)
        return _json({"status": "ok"})

    async def version(request: web.Request) -> web.Response:
        return _json({"version": __version__, "name": "fleetgate"})

    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", retrieve_model)  # model names may contain '/'
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)


def _json(body: Any) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json")
