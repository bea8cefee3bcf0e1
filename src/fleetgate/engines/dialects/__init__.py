"""Engine dialects by name: the one place a new engine is added (a module here and one line below).

``DeploymentConfig.engine`` names one; unset, the scraper detects it from the /metrics names
(:func:`detect`), and until then the generic ``openai`` dialect applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from fleetgate.engines.dialects.base import EngineDialect, MetricNames, PriorityField
from fleetgate.engines.dialects.llamacpp import LLAMACPP
from fleetgate.engines.dialects.openai import OPENAI
from fleetgate.engines.dialects.sglang import SGLANG
from fleetgate.engines.dialects.sim import SIM
from fleetgate.engines.dialects.vllm import VLLM

EngineKind = Literal["vllm", "sglang", "llamacpp", "sim", "openai"]

DIALECTS: Mapping[str, EngineDialect] = MappingProxyType(
    {d.name: d for d in (VLLM, SGLANG, LLAMACPP, SIM, OPENAI)}
)
#: Dialects told apart by their metric prefix, in detection order (the simulated engine reads as vLLM).
_DETECTABLE = (VLLM, SGLANG, LLAMACPP)


def dialect(name: str | None) -> EngineDialect:
    """The dialect called ``name`` (``None``: the generic ``openai`` one)."""
    if name is None:
        return OPENAI
    found = DIALECTS.get(name)
    if found is None:
        raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(DIALECTS)}")
    return found


def detect(metric_names: Mapping[str, object]) -> EngineDialect | None:
    """The dialect whose metric prefix the scraped series carry (``None``: none known)."""
    for d in _DETECTABLE:
        prefix = d.metrics.prefix
        if prefix is not None and any(name.startswith(prefix) for name in metric_names):
            return d
    return None


__all__ = ["DIALECTS", "EngineDialect", "EngineKind", "MetricNames", "PriorityField", "detect", "dialect"]
