"""Every autoscaler by name, with its typed Params: the one place a new autoscaler is registered.

Built on the shared plug-in registry (``core.plugins``): config validates an autoscaler through
:data:`AutoscalerConfig` (a discriminated union on ``policy``: ``{policy: kpa, target_concurrency: 8}``) and
the factory turns the validated Params into the autoscaler.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from fleetgate.core.autoscale.base import ReportingAutoscaler
from fleetgate.core.autoscale.fleetgate import AutoscalePolicy, FleetgateAutoscaler
from fleetgate.core.autoscale.kpa import KpaAutoscaler
from fleetgate.core.autoscale.static import StaticAutoscaler, StaticParams
from fleetgate.core.plugins import Registry


def _static(p: StaticParams) -> ReportingAutoscaler:
    return StaticAutoscaler(replicas=p.count())


def _kpa(p: KpaAutoscaler) -> ReportingAutoscaler:
    return p


def _fleetgate(p: AutoscalePolicy) -> ReportingAutoscaler:
    return FleetgateAutoscaler(policy=p)


#: Filled here, at import, and never changed afterwards.
AUTOSCALERS: Registry[ReportingAutoscaler] = Registry("autoscaler")
AUTOSCALERS.add("static", StaticParams, _static)
AUTOSCALERS.add("kpa", KpaAutoscaler, _kpa)
AUTOSCALERS.add("fleetgate", AutoscalePolicy, _fleetgate)
AUTOSCALER_NAMES: tuple[str, ...] = AUTOSCALERS.names()

#: The typed ``autoscaler`` config value: one autoscaler's Params plus ``policy: <name>``.
AutoscalerConfig: Any = AUTOSCALERS.union(tag="policy", suffix="AutoscalerConfig")


def autoscaler_params(name: str, params: BaseModel | Mapping[str, Any] | None = None) -> BaseModel:
    """``params`` validated for the autoscaler ``name``; unknown names and keys are errors."""
    model = AUTOSCALERS.get(name).params
    if params is not None and not isinstance(params, BaseModel):
        unknown = sorted(set(params) - set(model.model_fields))
        if unknown:
            raise ValueError(f"unknown {name} autoscaler parameter(s): {', '.join(unknown)}")
    return AUTOSCALERS.params(name, params)


def autoscaler_from(config: Any) -> ReportingAutoscaler:
    """The autoscaler of a validated :data:`AutoscalerConfig` value (its ``policy`` names the entry)."""
    name = str(config.policy)
    return AUTOSCALERS.build(name, autoscaler_params(name, config))


def build_autoscaler(name: str, params: Mapping[str, Any] | None = None) -> ReportingAutoscaler:
    """``static`` (peak provisioning), ``kpa`` (Knative-style concurrency target) or ``fleetgate`` (MU)."""
    return AUTOSCALERS.build(name, autoscaler_params(name, params))
