"""Structured outputs of the simulated engine: tool calls and JSON that conforms to a schema.

Why: SDK and framework demos (``chat.completions.parse``, LangChain's ``with_structured_output`` and
``bind_tools``, litellm function calling) need an engine that answers ``tools`` with a well-formed call and
``response_format`` with valid JSON. Values are filler words and small numbers, deterministic per request
(``salt``), built from the subset of JSON Schema that such schemas use: ``type`` (also as a list),
``properties``, ``required``, ``items``, ``enum``, ``const``, ``anyOf``/``oneOf``/``allOf``, ``$ref`` into
``$defs``/``definitions``, string ``format``s and numeric/length/item bounds.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from fleetgate.core.errors import InvalidRequestError
from fleetgate.simengine.textgen import WORDS

_FORMATS = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "time": "00:00:00",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
}
_MAX_DEPTH = 8


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call the engine answers with."""

    id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True, slots=True)
class Structured:
    """What a request asks the output to be: a tool call (``tools`` + ``tool_choice``) or JSON
    (``response_format``). Both unset: free text."""

    tools: tuple[Mapping[str, Any], ...] = ()
    forced_tool: str | None = None  # a named tool_choice
    tool_required: bool = False
    tools_off: bool = False  # tool_choice "none"
    json_schema: Mapping[str, Any] | None = None
    json_object: bool = False


def parse_structured(body: Mapping[str, Any]) -> Structured:
    """Validate ``tools``, ``tool_choice`` and ``response_format``; a malformed one is a 400 naming it."""
    tools: list[Mapping[str, Any]] = []
    raw_tools = body.get("tools")
    if raw_tools is not None:
        if not isinstance(raw_tools, list):
            raise InvalidRequestError("'tools' must be an array", param="tools")
        for i, tool in enumerate(raw_tools):
            fn = tool.get("function") if isinstance(tool, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise InvalidRequestError(
                    f"'tools[{i}]' must be {{'type': 'function', 'function': {{'name': ...}}}}",
                    param=f"tools[{i}]",
                )
            params = fn.get("parameters")
            if params is not None and not isinstance(params, Mapping):
                raise InvalidRequestError(
                    f"'tools[{i}].function.parameters' must be an object", param=f"tools[{i}].function"
                )
            tools.append(fn)
    forced: str | None = None
    required = off = False
    choice = body.get("tool_choice")
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise InvalidRequestError(
                "'tool_choice' must be none, auto, required or an object", param="tool_choice"
            )
        off, required = choice == "none", choice == "required"
    elif isinstance(choice, Mapping):
        fn = choice.get("function")
        forced = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(forced, str) or forced not in {t["name"] for t in tools}:
            raise InvalidRequestError(
                "'tool_choice' names a function that is not in 'tools'", param="tool_choice"
            )
    elif choice is not None:
        raise InvalidRequestError("'tool_choice' must be a string or an object", param="tool_choice")
    if (required or forced) and not tools:
        raise InvalidRequestError("'tool_choice' requires 'tools'", param="tool_choice")
    schema: Mapping[str, Any] | None = None
    json_object = False
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, Mapping) else None
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, Mapping) else None
            if not isinstance(schema, Mapping):
                raise InvalidRequestError(
                    "'response_format.json_schema.schema' must be an object", param="response_format"
                )
        elif kind == "json_object":
            json_object = True
        elif kind != "text":
            raise InvalidRequestError(
                "'response_format.type' must be text, json_object or json_schema", param="response_format"
            )
    return Structured(tuple(tools), forced, required, off, schema, json_object)


