"""Autoscaling: a pure ``decide(context) -> (replicas, state)`` per policy, one set of rails, one registry.

Layout: ``base`` (context, protocol, summary, window helpers), ``rails`` (bounds, delay, cooldown and rate
helpers every policy applies; :class:`Railed` for outer bounds), ``fleetgate`` (the MU policy), ``kpa`` and
``static`` (baselines), ``demand`` (the MU demand meter the gateway feeds), ``registry`` (name -> factory and
typed Params). Add an autoscaler: a module here with its Params and ``decide``/``summary``, one registry line.
"""

from fleetgate.core.autoscale.base import (
    AutoscaleContext,
    Autoscaler,
    AutoscaleSummary,
    ReportingAutoscaler,
    context_summary,
    replicas_for,
    window_mean,
    window_slope,
)
from fleetgate.core.autoscale.demand import DemandMeter
from fleetgate.core.autoscale.fleetgate import (
    AutoscalePolicy,
    AutoscaleState,
    FleetgateAutoscaler,
    arrival_demand,
    decide,
    recent_demand,
    season_update,
    seasonal_increment,
)
from fleetgate.core.autoscale.kpa import KpaAutoscaler, KpaState
from fleetgate.core.autoscale.rails import (
    Railed,
    Rails,
    apply_bounds,
    delayed_floor,
    in_cooldown,
    limit_scale_down,
    limit_scale_up,
)
from fleetgate.core.autoscale.registry import (
    AUTOSCALER_NAMES,
    AUTOSCALERS,
    AutoscalerConfig,
    autoscaler_from,
    autoscaler_params,
    build_autoscaler,
)
from fleetgate.core.autoscale.static import StaticAutoscaler, StaticParams

__all__ = [
    "AUTOSCALERS",
    "AUTOSCALER_NAMES",
    "AutoscaleContext",
    "AutoscalePolicy",
    "AutoscaleState",
    "AutoscaleSummary",
    "Autoscaler",
    "AutoscalerConfig",
    "DemandMeter",
    "FleetgateAutoscaler",
    "KpaAutoscaler",
    "KpaState",
    "Railed",
    "Rails",
    "ReportingAutoscaler",
    "StaticAutoscaler",
    "StaticParams",
    "apply_bounds",
    "arrival_demand",
    "autoscaler_from",
    "autoscaler_params",
    "build_autoscaler",
    "context_summary",
    "decide",
    "delayed_floor",
    "in_cooldown",
    "limit_scale_down",
    "limit_scale_up",
    "recent_demand",
    "replicas_for",
    "season_update",
    "seasonal_increment",
    "window_mean",
    "window_slope",
]
