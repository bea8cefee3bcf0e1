"""The gateway's OpenAPI 3.0 document, served at ``GET /openapi.json``.

Why: clients and API fuzzers (schemathesis in tests/fuzz) need a machine-readable contract. The document
describes what the gateway itself validates (``core.openai.parse_request``) and the OpenAI error shape it
answers with; fields the gateway forwards to the engine unchecked are allowed (``additionalProperties``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson
from aiohttp import web

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "string", "nullable": True},
            },
        }
    },
}

_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
}

_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool", "developer"]},
        "content": {
            "oneOf": [
                {"type": "string"},
                {"type": "array", "items": {"$ref": "#/components/schemas/TextPart"}},
            ]
        },
        "name": {"type": "string"},
    },
}

_COMMON_FIELDS: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "max_tokens": {"type": "integer", "minimum": 1},
    "n": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}]},
    "user": {"type": "string"},
    "seed": {"type": "integer"},
}

_CHAT_REQUEST = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        **_COMMON_FIELDS,
        "messages": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Message"}},
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "logprobs": {"type": "boolean"},
        "top_logprobs": {"type": "integer", "minimum": 0},
    },
}

_COMPLETION_REQUEST = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        **_COMMON_FIELDS,
        "prompt": {
            "oneOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}},
                {"type": "array", "items": {"type": "integer", "minimum": 0}},
            ]
        },
        "echo": {"type": "boolean"},
        "logprobs": {"type": "integer", "minimum": 0},
    },
}

_COMPLETION_RESPONSE = {
    "type": "object",
    "required": ["id", "object", "choices"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string"},
        "model": {"type": "string"},
        "choices": {"type": "array", "items": {"type": "object"}},
        "usage": {"type": "object"},
    },
}


def _json_body(ref: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): {"description": "OpenAI-style error", **_json_body("Error")} for s in statuses}


def _ok(description: str, ref: str | None = None, media: str = "application/json") -> dict[str, Any]:
    if ref is None:
        return {"200": {"description": description, "content": {media: {"schema": {"type": "string"}}}}}
    return {"200": {"description": description, **_json_body(ref)}}


def _completion_op(summary: str, request_ref: str) -> dict[str, Any]:
    ok = {
        "description": "A completion (JSON), or an SSE stream when `stream` is true",
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/CompletionResponse"}},
            "text/event-stream": {"schema": {"type": "string"}},
        },
    }
    return {
        "summary": summary,
        "security": [{"bearer": []}, {}],
        "requestBody": {"required": True, **_json_body(request_ref)},
        "responses": {"200": ok, **_errors(400, 401, 404, 413, 429, 502, 503, 504)},
    }


def _admin_op(summary: str, *, path_param: bool = False) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "security": [{"bearer": []}],
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {}}}}}
        | _errors(401, 403, 404),
    }
    if path_param:
        op["parameters"] = [
            {"name": "tenant", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
        ]
    return op


def build_openapi(
    *,
    title: str = "fleetgate gateway",
    version: str = "0",
    admin: bool = False,
    models: Sequence[str] = (),
) -> dict[str, Any]:
    """The OpenAPI 3.0.3 document of the gateway's routes (``admin``: include the admission admin API;
    ``models``: the served model names, listed as the ``model`` enum; any other name is a 404)."""
    schemas: dict[str, Any] = {
        "ChatCompletionRequest": _CHAT_REQUEST,
        "CompletionRequest": _COMPLETION_REQUEST,
    }
    if models:
        model = {"type": "string", "enum": list(models)}
        schemas = {
            name: {**schema, "properties": {**schema["properties"], "model": model}}
            for name, schema in schemas.items()
        }
    paths: dict[str, Any] = {
        "/v1/chat/completions": {"post": _completion_op("Chat completion (OpenAI)", "ChatCompletionRequest")},
        "/v1/completions": {"post": _completion_op("Text completion (OpenAI)", "CompletionRequest")},
        "/v1/models": {"get": {"summary": "Served models", "responses": _ok("Model list", "ModelList")}},
        "/v1/models/{model}": {
            "get": {
                "summary": "One served model (OpenAI models.retrieve)",
                "parameters": [
                    {
                        "name": "model",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "minLength": 1},
                    }
                ],
                "responses": {**_ok("Model", "Model"), **_errors(401, 404)},
            }
        },
        "/health": {"get": {"summary": "Health, as engines serve it", "responses": _ok("OK", "Status")}},
        "/version": {"get": {"summary": "Gateway version", "responses": _ok("Version", "Version")}},
        "/healthz": {"get": {"summary": "Liveness", "responses": _ok("Alive", "Status")}},
        "/readyz": {"get": {"summary": "Readiness", "responses": {**_ok("Ready", "Status"), **_errors(503)}}},
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": _ok("Text", media="text/plain")}},
    }
    if admin:
        paths["/admin/tenants"] = {"get": _admin_op("Every tenant's purchase (admin key)")}
        paths["/admin/usage"] = {"get": _admin_op("Usage (admin: all tenants; tenant: its own)")}
        paths["/admin/usage/{tenant}"] = {"get": _admin_op("One tenant's usage", path_param=True)}
        paths["/admin/capacity"] = {"get": _admin_op("Capacity, sold and unsold MU/min (admin key)")}
        reservations = {
            "get": _admin_op("A tenant's reservations (admin key)", path_param=True),
            "put": {
                **_admin_op("Set a tenant's reservations, MU/min per model (admin key)", path_param=True),
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "additionalProperties": {"type": "number", "minimum": 0},
                            }
                        }
                    },
                },
            },
            "delete": _admin_op("Drop all of a tenant's reservations (admin key)", path_param=True),
        }
        reservations["put"]["responses"] |= _errors(400, 409, 503)
        paths["/admin/tenants/{tenant}/reservations"] = reservations
    return {
        "openapi": "3.0.3",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": _ERROR,
                "TextPart": _TEXT_PART,
                "Message": _MESSAGE,
                **schemas,
                "CompletionResponse": _COMPLETION_RESPONSE,
                "ModelList": {
                    "type": "object",
                    "required": ["object", "data"],
                    "properties": {"object": {"type": "string"}, "data": {"type": "array"}},
                },
                "Status": {"type": "object", "properties": {"status": {"type": "string"}}},
                "Model": {
                    "type": "object",
                    "required": ["id", "object"],
                    "properties": {"id": {"type": "string"}, "object": {"type": "string"}},
                },
                "Version": {
                    "type": "object",
                    "required": ["version"],
                    "properties": {"version": {"type": "string"}},
                },
            },
        },
    }


def add_openapi_route(app: web.Application, models: Callable[[], Iterable[str]] = tuple) -> None:
    """Serve the document at ``GET /openapi.json`` (admin paths included when the app mounts them;
    ``models()`` gives the served model names at request time)."""

    async def handler(request: web.Request) -> web.Response:
        admin = any(
            r.resource is not None and r.resource.canonical == "/admin/tenants"
            for r in request.app.router.routes()
        )
        doc = build_openapi(admin=admin, models=sorted(models()))
        return web.Response(body=orjson.dumps(doc), content_type="application/json")

    app.router.add_get("/openapi.json", handler)
