"""Which replica is expected to hold which prompt-prefix blocks: an approximate, per-replica LRU record.

Prompts are summarised by chained block hashes (``RequestInfo.prefix_hashes``): hash ``k`` identifies the
whole prefix up to block ``k``, so a set of hashes per replica is a flattened radix tree and "how far does
this prompt match on replica r" is "how many leading hashes does r hold". A reverse map ``hash -> holders``
makes matching one prompt against every replica cost O(matched depth), not O(replicas x depth).

Eviction is LRU per replica. Blocks of one prompt are touched deepest-first so the root of each path is the
most recent; old leaves go before the prefixes they extend, as in a real engine's prefix cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Sequence
from collections.abc import Set as AbstractSet


class PrefixIndex:
    """Per-replica LRU sets of block hashes plus the reverse index; ``capacity_blocks`` caps each set."""

    __slots__ = ("_holders", "_lru", "capacity_blocks")

    def __init__(self, capacity_blocks: int | None = None) -> None:
        if capacity_blocks is not None and capacity_blocks < 1:
            raise ValueError("capacity_blocks must be >= 1 or None")
        self.capacity_blocks = capacity_blocks
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._holders: dict[int, set[str]] = {}

    def insert(self, replica: str, hashes: Sequence[int]) -> None:
        """Record that ``replica`` now holds (or will hold, once it runs) every block of ``hashes``."""
        if not hashes:
            return
        lru = self._lru.get(replica)
        if lru is None:
            lru = self._lru[replica] = OrderedDict()
        holders = self._holders
        move = lru.move_to_end
        for h in reversed(hashes):
            if h in lru:
                move(h)
            else:
                lru[h] = None
                s = holders.get(h)
                if s is None:
                    holders[h] = {replica}
                else:
                    s.add(replica)
        cap = self.capacity_blocks
        if cap is not None and len(lru) > cap:
            self._evict(replica, lru, len(lru) - cap)

    def _evict(self, replica: str, lru: OrderedDict[int, None], count: int) -> None:
        holders = self._holders
        pop = lru.popitem
        for _ in range(count):
            h, _ = pop(last=False)
            s = holders.get(h)
            if s is not None:
                s.discard(replica)
                if not s:
                    del holders[h]

    def match_depths(self, hashes: Sequence[int], among: Container[str] | None = None) -> dict[str, int]:
        """Leading blocks of ``hashes`` held by each replica (only replicas with depth >= 1 appear)."""
        return self.match(hashes, among)[0]

    def match(
        self, hashes: Sequence[int], among: Container[str] | None = None
    ) -> tuple[dict[str, int], AbstractSet[str]]:
        """``match_depths`` plus the replicas holding the deepest match (read-only: may be internal).

        Each replica's depth is written once, when it drops out of the matching set (or at the end), so a
        prefix held by every replica costs one set intersection per block, not one dict fill per block.
        """
        depths: dict[str, int] = {}
        holders = self._holders
        alive: AbstractSet[str] | None = None
        last = 0
        for k, h in enumerate(hashes, 1):
            s = holders.get(h)
            if not s:
                break
            if alive is None:
                nxt: AbstractSet[str] = s if among is None else {r for r in s if r in among}
            else:
                nxt = alive & s
                if len(nxt) < len(alive):
                    for r in alive - nxt:
                        depths[r] = last
            if not nxt:
                break
            alive, last = nxt, k
        if not alive:
            return depths, frozenset()
        if len(alive) > 8:
            depths.update(dict.fromkeys(alive, last))
        else:
            for r in alive:
                depths[r] = last
        return depths, alive

    def _match_depths_reference(
        self, hashes: Sequence[int], among: Container[str] | None = None
    ) -> dict[str, int]:
        """The straightforward per-level version of ``match_depths`` (kept for the tests)."""
        depths: dict[str, int] = {}
        holders = self._holders
        alive: set[str] | None = None
        for k, h in enumerate(hashes, 1):
            s = holders.get(h)
            if not s:
                break
            # The holder set itself may serve as the first level: ``&`` below always builds a new set.
            nxt = (s if among is None else {r for r in s if r in among}) if alive is None else alive & s
            if not nxt:
                break
            if len(nxt) > 8:
                depths.update(dict.fromkeys(nxt, k))  # a shared root held everywhere: C-level fill
            else:
                for r in nxt:
                    depths[r] = k
            alive = nxt
        return depths

    def longest_match(
        self, hashes: Sequence[int], among: Container[str] | None = None
    ) -> tuple[int, set[str]]:
        """The deepest matched block count and the replicas (among ``among``) that hold it."""
        holders = self._holders
        alive: set[str] = set()
        depth = 0
        for k, h in enumerate(hashes, 1):
            s = holders.get(h)
            if not s:
                break
            nxt = {r for r in s if among is None or r in among} if depth == 0 else alive & s
            if not nxt:
                break
            alive, depth = nxt, k
        return depth, alive

    def size(self, replica: str) -> int:
        """Blocks recorded for ``replica``."""
        lru = self._lru.get(replica)
        return 0 if lru is None else len(lru)

    def recency(self, replica: str, h: int) -> int:
        """Position of ``h`` in ``replica``'s LRU order (higher: more recent; -1: absent); for tests."""
        lru = self._lru.get(replica)
        if lru is None or h not in lru:
            return -1
        return list(lru).index(h)

    def evict_to(self, max_blocks: int) -> None:
        """Trim every replica to at most ``max_blocks`` (LRU first), like SGLang's periodic eviction."""
        for replica, lru in self._lru.items():
            if len(lru) > max_blocks:
                self._evict(replica, lru, len(lru) - max_blocks)

    def drop(self, replica: str) -> None:
        """Forget everything recorded for ``replica`` (it left the fleet or restarted with an empty cache)."""
        lru = self._lru.pop(replica, None)
        if lru:
            self._evict(replica, lru, len(lru))

    def replicas(self) -> list[str]:
        return list(self._lru)
