"""Routing: filters, then weighted scorers in [0, 1], then a picker; policies built by name from config."""

from fleetgate.core.routing.base import RoutingPolicy

__all__ = ["RoutingPolicy"]
