"""The one place where errors become HTTP: OpenAI-shaped JSON bodies and SSE error events.

Everything the gateway rejects or fails on is a ``core.errors.FleetgateError``; this module turns it into
``{"error": {"message", "type", "param", "code"}}`` with the right status and headers (``Retry-After`` ...).
aiohttp's own HTTP exceptions (unknown path, wrong method, oversized body) and unexpected exceptions are
mapped onto the same tree first, so a client never sees an HTML or plain-text error.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from fleetgate.core.errors import (
    FleetgateError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    ServiceUnavailableError,
)
from fleetgate.core.sse import encode_event
from fleetgate.gateway.ratelimit import retry_after_headers

log = logging.getLogger("fleetgate.gateway")

REQUEST_ID_HEADER = "x-request-id"
REQUEST_ID: web.RequestKey[str] = web.RequestKey("request_id", str)
"""Where ``error_middleware`` keeps the request's id on the aiohttp request (a typed key)."""


class MethodNotAllowedError(InvalidRequestError):
    status = 405
    code = "method_not_allowed"


class RouteNotFoundError(NotFoundError):
    code = "not_found"


def error_headers(exc: FleetgateError) -> dict[str, str]:
    """Headers an error carries: its own plus ``Retry-After`` / ``retry-after-ms`` when it has a wait."""
    headers = dict(exc.headers)
    if isinstance(exc, RateLimitError | ServiceUnavailableError) and exc.retry_after_s is not None:
        for name, value in retry_after_headers(exc.retry_after_s).items():
            headers.setdefault(name, value)
    return headers


def error_response(exc: FleetgateError, request_id: str | None = None) -> web.Response:
    """The OpenAI-style JSON response for ``exc``."""
    headers = error_headers(exc)
    if request_id:
        headers[REQUEST_ID_HEADER] = request_id
    return web.Response(
        status=exc.status,
        body=orjson.dumps(exc.to_dict()),
        content_type="application/json",
        headers=headers,
    )


def sse_error_event(exc: FleetgateError) -> bytes:
    """In-stream error for failures after the first byte: ``data: {"error": {...}}``, then the end."""
    return encode_event(orjson.dumps(exc.to_dict()))


def from_http_exception(exc: web.HTTPException) -> FleetgateError:
    """aiohttp's routing/size errors expressed in the error tree."""
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return PayloadTooLargeError(f"Request body too large: {exc.text or ''}".strip())
    if isinstance(exc, web.HTTPNotFound):
        return RouteNotFoundError("Unknown path; see /v1/models, /v1/chat/completions, /v1/completions.")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        return MethodNotAllowedError(f"Method not allowed; use {allowed}.", headers={"Allow": allowed})
    if exc.status >= 500:
        return FleetgateError(exc.reason)
    err = InvalidRequestError(exc.reason)
    err.status = exc.status
    return err


def upstream_rejection(status: int, raw: bytes) -> FleetgateError | None:
    """An engine's 4xx (other than 408/429) means the request itself is bad: relay it, OpenAI-shaped.

    Returns ``None`` for statuses that say nothing against the request (5xx, 408, 429): those are retried.
    """
    if not 400 <= status < 500 or status in (408, 429):
        return None
    message = param = code = None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    err_obj = body.get("error") if isinstance(body, dict) else None
    if isinstance(err_obj, dict):
        message, param, code = err_obj.get("message"), err_obj.get("param"), err_obj.get("code")
    elif isinstance(body, dict):
        message = body.get("message") or body.get("detail")
    text = (
        message
        if isinstance(message, str) and message
        else f"The engine rejected the request (HTTP {status})."
    )
    err = InvalidRequestError(
        text, param=param if isinstance(param, str) else None, code=code if isinstance(code, str) else None
    )
    err.status = status
    return err


def malformed_request_response(status: int) -> web.Response:
    """The answer to a request aiohttp could not parse (or an error outside every handler): JSON, no echo
    of what was sent, connection closed."""
    if status >= 500:
        err = FleetgateError("Internal gateway error.")
    else:
        err = InvalidRequestError("Malformed HTTP request.", code="bad_http_request")
        err.status = status
    response = web.Response(
        status=err.status, body=orjson.dumps(err.to_dict()), content_type="application/json"
    )
    response.force_close()
    return response


def payload_too_large(limit: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(f"Request body exceeds the limit of {limit} bytes.", param="body")


def draining_error() -> ServiceUnavailableError:
    return ServiceUnavailableError("The gateway is shutting down.", retry_after_s=1.0)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The edge of every request: keeps a sane client ``x-request-id`` (else makes one) so logs, engines and
    the client agree; turns every error into the OpenAI shape; stamps the id on plain responses."""
    given = request.headers.get(REQUEST_ID_HEADER)
    request_id = given if given and _REQUEST_ID.match(given) else os.urandom(16).hex()
    request[REQUEST_ID] = request_id
    try:
        response = await handler(request)
    except FleetgateError as exc:
        response = error_response(exc, request_id)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = error_response(from_http_exception(exc), request_id)
    except Exception:
        log.exception("unexpected error handling %s %s", request.method, request.path)
        response = error_response(FleetgateError("Internal gateway error."), request_id)
    if not response.prepared:
        response.headers[REQUEST_ID_HEADER] = request_id
    return response
