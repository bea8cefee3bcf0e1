"""A simulator model of sglang-router 0.3.2's ``cache_aware`` policy (a baseline, not a fleetgate policy).

``router_compare.py`` runs the real ``sglang-router launch --policy cache_aware`` with its defaults; the
simulator needs a stand-in that decides like it. Our own ``cache_aware`` (``core.routing.cache_aware``)
follows the same outline but is a policy of ours: among the replicas that hold the deepest match it takes
the least loaded. The real router does not look at load there. What this model keeps from its source
(sgl-project/sglang, ``sgl-router/src/policies/cache_aware.rs`` and ``tree.rs``, read, not copied):

1. **Load** is the router's own count of requests in flight per worker (raised when it forwards a request,
   lowered when the response ends). The fleet is *imbalanced* when ``max - min > balance_abs_threshold``
   and ``max > balance_rel_threshold * min`` (over all workers); then the least-loaded worker is chosen and
   the prompt still goes into that worker's tree.
2. Otherwise one radix tree over the request *text* (characters) shared by all workers, each node tagged
   with the workers whose requests passed through it. The match walks the tree as far as the text goes,
   whoever holds it; the worker is **the first tag of the deepest node reached** in the node's hash-map
   iteration order (a ``DashMap`` keyed by worker URL with a per-process random hasher: in effect a fixed
   preference order of the workers, drawn anew at each router launch), not the least loaded one.
3. If the matched share of the text is at most ``cache_threshold``: in 0.3.2 (the model gateway's
   ``sgl-model-gateway/src/policies/cache_aware.rs``; its log lines say ``smg::``) the least-loaded worker,
   ties to the first in ``--worker-urls`` order; in the older ``sgl-router`` the worker with the fewest
   characters in the tree (``get_smallest_tenant``), ties by the preference order (``miss_route``).
4. Every ``eviction_interval_s`` each worker's part of the tree is trimmed LRU-leaf first to
   ``max_tree_size`` characters (2**26 by default: never reached by the replays here).

Approximations: the tree is the gateway's 16-token block hashes (``RequestInfo.prefix_hashes``), so a match
stops at a block boundary where the real one runs on to the first differing character; the matched share
is blocks x block tokens over the prompt's tokens (the router counts characters of the messages' text, a
near-constant multiple); tree size is in blocks, ``max_tree_size`` converted at 4 characters per token.
The preference order is a hash of (``order_seed``, replica name): one seed is one router launch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.base import PolicyBase
from fleetgate.core.routing.filters.routable import routable
from fleetgate.core.routing.pipeline import no_replica_error
from fleetgate.core.routing.prefix_index import PrefixIndex
from fleetgate.core.types import RandomSource, ReplicaSnapshot, RequestInfo, RouteDecision

CHARS_PER_TOKEN = 4


class SglangCacheAwareParams(PluginParams):
    """sglang-router 0.3.2's launch defaults (``router_args.py``)."""

    cache_threshold: float = Field(default=0.3, ge=0, le=1, description="Match share that routes by cache.")
    balance_abs_threshold: int = Field(default=64, ge=0, description="Imbalance: max - min in flight above.")
    balance_rel_threshold: float = Field(default=1.5, ge=1, description="Imbalance: and max above x min.")
    eviction_interval_s: float = Field(default=60.0, gt=0, description="Seconds between tree trims.")
    max_tree_size: int = Field(default=2**26, ge=1, description="Characters per worker after a trim.")
    order_seed: int = Field(default=0, description="The launch's worker preference order (hash seed).")
    miss_route: Literal["least_load", "smallest_tree"] = Field(
        default="least_load",
        description="A match at or below cache_threshold: the least-loaded worker (0.3.2, the model "
        "gateway's policy) or the smallest tree (the older sgl-router's).",
    )


def preference(name: str, seed: int) -> bytes:
    """Sort key of ``name`` in the preference order of launch ``seed`` (stable across processes)."""
    return hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()


class SglangCacheAwareModel(PolicyBase):
    """sglang-router's ``cache_aware`` decisions; see the module docstring."""

    name = "sglang_cache_aware"
    uses_prefix_hashes = True

    def __init__(self, params: SglangCacheAwareParams | None = None) -> None:
        self.params = params or SglangCacheAwareParams()
        self.index = PrefixIndex()
        self._next_eviction: float | None = None
        self.decisions: dict[str, int] = {"imbalanced": 0, "match": 0, "least_load": 0, "smallest_tree": 0}

    @classmethod
    def build(cls, params: Any = None) -> SglangCacheAwareModel:
        return cls(SglangCacheAwareParams.model_validate(params or {}))

    def _first(self, cands: Sequence[ReplicaSnapshot]) -> ReplicaSnapshot:
        seed = self.params.order_seed
        return min(cands, key=lambda r: preference(r.name, seed))

    def pick(
        self,
        request: RequestInfo,
        replicas: Sequence[ReplicaSnapshot],
        now: float,
        rng: RandomSource,
        exclude: frozenset[str] = frozenset(),
    ) -> RouteDecision:
        p = self.params
        cands = routable(replicas if isinstance(replicas, list) else list(replicas), now, exclude, None)
        if not cands:
            raise no_replica_error(len(replicas), request.model)
        if self._next_eviction is None:
            self._next_eviction = now + p.eviction_interval_s
        elif now >= self._next_eviction:
            per_block = CHARS_PER_TOKEN * max(request.prefix_block_tokens, 1)
            self.index.evict_to(max(1, p.max_tree_size // per_block))
            self._next_eviction = now + p.eviction_interval_s
        loads = [r.inflight_requests for r in replicas]  # every worker's load, as the router reads it
        hi, lo = max(loads), min(loads)
        if hi - lo > p.balance_abs_threshold and hi > lo * p.balance_rel_threshold:
            self.decisions["imbalanced"] += 1
            least = min(r.inflight_requests for r in cands)
            best = next(r for r in cands if r.inflight_requests == least)
            return RouteDecision(best.name, {"load": float(least)}, "sglang_cache_aware:imbalanced")
        hashes = request.prefix_hashes
        depth, holders = self.index.longest_match(hashes, {r.name for r in cands}) if hashes else (0, set())
        prompt_tokens = max(request.input_tokens, len(hashes) * request.prefix_block_tokens)
        share = depth * request.prefix_block_tokens / prompt_tokens if prompt_tokens > 0 else 0.0
        if depth > 0 and share > p.cache_threshold:
            self.decisions["match"] += 1
            best = self._first([r for r in cands if r.name in holders])
            return RouteDecision(best.name, {"match": share}, "sglang_cache_aware:match")
        if p.miss_route == "least_load":  # the first least-loaded worker in --worker-urls order
            self.decisions["least_load"] += 1
            least = min(r.inflight_requests for r in cands)
            best = next(r for r in cands if r.inflight_requests == least)
            return RouteDecision(best.name, {"match": share}, "sglang_cache_aware:least_load")
        self.decisions["smallest_tree"] += 1
        smallest = min(self.index.size(r.name) for r in cands)
        best = self._first([r for r in cands if self.index.size(r.name) == smallest])
        return RouteDecision(best.name, {"match": share}, "sglang_cache_aware:smallest_tree")

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        self.index.insert(replica, request.prefix_hashes)
