"""Least outstanding requests: the gateway's own in-flight count (exact, never lags a scrape)."""

from __future__ import annotations

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.pipeline import PickContext, StageBase
from fleetgate.core.routing.scorers.normalize import lower_is_better
from fleetgate.core.types import ReplicaSnapshot, RequestInfo


class InflightRequestsParams(PluginParams):
    """Fewer in-flight requests (the gateway's own count) scores higher."""


class InflightRequestsScorer(StageBase):
    """Fewer in-flight requests scores higher (min-max scaled)."""

    name = "inflight_requests"

    def score(self, request: RequestInfo, candidates: list[ReplicaSnapshot], ctx: PickContext) -> list[float]:
        return lower_is_better([float(r.inflight_requests) for r in candidates])
