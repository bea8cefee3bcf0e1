"""Routing: filters, then weighted scorers in [0, 1], then a picker; policies built by name from config.

Public API: ``build_policy(name, params, profile=...)`` / ``POLICY_NAMES`` (``registry.POLICIES``: name ->
factory and pydantic ``Params``), the ``RoutingPolicy`` protocol, and the outlier detector every policy
embeds (fed through ``on_complete``). The parts (filters, scorers, pickers) are registered in
``parts.py``. See docs/routing.md.
"""

from fleetgate.core.routing.base import RoutingPolicy
from fleetgate.core.routing.outlier import BreakerState, OutlierDetector, OutlierParams
from fleetgate.core.routing.registry import POLICY_NAMES, build_policy

__all__ = [
    "POLICY_NAMES",
    "BreakerState",
    "OutlierDetector",
    "OutlierParams",
    "RoutingPolicy",
    "build_policy",
]
