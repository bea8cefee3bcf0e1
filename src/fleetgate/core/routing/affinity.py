"""Sticky, bounded-load assignment of workload keys to small subsets of replicas.

Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, 2018) on a ring of ``vnodes``
points per replica: a key's subset is the first ``d`` distinct replicas clockwise from the key's point whose
key count stays within ``ceil((1 + bound_eps) * (slots + 1) / members)`` (slots = sum of subset sizes). So no
replica holds more than ``1 + bound_eps`` times its fair share of keys, and adding or removing a replica or a
key moves only the keys next to it on the ring.

The subset size ``d`` follows the key's MU rate: ``d = ceil(rate / (hot_share * replica_rate))`` clamped to
``[min_subset, max_subset]``, so hot keys spread over more replicas; it shrinks one replica at a time once the
rate falls below ``shrink_ratio`` of what the smaller subset can take (hysteresis against flapping).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Collection, Container, Iterable
from dataclasses import dataclass, field

from fleetgate.core.routing.keys import str_hash64


@dataclass(slots=True)
class KeyState:
    """One key's subset (preference order: ring order), its rank map, and when it was last seen."""

    subset: list[str]
    last_seen: float
    rank: dict[str, int] = field(default_factory=dict)

    def reindex(self) -> None:
        self.rank = {name: i for i, name in enumerate(self.subset)}


class BoundedLoadAffinity:
    """Key -> replica-subset assignment; see the module docstring. Pure bookkeeping, no clocks."""

    def __init__(
        self,
        *,
        vnodes: int = 64,
        bound_eps: float = 0.25,
        min_subset: int = 2,
        max_subset: int = 0,
        hot_share: float = 0.5,
        shrink_ratio: float = 0.7,
    ) -> None:
        if vnodes < 1 or min_subset < 1 or max_subset < 0 or bound_eps < 0:
            raise ValueError("need vnodes >= 1, min_subset >= 1, max_subset >= 0, bound_eps >= 0")
        if not hot_share > 0 or not 0 < shrink_ratio < 1:
            raise ValueError("need hot_share > 0 and 0 < shrink_ratio < 1")
        if max_subset and max_subset < min_subset:
            raise ValueError("max_subset must be 0 (no cap) or >= min_subset")
        self.vnodes = vnodes
        self.bound_eps = bound_eps
        self.min_subset = min_subset
        self.max_subset = max_subset
        self.hot_share = hot_share
        self.shrink_ratio = shrink_ratio
        self.keys: dict[int, KeyState] = {}
        self.slots: dict[str, int] = {}
        self.total_slots = 0
        self.replica_keys: dict[str, set[int]] = {}
        self._points: list[int] = []
        self._owners: list[str] = []
        self._on_ring: set[str] = set()
        self.moves = 0

    # -- ring -----------------------------------------------------------------------------------------

    def ensure_ring(self, names: Collection[str]) -> None:
        """Add replicas not yet on the ring (they stay on it; unroutable ones are skipped when walking)."""
        if self._on_ring.issuperset(names):
            return  # (the usual case: one set operation instead of a loop over the names)
        new = [n for n in names if n not in self._on_ring]
        if not new:
            return
        self._on_ring.update(new)
        pts = list(zip(self._points, self._owners, strict=True))
        for name in new:
            pts.extend((str_hash64(f"{name}#{i}"), name) for i in range(self.vnodes))
        pts.sort()
        self._points = [p for p, _ in pts]
        self._owners = [o for _, o in pts]

    def bound(self, members: int, extra: int = 1) -> int:
        """Most keys a replica may hold once ``extra`` more slots are assigned among ``members`` replicas."""
        return math.ceil((1.0 + self.bound_eps) * (self.total_slots + extra) / max(members, 1))

    def walk(
        self, key: int, allowed: Container[str], members: int, want: int, taken: Iterable[str] = ()
    ) -> list[str]:
        """Up to ``want`` replicas clockwise from ``key``: in ``allowed``, not ``taken``, under the bound.

        A second pass ignores the bound when too few replicas are under it (small fleets).
        """
        out: list[str] = []
        if want <= 0 or not self._points:
            return out
        skip = set(taken)
        owners = self._owners
        n = len(owners)
        start = bisect_left(self._points, key)
        cap = self.bound(members)
        slots = self.slots
        for strict in (True, False):
            for j in range(n):
                name = owners[(start + j) % n]
                if name in skip or name not in allowed:
                    continue
                if strict and slots.get(name, 0) + 1 > cap:
                    continue
                out.append(name)
                skip.add(name)
                if len(out) == want:
                    return out
        return out

    # -- subsets ---------------------------------------------------------------------------------------

    def desired_size(self, key_rate: float, replica_rate: float, members: int) -> int:
        """Subset size for a key sending ``key_rate`` MU/s to replicas that serve ``replica_rate`` MU/s."""
        d = self.min_subset
        if replica_rate > 0 and key_rate > 0:
            d = max(d, math.ceil(key_rate / (self.hot_share * replica_rate)))
        if self.max_subset:
            d = min(d, self.max_subset)
        return min(d, max(members, 1))

    def should_shrink(self, key_rate: float, replica_rate: float, size: int) -> bool:
        if size <= self.min_subset:
            return False
        return key_rate < self.shrink_ratio * (size - 1) * self.hot_share * replica_rate

    def _add_slot(self, key: int, name: str) -> None:
        self.slots[name] = self.slots.get(name, 0) + 1
        self.total_slots += 1
        self.replica_keys.setdefault(name, set()).add(key)

    def _remove_slot(self, key: int, name: str) -> None:
        self.slots[name] = self.slots.get(name, 1) - 1
        self.total_slots -= 1
        ks = self.replica_keys.get(name)
        if ks is not None:
            ks.discard(key)

    def commit(self, key: int, subset: list[str], now: float) -> KeyState:
        """Record a new key with ``subset`` (usually from ``walk``)."""
        old = self.keys.get(key)
        if old is not None:
            old.last_seen = now
            return old
        state = self.keys[key] = KeyState(list(subset), now)
        state.reindex()
        for name in subset:
            self._add_slot(key, name)
        return state

    def grow(self, key: int, allowed: Container[str], members: int, size: int) -> None:
        state = self.keys[key]
        extra = self.walk(key, allowed, members, size - len(state.subset), state.subset)
        for name in extra:
            state.subset.append(name)
            self._add_slot(key, name)
        state.reindex()

    def shrink(self, key: int) -> None:
        state = self.keys[key]
        name = state.subset.pop()
        self._remove_slot(key, name)
        state.reindex()

    def replace(self, key: int, old: str, new: str) -> None:
        """Move one slot of ``key`` from ``old`` to ``new`` (rebalancing)."""
        state = self.keys[key]
        state.subset[state.subset.index(old)] = new
        self._remove_slot(key, old)
        self._add_slot(key, new)
        state.reindex()
        self.moves += 1

    def drop_member(self, key: int, name: str) -> None:
        state = self.keys[key]
        state.subset.remove(name)
        self._remove_slot(key, name)
        state.reindex()

    def forget(self, key: int) -> None:
        state = self.keys.pop(key)
        for name in state.subset:
            self._remove_slot(key, name)
