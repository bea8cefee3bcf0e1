"""Every autoscaler by name, with its typed ``Params``: the one place a new autoscaler is registered.

An entry is (factory, Params): config validates a policy's parameters through its Params (a discriminated
union on ``policy``, :data:`AutoscalerParams`), and the factory turns validated Params into the autoscaler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import BaseModel, Field

from fleetgate.core.autoscale.base import ReportingAutoscaler
from fleetgate.core.autoscale.fleetgate import AutoscalePolicy, FleetgateAutoscaler
from fleetgate.core.autoscale.kpa import KpaAutoscaler
from fleetgate.core.autoscale.static import StaticAutoscaler, StaticParams


@dataclass(frozen=True, slots=True)
class AutoscalerEntry:
    """How to build one autoscaler: its validated ``Params`` -> the autoscaler."""

    factory: Callable[[Any], ReportingAutoscaler]
    params: type[BaseModel]


def _static(p: StaticParams) -> ReportingAutoscaler:
    return StaticAutoscaler(replicas=p.count())


def _kpa(p: KpaAutoscaler) -> ReportingAutoscaler:
    return p


def _fleetgate(p: AutoscalePolicy) -> ReportingAutoscaler:
    return FleetgateAutoscaler(policy=p)


AUTOSCALERS: Mapping[str, AutoscalerEntry] = MappingProxyType(
    {
        "static": AutoscalerEntry(_static, StaticParams),
        "kpa": AutoscalerEntry(_kpa, KpaAutoscaler),
        "fleetgate": AutoscalerEntry(_fleetgate, AutoscalePolicy),
    }
)
AUTOSCALER_NAMES: tuple[str, ...] = tuple(AUTOSCALERS)

#: The typed ``autoscaler`` config value: one of the registered Params, chosen by its ``policy`` key.
AutoscalerParams = Annotated[AutoscalePolicy | KpaAutoscaler | StaticParams, Field(discriminator="policy")]


def autoscaler_params(name: str, params: Mapping[str, Any] | None = None) -> BaseModel:
    """Validate ``params`` for the autoscaler ``name``; unknown names and keys are errors."""
    entry = AUTOSCALERS.get(name)
    if entry is None:
        raise ValueError(f"unknown autoscaler {name!r}; choose one of {', '.join(AUTOSCALER_NAMES)}")
    given = {k: v for k, v in (params or {}).items() if k != "policy"}
    unknown = sorted(set(given) - set(entry.params.model_fields))
    if unknown:
        raise ValueError(f"unknown {name} autoscaler parameter(s): {', '.join(unknown)}")
    return entry.params.model_validate(given)


def autoscaler_from(params: BaseModel) -> ReportingAutoscaler:
    """The autoscaler of validated Params (their ``policy`` names the entry)."""
    name = str(params.model_dump(include={"policy"})["policy"])
    return AUTOSCALERS[name].factory(params)


def build_autoscaler(name: str, params: Mapping[str, Any] | None = None) -> ReportingAutoscaler:
    """``static`` (peak provisioning), ``kpa`` (Knative-style concurrency target) or ``fleetgate`` (MU)."""
    return autoscaler_from(autoscaler_params(name, params))