def pick_tool(spec: Structured, messages: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The function to call, or ``None`` for a text answer. ``auto`` answers in text once the last
    message is a tool result (so agent loops end); otherwise it calls the tool whose name and description
    share most words with the last user message (the first tool on a tie)."""
    if not spec.tools or spec.tools_off:
        return None
    if spec.forced_tool is not None:
        return next(t for t in spec.tools if t["name"] == spec.forced_tool)
    if not spec.tool_required and messages and messages[-1].get("role") == "tool":
        return None
    words = set(_words(_last_user_text(messages)))
    best, best_score = spec.tools[0], 0
    for tool in spec.tools:
        described = f"{tool['name']} {tool.get('description') or ''}".replace("_", " ")
        score = len(words & set(_words(described)))
        if score > best_score:
            best, best_score = tool, score
    return best


def tool_call(tool: Mapping[str, Any], salt: int, call_id: str) -> ToolCall:
    params = tool.get("parameters") or {"type": "object", "properties": {}}
    args = value_for_schema(params, salt)
    return ToolCall(call_id, str(tool["name"]), orjson.dumps(args).decode())


def json_text(spec: Structured, salt: int) -> str | None:
    """The JSON answer ``response_format`` asks for, or ``None`` when it asks for none."""
    if spec.json_schema is not None:
        return orjson.dumps(value_for_schema(spec.json_schema, salt)).decode()
    if spec.json_object:
        return orjson.dumps({"text": _phrase(salt, 12)}).decode()
    return None


def value_for_schema(schema: Mapping[str, Any], salt: int) -> Any:
    """A value conforming to ``schema`` (the subset described in the module docstring)."""
    return _Gen(schema, salt).value(schema, "", 0)


class _Gen:
    def __init__(self, root: Mapping[str, Any], salt: int) -> None:
        self.root = root
        self.salt = salt

    def value(self, schema: Any, name: str, depth: int) -> Any:
        if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
            return None
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self.value(self._resolve(ref), name, depth + 1)
        if "const" in schema:
            return schema["const"]
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return enum[self._pick(name, len(enum))]
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                chosen = next((o for o in options if not _is_null(o)), options[0])
                return self.value(chosen, name, depth + 1)
        parts = schema.get("allOf")
        if isinstance(parts, list) and parts:
            merged: dict[str, Any] = {}
            for part in parts:
                resolved = (
                    self._resolve(part["$ref"]) if isinstance(part, Mapping) and "$ref" in part else part
                )
                if isinstance(resolved, Mapping):
                    merged = {**merged, **resolved}
            return self.value({**merged, **{k: v for k, v in schema.items() if k != "allOf"}}, name, depth)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
        if kind == "object":
            props = schema.get("properties")
            if not isinstance(props, Mapping):
                return {}
            return {key: self.value(sub, key, depth + 1) for key, sub in props.items()}
        if kind == "array":
            count = max(int(schema.get("minItems", 0)), min(int(schema.get("maxItems", 2)), 2))
            return [self.value(schema.get("items", {}), f"{name}{i}", depth + 1) for i in range(count)]
        if kind == "integer":
            return self._number(schema, name, integer=True)
        if kind == "number":
            return self._number(schema, name, integer=False)
        if kind == "boolean":
            return self._pick(name, 2) == 0
        if kind == "null":
            return None
        return self._string(schema, name)

    def _resolve(self, ref: str) -> Any:
        node: Any = self.root
        if not ref.startswith("#"):
            return {}
        for part in ref.lstrip("#").strip("/").split("/"):
            if not part:
                continue
            node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, Mapping) else None
        return node if isinstance(node, Mapping) else {}

    def _pick(self, name: str, n: int) -> int:
        return zlib.crc32(f"{self.salt}:{name}".encode()) % n

    def _number(self, schema: Mapping[str, Any], name: str, *, integer: bool) -> int | float:
        low, low_open = _bound(schema, "minimum", "exclusiveMinimum")
        high, high_open = _bound(schema, "maximum", "exclusiveMaximum")
        if low is None:
            low, low_open = (0.0 if high is None or high > 0 else high - 100.0), False
        if high is None:
            high, high_open = low + 100.0, False
        pick = self._pick(name, 1000)
        if integer:
            lo = math.floor(low) + 1 if low_open else math.ceil(low)
            hi = math.ceil(high) - 1 if high_open else math.floor(high)
            return lo + pick % (hi - lo + 1) if hi >= lo else lo
        value = round(low + (pick + 1) / 1001 * (high - low), 6)  # strictly inside open bounds
        if (value <= low and low_open) or (value >= high and high_open) or not low <= value <= high:
            value = (low + high) / 2
        return value

    def _string(self, schema: Mapping[str, Any], name: str) -> str:
        fmt = schema.get("format")
        if isinstance(fmt, str) and fmt in _FORMATS:
            return _FORMATS[fmt]
        text = _phrase(self.salt + self._pick(name, 997), 3).strip()
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        while len(text) < low:
            text += "x"
        return text[: int(high)] if isinstance(high, int) else text


def _bound(schema: Mapping[str, Any], inclusive: str, exclusive: str) -> tuple[float | None, bool]:
    """A numeric bound and whether it is open (JSON Schema 2020 numbers, or draft 4's booleans)."""
    value, flag = schema.get(inclusive), schema.get(exclusive)
    if isinstance(flag, bool):
        return (float(value), flag) if isinstance(value, int | float) else (None, False)
    if isinstance(flag, int | float):
        return float(flag), True
    return (float(value), False) if isinstance(value, int | float) else (None, False)


def _phrase(salt: int, words: int) -> str:
    n = len(WORDS)
    return "".join(WORDS[(salt + i) % n] for i in range(words)).strip()


def _is_null(schema: Any) -> bool:
    return isinstance(schema, Mapping) and schema.get("type") == "null"


def _words(text: str) -> list[str]:
    return [w for w in "".join(c.lower() if c.isalnum() else " " for c in text).split() if len(w) > 2]


def _last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return ""
