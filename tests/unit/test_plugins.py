"""The shared plug-in registry (core.plugins): names once, typed Params, discriminated unions for config."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from fleetgate.core.plugins import PluginParams, Registry


class AParams(PluginParams):
    """Plug-in a."""

    size: int = Field(default=2, ge=1)


class BParams(PluginParams):
    """Plug-in b."""

    rate: float = 1.0


def _registry() -> Registry[tuple[str, Any]]:
    reg: Registry[tuple[str, Any]] = Registry("widget")
    reg.add("a", AParams, lambda p, extra=None: ("a", p, extra))

    @reg.register("b", BParams)
    def _b(p: BParams) -> tuple[str, Any]:
        return ("b", p)

    return reg


def test_names_build_and_errors() -> None:
    reg = _registry()
    assert reg.names() == ("a", "b") and "a" in reg and len(reg) == 2
    kind, params, extra = reg.build("a", {"size": 3}, "x")
    assert kind == "a" and params == AParams(size=3) and extra == "x"
    assert reg.build("b")[1] == BParams()
    with pytest.raises(ValueError, match="unknown widget 'c'; choose one of: a, b"):
        reg.build("c")
    with pytest.raises(ValueError, match="invalid parameters for widget 'a': size: Input should be"):
        reg.build("a", {"size": 0})
    with pytest.raises(ValueError, match="nope: Extra inputs are not permitted"):
        reg.build("a", {"nope": 1})
    with pytest.raises(ValueError, match="registered twice"):
        reg.add("a", AParams, lambda p: p)


def test_nested_union_discriminates_on_the_tag() -> None:
    union = _registry().union(tag="kind", params_field="params", suffix="Widget")
    ta: TypeAdapter[Any] = TypeAdapter(union)
    a = ta.validate_python({"kind": "a", "params": {"size": 5}})
    assert type(a).__name__ == "AWidget" and a.params == AParams(size=5)
    assert ta.validate_python({"kind": "b"}).params == BParams()
    with pytest.raises(ValidationError):
        ta.validate_python({"kind": "a", "params": {"rate": 2.0}})  # b's field on a
    with pytest.raises(ValidationError):
        ta.validate_python({"kind": "zzz"})


def test_flat_union_with_a_shared_base() -> None:
    class Weighted(PluginParams):
        weight: float = Field(default=1.0, ge=0)

    union = _registry().union(tag="type", base=Weighted)
    ta: TypeAdapter[Any] = TypeAdapter(union)
    b = ta.validate_python({"type": "b", "rate": 3.0, "weight": 0.5})
    assert isinstance(b, BParams) and isinstance(b, BaseModel) and b.rate == 3.0 and b.weight == 0.5
    with pytest.raises(ValidationError):
        ta.validate_python({"type": "b", "size": 3})
