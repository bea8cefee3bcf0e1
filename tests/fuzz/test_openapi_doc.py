"""The OpenAPI document the gateway publishes at /openapi.json (the contract the API fuzzing runs against)."""

from __future__ import annotations

import orjson

from fleetgate.gateway.openapi import build_openapi


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        out = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        for value in node.values():
            out += _refs(value)
        return out
    if isinstance(node, list):
        return [r for item in node for r in _refs(item)]
    return []


def test_document_is_self_consistent_json() -> None:
    doc = build_openapi(models=["m1", "m2"], admin=True)
    orjson.dumps(doc)  # serialisable
    assert doc["openapi"].startswith("3.")
    schemas = doc["components"]["schemas"]
    for ref in _refs(doc):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, ref
    chat = schemas["ChatCompletionRequest"]["properties"]["model"]
    assert chat["enum"] == ["m1", "m2"]
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/admin/usage/{tenant}"} <= set(
        doc["paths"]
    )


def test_admin_paths_only_when_mounted() -> None:
    doc = build_openapi()
    assert not [p for p in doc["paths"] if p.startswith("/admin")]
    assert "enum" not in doc["components"]["schemas"]["CompletionRequest"]["properties"]["model"]
