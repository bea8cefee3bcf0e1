"""Fleet-wide LRU prefix-block cache replay: the cache model check against published hit rates.

A request hits the cache for its longest run of *leading* block ids already cached (prefix caching reuses KV
only up to the first miss); hit tokens are ``min(hit_blocks * block_tokens, input_tokens)`` because the last
block of a prompt is usually partial. Every block of the request is then touched (most recently used).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fleetgate.sim.traces import TraceRequest


class BlockLRU:
    """An LRU set of block ids with a capacity in blocks."""

    __slots__ = ("_blocks", "capacity_blocks")

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = max(0, int(capacity_blocks))
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hash_ids: Sequence[int]) -> int:
        """How many leading blocks of ``hash_ids`` are cached (no LRU update)."""
        blocks = self._blocks
        n = 0
        for h in hash_ids:
            if h not in blocks:
                break
            n += 1
        return n

    def touch(self, hash_ids: Iterable[int]) -> None:
        """Mark blocks most recently used, inserting missing ones and evicting the least recently used."""
        blocks = self._blocks
        cap = self.capacity_blocks
        for h in hash_ids:
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
                if len(blocks) > cap:
                    blocks.popitem(last=False)


@dataclass(frozen=True, slots=True)
class CacheReplayResult:
    capacity_tokens: float
    requests: int
    input_tokens: int
    hit_tokens: int

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0


def replay_fleet_cache(
    requests: Sequence[TraceRequest], capacity_tokens: float, block_tokens: int = 512
) -> CacheReplayResult:
    """Replay requests in arrival order through one LRU cache of ``capacity_tokens`` tokens."""
    lru = BlockLRU(int(capacity_tokens // block_tokens))
    hit = total = 0
    for r in requests:
        k = lru.match(r.hash_ids)
        hit += min(k * block_tokens, r.input_tokens)
        total += r.input_tokens
        lru.touch(r.hash_ids)
    return CacheReplayResult(capacity_tokens, len(requests), total, hit)
