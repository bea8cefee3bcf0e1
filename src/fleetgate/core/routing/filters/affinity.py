"""Affinity: a request's workload key owns a small, bounded-load subset of replicas.

The key (``keys.KeyFunction``: prompt prefix, session or tenant) is assigned a subset of replicas by
consistent hashing with bounded loads (``affinity.BoundedLoadAffinity``); the subset grows with the key's MU
rate (hot keys spread) and shrinks when it cools. Every ``rebalance_interval_s`` (driven by the ``now`` passed
in): keys idle for ``key_ttl_s`` are forgotten, cooled keys shrink, replicas that left the fleet leave the
subsets, and replicas whose MU rate is above ``(1 + rebalance_band)`` x the mean hand their largest keys that
fit in the excess to the next replicas on the key's ring that stay inside the band (as few keys as possible
move).

As a plain filter it keeps the candidates in the key's subset (all of them when none is); the ``fleetgate``
policy uses the subset as its leader candidates instead, so affinity never forces a request onto a replica
that is much slower than another (see ``pickers.leader_spill``).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from operator import attrgetter, or_

from pydantic import Field

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.affinity import BoundedLoadAffinity
from fleetgate.core.routing.keys import KeyFunction, KeyKind
from fleetgate.core.routing.pipeline import PickContext, StageBase
from fleetgate.core.routing.rates import DecayingRates, ReplicaLoads
from fleetgate.core.types import ReplicaSnapshot, RequestInfo

_SUBSET = attrgetter("subset")
_LAST_SEEN = attrgetter("last_seen")


class AffinityParams(PluginParams):
    """Workload keys and their bounded-load subsets (see ``core.routing.filters.affinity``)."""

    key: KeyKind = Field(
        default="prefix",
        description="Workload key: prompt prefix, session, tenant, or `context` (the deepest prefix a "
        "replica is expected to hold; session grain).",
    )
    key_prefix_tokens: int = Field(default=1024, ge=1, description="Prompt tokens that make a prefix key.")
    min_subset: int = Field(default=2, ge=1, description="Replicas per key at least.")
    max_subset: int = Field(default=0, ge=0, description="Replicas per key at most (0: no cap).")
    hot_share: float = Field(
        default=0.5, gt=0, description="Share of one replica's MU rate a key may send to each subset member."
    )
    shrink_ratio: float = Field(default=0.7, gt=0, lt=1, description="Hysteresis of shrinking a subset.")
    bound_eps: float = Field(
        default=0.25, ge=0, description="Keys per replica at most (1 + bound_eps) x the fair share."
    )
    vnodes: int = Field(default=64, ge=1, description="Ring points per replica.")
    rebalance_band: float = Field(
        default=0.3, ge=0, description="Rebalance replicas above (1 + band) x mean."
    )
    rebalance_interval_s: float = Field(default=10.0, gt=0, description="Seconds between maintenance passes.")
    max_moves: int = Field(default=64, description="Key slots moved per rebalance at most.")
    key_ttl_s: float = Field(default=600.0, gt=0, description="Keys idle this long are forgotten.")


class AffinityFilter(StageBase):
    """Key -> subset bookkeeping fed at dispatch; see the module docstring."""

    name = "affinity"
    uses_prefix_hashes = True

    def __init__(
        self,
        params: AffinityParams,
        loads: ReplicaLoads,
        key_rates: DecayingRates[int],
        *,
        guard_min_util: float = 0.05,
    ) -> None:
        self.params = params
        self.key_fn = KeyFunction(params.key, params.key_prefix_tokens)
        self.assign = BoundedLoadAffinity(
            vnodes=params.vnodes,
            bound_eps=params.bound_eps,
            min_subset=params.min_subset,
            max_subset=params.max_subset,
            hot_share=params.hot_share,
            shrink_ratio=params.shrink_ratio,
        )
        self.loads = loads
        self.key_rates = key_rates
        self.rebalance_band = params.rebalance_band
        self.rebalance_interval_s = params.rebalance_interval_s
        self.max_moves = params.max_moves
        self.key_ttl_s = params.key_ttl_s
        self.guard_min_util = guard_min_util
        self._pending: dict[int, list[str]] = {}
        self._last_req: RequestInfo | None = None
        self._last_key = 0
        #: The routable candidates of the last pick without exclusions, and the whole replica list then.
        self.members: list[ReplicaSnapshot] = []
        self.present: Sequence[ReplicaSnapshot] = ()
        self._next_maintenance: float | None = None
        self.off_subset = 0  # dispatches outside the key's subset (cache leader or spill)

    @property
    def uses_held_depth(self) -> bool:
        """The key depends on what the replicas are expected to hold (``key: context``)."""
        return self.key_fn.kind == "context"

    def key(self, request: RequestInfo, held_blocks: int = 0) -> int:
        """The request's workload key (memoised for the pick -> on_dispatch pair of one request object)."""
        if self._last_req is request:
            return self._last_key
        k = self.key_fn(request, held_blocks)
        self._last_req, self._last_key = request, k
        return k

    def observe(
        self, replicas: Sequence[ReplicaSnapshot], candidates: list[ReplicaSnapshot], full: bool
    ) -> None:
        """The fleet as the pick saw it (``full``: no replica excluded, the candidates are the members)."""
        self.present = replicas
        if full:
            self.members = candidates

    def subset(
        self, request: RequestInfo, candidates: list[ReplicaSnapshot], held_blocks: int = 0
    ) -> tuple[list[str], dict[str, int]]:
        """The key's subset (preference order) and its rank map; a new key gets a pending one."""
        aff = self.assign
        key = self.key(request, held_blocks)
        state = aff.keys.get(key)
        if state is not None:
            return state.subset, state.rank
        pend = self._pending.get(key)
        if pend is None:
            names = {r.name for r in candidates}
            aff.ensure_ring(names)
            pend = aff.walk(key, names, len(candidates), aff.min_subset)
            if len(self._pending) > 4096:
                self._pending.clear()
            self._pending[key] = pend
        return pend, {name: i for i, name in enumerate(pend)}

    def is_hot(self, subset: list[str]) -> bool:
        """A hot key (its subset grew beyond the minimum) must spread: no pull towards cache holders."""
        return len(subset) > self.assign.min_subset

    def filter(
        self, request: RequestInfo, candidates: list[ReplicaSnapshot], ctx: PickContext
    ) -> list[ReplicaSnapshot]:
        """Plain-pipeline use: keep the candidates in the key's subset (all of them when none is)."""
        if not ctx.exclude:
            self.members = candidates
        _, rank = self.subset(request, candidates)
        kept = [r for r in candidates if r.name in rank]
        return kept or candidates

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        """Plain-pipeline use: record the key with the request's own cost."""
        self.record(request, replica, now, request.cost_mu, 100.0 / 60.0)

    def record(self, request: RequestInfo, replica: str, now: float, cost: float, cap_rate: float) -> None:
        """Commit the key's subset, grow or shrink it with the key's rate, and maintain on schedule."""
        aff = self.assign
        key = self.key(request)
        state = aff.keys.get(key)
        if state is None:
            subset = self._pending.pop(key, None) or [replica]
            state = aff.commit(key, subset, now)
        state.last_seen = now
        if replica not in state.subset:
            self.off_subset += 1
        kr = self.key_rates.add_rate(key, cost, now)
        members = len(self.members) or 1
        size = aff.desired_size(kr, cap_rate, members)
        if size > len(state.subset):
            names = {r.name for r in self.members}
            aff.ensure_ring(names)
            aff.grow(key, names, members, size)
        elif aff.should_shrink(kr, cap_rate, len(state.subset)):
            aff.shrink(key)

    def tick(self, now: float, cap_rate: float) -> None:
        """Run ``maintain`` every ``rebalance_interval_s`` (called at the end of each dispatch)."""
        if self._next_maintenance is None:
            self._next_maintenance = now + self.rebalance_interval_s
        elif now >= self._next_maintenance:
            self.maintain(now, cap_rate)
            self._next_maintenance = now + self.rebalance_interval_s

    def maintain(self, now: float, cap_rate: float) -> None:
        """Expire and shrink keys, drop departed replicas from subsets, then rebalance (see module doc)."""
        aff = self.assign
        present = {r.name for r in self.present}
        members = [r.name for r in self.members]
        member_set = set(members)
        n = len(members) or 1
        ttl_edge = now - self.key_ttl_s
        kscale = self.key_rates.scale(now)
        kvals = self.key_rates.values
        for name in [m for m in self.loads.reps if m not in present]:
            self.loads.discard(name)  # departed: no longer part of the mean
        # Per key, in the keys' order (a grow reads the slot counts the keys before it left): forget it when
        # idle, drop departed members, shrink it while cooled, grow it back to the minimum. A key's subset
        # changes only by its own steps, so what each key needs is known up front: with no departed replica
        # in any subset (the usual case) only the idle keys and those off the minimum size have anything to
        # do (a subset at the minimum neither shrinks nor grows), found without a Python loop over the keys.
        keys = aff.keys
        states = list(keys.values())
        departed = set().union(*map(_SUBSET, states)) - present
        min_subset = aff.min_subset
        if departed:
            visit = list(keys.items())
        else:
            idle = map(ttl_edge.__gt__, map(_LAST_SEEN, states))
            off_minimum = map(min_subset.__ne__, map(len, map(_SUBSET, states)))
            visit = list(compress(keys.items(), map(or_, idle, off_minimum)))
        for key, state in visit:
            if state.last_seen < ttl_edge:
                aff.forget(key)
                self.key_rates.discard(key)
                continue
            subset = state.subset
            if departed:
                for name in [m for m in subset if m not in present]:
                    aff.drop_member(key, name)
            if len(subset) > min_subset:  # (``should_shrink``'s first test, before the rate is read)
                kr = kvals.get(key, 0.0) * kscale
                while aff.should_shrink(kr, cap_rate, len(subset)):
                    aff.shrink(key)
            if len(subset) < min_subset and members:
                aff.grow(key, member_set, n, min(min_subset, n))
        if members:
            self.rebalance(now, members, cap_rate)

    def rebalance(self, now: float, members: list[str], cap_rate: float = 100.0 / 60.0) -> int:
        """Move the fewest keys off replicas above the band; returns how many slots moved."""
        aff = self.assign
        rr = self.loads
        rate = {m: rr.rate(m, now) for m in members}
        mean = sum(rate.values()) / len(members)
        if mean <= 0:
            return 0
        hi = (1.0 + self.rebalance_band) * mean
        slack = self.guard_min_util * cap_rate
        kscale = self.key_rates.scale(now)
        kvals = self.key_rates.values
        moved = 0
        for src in sorted(members, key=lambda m: -rate[m]):
            if rate[src] <= hi or rate[src] - mean <= slack or moved >= self.max_moves:
                break
            contrib = []
            for key in aff.replica_keys.get(src, ()):
                st = aff.keys[key]
                contrib.append((kvals.get(key, 0.0) * kscale / len(st.subset), key))
            contrib.sort(reverse=True)
            for c, key in contrib:
                excess = rate[src] - mean
                if excess <= self.rebalance_band * mean / 2 or moved >= self.max_moves:
                    break
                if c <= 0 or c > excess * 1.000001:
                    continue
                cold = {m for m in members if rate[m] + c <= hi and m != src}
                if not cold:
                    break
                st = aff.keys[key]
                target = aff.walk(key, cold, len(members), 1, st.subset)
                if not target:
                    continue
                dst = target[0]
                aff.replace(key, src, dst)
                rr.shift(src, dst, c, now)
                rate[src] -= c
                rate[dst] += c
                moved += 1
        return moved
