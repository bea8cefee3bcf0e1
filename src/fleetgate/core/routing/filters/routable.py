"""The filter every policy starts with: only replicas that may take a new request right now."""

from __future__ import annotations

from collections.abc import Set as AbstractSet

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.outlier import OutlierDetector
from fleetgate.core.routing.pipeline import PickContext, StageBase
from fleetgate.core.types import HealthState, ReplicaSnapshot, RequestInfo

_HEALTHY = HealthState.HEALTHY
_SUSPECT = HealthState.SUSPECT


def routable(
    replicas: list[ReplicaSnapshot],
    now: float,
    exclude: AbstractSet[str],
    outliers: OutlierDetector | None,
) -> list[ReplicaSnapshot]:
    """Healthy or suspect, not draining, not ejected (snapshot or detector), not already tried.

    If the detector alone would leave nothing, its ejections are ignored (panic mode): a request is better
    served by a doubtful replica than refused. Health, draining and ``exclude`` are never overridden.
    """
    if exclude:  # (a retry: the other replicas first; the usual pick has none and skips the name test)
        replicas = [r for r in replicas if r.name not in exclude]
    out = [
        r
        for r in replicas
        if (r.health is _HEALTHY or r.health is _SUSPECT) and not r.draining and r.ejected_until_s <= now
    ]
    if outliers is not None and outliers.blocking and out:
        allowed = [r for r in out if outliers.allows(r.name, now)]
        if allowed:
            return allowed
    return out


class RoutableParams(PluginParams):
    """Only replicas that may take a new request: healthy or suspect, not draining, not ejected, not tried."""


class RoutableFilter(StageBase):
    """Keeps replicas that may take a new request (see ``routable``)."""

    name = "routable"

    def __init__(self, outliers: OutlierDetector | None = None) -> None:
        self.outliers = outliers

    def filter(
        self, request: RequestInfo, candidates: list[ReplicaSnapshot], ctx: PickContext
    ) -> list[ReplicaSnapshot]:
        return routable(candidates, ctx.now, ctx.exclude, self.outliers)

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        if self.outliers is not None and self.outliers.blocking:
            self.outliers.on_dispatch(replica, now)
