"""Optional CORS (``gateway.cors_allowed_origins``), so browser playgrounds can call the gateway.

Preflight ``OPTIONS`` requests from an allowed origin are answered before routing (204 with the allowed
methods and the requested headers); every response to an allowed origin, streams included, carries
``Access-Control-Allow-Origin`` and exposes the headers clients read (request id, rate limits,
``Retry-After``). Requests from other origins get no CORS headers (the browser blocks them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

_EXPOSED = "x-request-id, retry-after, x-ratelimit-limit-requests, x-ratelimit-remaining-requests, " + (
    "x-ratelimit-reset-requests, x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, "
    "x-ratelimit-reset-tokens, x-ratelimit-limit-mu, x-ratelimit-remaining-mu, x-ratelimit-reset-mu"
)
_DEFAULT_HEADERS = "authorization, content-type, x-request-id"


def add_cors(app: web.Application, allowed_origins: Sequence[str]) -> None:
    """Answer preflights and add CORS headers for ``allowed_origins`` (``"*"``: any origin)."""
    if not allowed_origins:
        return
    allowed = set(allowed_origins)
    any_origin = "*" in allowed

    def allow(origin: str | None) -> str | None:
        if not origin:
            return None
        return origin if any_origin or origin in allowed else None

    @web.middleware
    async def preflight(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        origin = allow(request.headers.get("Origin"))
        if request.method == "OPTIONS" and origin and "Access-Control-Request-Method" in request.headers:
            headers = {
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": request.headers.get(
                    "Access-Control-Request-Headers", _DEFAULT_HEADERS
                ),
                "Access-Control-Max-Age": "600",
            }
            return web.Response(status=204, headers=headers)
        return await handler(request)

    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        origin = allow(request.headers.get("Origin"))
        if origin is None:
            return
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = _EXPOSED
        if not any_origin:
            response.headers["Vary"] = "Origin"

    app.middlewares.append(preflight)
    app.on_response_prepare.append(on_prepare)
