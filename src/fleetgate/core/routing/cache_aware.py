"""A cache-aware router of the SGLang kind (the ``cache_aware`` baseline).

Follows sglang-router's ``cache_aware`` policy (sgl-project/sglang, ``policies/cache_aware.rs``):

1. load = the router's own in-flight request count per worker; the system is *imbalanced* when
   ``max - min > balance_abs_threshold`` AND ``max > balance_rel_threshold * min``; then the least-loaded
   worker is chosen (and the prompt still recorded in its tree);
2. otherwise the worker with the longest prefix match is chosen when the match ratio (matched / prompt
   length) exceeds ``cache_threshold``, else the worker with the smallest tree (most free cache);
3. every ``eviction_interval_s`` the trees are trimmed LRU-first to ``max_tree_size``.

Defaults are sglang-router's launch defaults (``router_args.py``): cache_threshold 0.3, balance_abs_threshold
64, balance_rel_threshold 1.5, eviction_interval_secs 60, max_tree_size 2**26. SGLang's tree is
character-level; ours is block-level over ``prefix_hashes``, so ``max_tree_size`` is read as characters and
converted at 4 characters per token. Differences: ties and "which holder of the deepest match" go to the
least-loaded holder rather than DashMap iteration order, and only routable replicas are considered.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetgate.core.routing.base import PolicyBase
from fleetgate.core.routing.filters.routable import routable
from fleetgate.core.routing.outlier import OutlierDetector
from fleetgate.core.routing.pipeline import no_replica_error
from fleetgate.core.routing.prefix_index import PrefixIndex
from fleetgate.core.types import RandomSource, ReplicaSnapshot, RequestInfo, RouteDecision

CHARS_PER_TOKEN = 4


class CacheAwarePolicy(PolicyBase):
    """SGLang-style cache-aware routing; see the module docstring."""

    name = "cache_aware"
    uses_prefix_hashes = True

    def __init__(
        self,
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        eviction_interval_s: float = 60.0,
        max_tree_size: int = 2**26,
        outliers: OutlierDetector | None = None,
    ) -> None:
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError("cache_threshold must be in [0, 1]")
        if balance_abs_threshold < 0 or balance_rel_threshold < 1.0:
            raise ValueError("balance_abs_threshold must be >= 0 and balance_rel_threshold >= 1")
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self.max_tree_size = max_tree_size
        self.outliers = outliers
        self.index = PrefixIndex()
        self._next_eviction: float | None = None
        self.balance_events = 0

    def _max_blocks(self, block_tokens: int) -> int:
        return max(1, self.max_tree_size // (CHARS_PER_TOKEN * max(block_tokens, 1)))

    def pick(
        self,
        request: RequestInfo,
        replicas: Sequence[ReplicaSnapshot],
        now: float,
        rng: RandomSource,
        exclude: frozenset[str] = frozenset(),
    ) -> RouteDecision:
        cands = routable(
            replicas if isinstance(replicas, list) else list(replicas), now, exclude, self.outliers
        )
        if not cands:
            raise no_replica_error(len(replicas), request.model)
        if self._next_eviction is None:
            self._next_eviction = now + self.eviction_interval_s
        elif now >= self._next_eviction:
            self.index.evict_to(self._max_blocks(request.prefix_block_tokens))
            self._next_eviction = now + self.eviction_interval_s
        loads = [r.inflight_requests for r in cands]
        hi = max(loads)
        lo = min(loads)
        if hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold:
            self.balance_events += 1
            i = loads.index(lo)
            return RouteDecision(cands[i].name, {"load": float(lo)}, "cache_aware:imbalanced")
        hashes = request.prefix_hashes
        names = {r.name for r in cands}
        depth, holders = self.index.longest_match(hashes, names) if hashes else (0, set())
        prompt_tokens = max(request.input_tokens, len(hashes) * request.prefix_block_tokens)
        ratio = depth * request.prefix_block_tokens / prompt_tokens if prompt_tokens > 0 else 0.0
        if depth > 0 and ratio > self.cache_threshold:
            best = min((r for r in cands if r.name in holders), key=lambda r: r.inflight_requests)
            return RouteDecision(best.name, {"match": ratio}, "cache_aware:match")
        size = self.index.size
        best = min(cands, key=lambda r: size(r.name))
        return RouteDecision(best.name, {"match": ratio}, "cache_aware:smallest_tree")

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        self.index.insert(replica, request.prefix_hashes)
        if self.outliers is not None and self.outliers.blocking:
            self.outliers.on_dispatch(replica, now)

    def on_complete(self, request: RequestInfo, replica: str, now: float, cost_mu: float, ok: bool) -> None:
        if self.outliers is not None:
            self.outliers.record(replica, ok, now)
