"""KV-memory pressure: a replica whose KV cache is nearly full makes new requests wait for memory.

On long-context traffic (agentic sessions: 34k-token contexts on average, answers of hundreds of tokens) the
tail at high load is not prefill but KV memory: a replica whose running requests hold most of its KV
blocks admits a new request only when some finish, so it waits in the engine's queue however short its own
prefill is (docs/benchmarks.md, "Session 7: tail objective"). The TTFT estimate does not see that wait (its
fluid queue is prefill work), so this scorer adds it as a penalty that is zero while the scraped KV usage is
below ``knee`` and grows linearly to the scorer's whole weight (seconds, inside the ``fleetgate`` policy) at a
full cache: load balancing by memory only where memory is short, cache affinity everywhere else. Unknown
usage (no scrape yet) scores 1 (no penalty).
"""

from __future__ import annotations

from pydantic import Field

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.pipeline import PickContext, StageBase
from fleetgate.core.types import ReplicaSnapshot, RequestInfo


class KvPressureParams(PluginParams):
    """Penalise scraped KV-cache usage above a knee (1 below it, 0 at a full cache)."""

    knee: float = Field(default=0.7, ge=0.0, lt=1.0, description="KV usage below which there is no penalty.")


class KvPressureScorer(StageBase):
    """``1 - (usage - knee) / (1 - knee)``, clipped to [0, 1]; unknown usage scores 1."""

    name = "kv_pressure"

    def __init__(self, params: KvPressureParams | None = None) -> None:
        self.params = params or KvPressureParams()
        self.knee = self.params.knee
        self._span = 1.0 - self.knee

    def score(self, request: RequestInfo, candidates: list[ReplicaSnapshot], ctx: PickContext) -> list[float]:
        knee, span = self.knee, self._span
        out = []
        for r in candidates:
            u = r.engine_kv_usage
            if u is None or u <= knee:
                out.append(1.0)
            else:
                out.append(max(0.0, 1.0 - (u - knee) / span))
        return out
