"""Queue length: the engine's waiting + running when scraped, else the gateway's in-flight count."""

from __future__ import annotations

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.pipeline import PickContext, StageBase
from fleetgate.core.routing.scorers.normalize import lower_is_better
from fleetgate.core.types import ReplicaSnapshot, RequestInfo


def queue_length(r: ReplicaSnapshot) -> float:
    """Requests queued or running on ``r`` as best known.

    The scrape lags dispatch, so the gateway's own in-flight count is a floor: a burst sent since the last
    scrape is never invisible.
    """
    if r.engine_waiting is None and r.engine_running is None:
        return float(r.inflight_requests)
    engine = (r.engine_waiting or 0) + (r.engine_running or 0)
    return float(max(engine, r.inflight_requests))


class QueueLengthParams(PluginParams):
    """Shorter queue (engine waiting + running when scraped, else in-flight) scores higher."""


class QueueLengthScorer(StageBase):
    """Shorter queue scores higher (min-max scaled)."""

    name = "queue_length"

    def score(self, request: RequestInfo, candidates: list[ReplicaSnapshot], ctx: PickContext) -> list[float]:
        return lower_is_better([queue_length(r) for r in candidates])
