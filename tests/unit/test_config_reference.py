"""docs/configuration.md is generated from the config model (tools/gen_config_reference.py) and up to date."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from pydantic import BaseModel

from fleetgate.config import FleetgateConfig

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_config_reference", ROOT / "tools" / "gen_config_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_is_up_to_date() -> None:
    expected = _generator().render()
    current = (ROOT / "docs" / "configuration.md").read_text()
    assert current == expected, "docs/configuration.md is stale: run `python tools/gen_config_reference.py`"


def test_every_field_is_documented() -> None:
    text = _generator().render()
    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            assert f"| `{name}` |" in text, f"{model.__name__}.{name} missing from the reference"
            inners, _ = _generator()._models_of(field.annotation)
            for inner in inners:  # every variant of a plug-in union (routing policies, scorers)
                walk(inner)

    walk(FleetgateConfig)
    assert len(seen) >= 20


def test_types_and_defaults_render() -> None:
    gen = _generator()
    text = gen.render()
    assert "| `routing` | mapping: one of `policy: random`, `policy: round_robin`" in text
    assert "## `deployments[].routing.params` with `policy: fleetgate`" in text
    assert "| `spill_factor` | float | `1.5` |" in text
    assert (
        "## `deployments[].routing.params.scorers[]` with `policy: least_requests, type: ttft_estimate`"
        in text
    )
    assert "| `port` | int | `8080` |" in text
    assert "| `model` | str | *required* |" in text
    assert "## `ops.slo`" in text and "## `multimodal.per_model.<name>`" in text
