"""Pickers: choose one candidate from the combined scores."""

from fleetgate.core.routing.pickers.max_score import MaxScorePicker
from fleetgate.core.routing.pickers.random import RandomPicker
from fleetgate.core.routing.pickers.round_robin import RoundRobinPicker

__all__ = ["MaxScorePicker", "RandomPicker", "RoundRobinPicker"]
