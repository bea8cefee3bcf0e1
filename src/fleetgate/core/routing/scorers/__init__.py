"""Scorers: each maps candidates to scores in [0, 1] (higher is better); policies weight and sum them."""

from fleetgate.core.routing.scorers.inflight import InflightRequestsScorer
from fleetgate.core.routing.scorers.kv_usage import KvUsageScorer
from fleetgate.core.routing.scorers.normalize import lower_is_better
from fleetgate.core.routing.scorers.queue import QueueLengthScorer, queue_length

__all__ = ["InflightRequestsScorer", "KvUsageScorer", "QueueLengthScorer", "lower_is_better", "queue_length"]
