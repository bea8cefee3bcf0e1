"""KV-cache utilisation: a replica whose cache is nearly full will queue or preempt new work."""

from __future__ import annotations

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.pipeline import PickContext, StageBase
from fleetgate.core.types import ReplicaSnapshot, RequestInfo


class KvUsageParams(PluginParams):
    """Lower scraped KV-cache usage scores higher (unknown: 0.5)."""


class KvUsageScorer(StageBase):
    """``1 - kv_usage`` as scraped (already in [0, 1]); unknown usage scores 0.5 (neither good nor bad)."""

    name = "kv_usage"

    def score(self, request: RequestInfo, candidates: list[ReplicaSnapshot], ctx: PickContext) -> list[float]:
        out = []
        for r in candidates:
            u = r.engine_kv_usage
            out.append(0.5 if u is None else 1.0 - min(max(u, 0.0), 1.0))
        return out
