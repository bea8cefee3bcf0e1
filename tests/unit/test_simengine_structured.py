"""The simulated engine's structured outputs conform to the schemas SDKs send (checked with jsonschema)."""

from __future__ import annotations

from typing import Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

from fleetgate.core.errors import InvalidRequestError
from fleetgate.simengine.structured import parse_structured, pick_tool, value_for_schema


class Address(BaseModel):
    street: str
    zip_code: str = Field(min_length=5, max_length=5)


class Person(BaseModel):
    name: str
    age: int = Field(ge=18, le=99)
    score: float = Field(gt=0, lt=1)
    tags: list[str] = Field(min_length=3)
    home: Address
    work: Address | None
    kind: Literal["a", "b"]
    email: str = Field(json_schema_extra={"format": "email"})


SCHEMAS: list[dict[str, Any]] = [
    Person.model_json_schema(),  # $defs/$ref, anyOf with null, bounds, enum, formats
    {
        "type": "object",
        "properties": {"x": {"allOf": [{"type": "integer"}, {"minimum": 3}]}},
        "required": ["x"],
    },
    {"type": "array", "items": {"type": ["string", "null"]}, "minItems": 1},
    {"oneOf": [{"type": "null"}, {"type": "boolean"}]},
    {"type": "object", "properties": {"c": {"const": 42}}, "required": ["c"], "additionalProperties": False},
]


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("salt", [0, 7, 123])
def test_values_conform(schema: dict[str, Any], salt: int) -> None:
    value = value_for_schema(schema, salt)
    jsonschema.validate(value, schema)


def test_pydantic_model_round_trips() -> None:
    person = Person.model_validate(value_for_schema(Person.model_json_schema(), 5))
    assert 18 <= person.age <= 99 and len(person.tags) >= 3


def test_tool_choice_rules() -> None:
    weather = {"type": "function", "function": {"name": "get_weather", "description": "weather in a city"}}
    clock = {"type": "function", "function": {"name": "get_time", "description": "time in a zone"}}
    user = [{"role": "user", "content": "what's the weather like in Rome"}]
    spec = parse_structured({"tools": [clock, weather]})
    chosen = pick_tool(spec, user)
    assert chosen is not None and chosen["name"] == "get_weather"
    answered = [*user, {"role": "tool", "content": "sunny"}]
    assert pick_tool(spec, answered) is None  # auto: answer in text after the tool result
    forced = parse_structured({"tools": [clock, weather], "tool_choice": "required"})
    assert pick_tool(forced, answered) is not None
    named = parse_structured(
        {"tools": [clock, weather], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    )
    chosen = pick_tool(named, user)
    assert chosen is not None and chosen["name"] == "get_time"
    assert pick_tool(parse_structured({"tools": [weather], "tool_choice": "none"}), user) is None
    for bad in (
        {"tools": "x"},
        {"tools": [{"type": "function"}]},
        {"tool_choice": "sometimes", "tools": [weather]},
        {"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [weather]},
        {"response_format": {"type": "xml"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
    ):
        with pytest.raises(InvalidRequestError):
            parse_structured(bad)
