"""Keep a uniform random sample of ``k`` candidates (power-of-k-choices starts with this)."""

from __future__ import annotations

from pydantic import Field

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.pipeline import PickContext, StageBase
from fleetgate.core.types import ReplicaSnapshot, RequestInfo


class RandomSampleParams(PluginParams):
    """A uniform random sample of `k` candidates (power of k choices)."""

    k: int = Field(default=2, ge=1, description="Candidates kept.")


class RandomSampleFilter(StageBase):
    """Keeps ``k`` distinct candidates drawn uniformly with the injected rng (all of them if fewer)."""

    name = "random_sample"

    def __init__(self, k: int = 2) -> None:
        if k < 1:
            raise ValueError("k must be >= 1")
        self.k = k

    def filter(
        self, request: RequestInfo, candidates: list[ReplicaSnapshot], ctx: PickContext
    ) -> list[ReplicaSnapshot]:
        n = len(candidates)
        if n <= self.k:
            return candidates
        rnd = ctx.rng.random
        if self.k == 2:  # the hot case, without building an index list
            i = int(rnd() * n) % n
            j = int(rnd() * (n - 1)) % (n - 1)
            if j >= i:
                j += 1
            return [candidates[i], candidates[j]]
        pool = list(range(n))
        out = []
        for step in range(self.k):  # partial Fisher-Yates
            m = n - step
            pick = step + int(rnd() * m) % m
            pool[step], pool[pick] = pool[pick], pool[step]
            out.append(candidates[pool[step]])
        return out
