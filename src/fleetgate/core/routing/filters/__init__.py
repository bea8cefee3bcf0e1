"""Filters: drop replicas that must not (or need not) be considered."""

from fleetgate.core.routing.filters.routable import RoutableFilter
from fleetgate.core.routing.filters.sample import RandomSampleFilter

__all__ = ["RandomSampleFilter", "RoutableFilter"]
