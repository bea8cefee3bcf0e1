"""Least outstanding requests: the gateway's own in-flight count (exact, never lags a scrape)."""

from __future__ import annotations

from fleetgate.core.routing.pipeline import PickContext
from fleetgate.core.routing.scorers.normalize import lower_is_better
from fleetgate.core.types import ReplicaSnapshot, RequestInfo


class InflightRequestsScorer:
    """Fewer in-flight requests scores higher (min-max scaled)."""

    name = "inflight_requests"

    def score(self, request: RequestInfo, candidates: list[ReplicaSnapshot], ctx: PickContext) -> list[float]:
        return lower_is_better([float(r.inflight_requests) for r in candidates])
