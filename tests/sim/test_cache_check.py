"""Cache model check: a fleet-wide LRU block cache reproduces the published Mooncake token hit rates."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgate.sim.cache import BlockLRU, replay_fleet_cache
from fleetgate.sim.traces import TraceRequest, load_mooncake

# ../shared/traces/README.md: token hit rate of one LRU cache shared by the fleet, by capacity in tokens.
PUBLISHED = {3e6: 0.138, 1e7: 0.291, 5e7: 0.371}


@pytest.mark.parametrize("capacity", sorted(PUBLISHED))
def test_mooncake_fleet_lru_hit_rate_matches_published(mooncake_path: Path, capacity: float) -> None:
    trace = load_mooncake(mooncake_path)
    result = replay_fleet_cache(trace.requests, capacity)
    assert result.requests == 12031
    assert abs(result.token_hit_rate - PUBLISHED[capacity]) <= 0.01, result.token_hit_rate


def test_lru_evicts_least_recently_used_and_counts_only_leading_blocks() -> None:
    lru = BlockLRU(3)
    lru.touch([1, 2, 3])
    lru.touch([1])  # 2 is now the least recently used
    lru.touch([4])
    assert lru.match([1, 2]) == 1
    assert lru.match([3, 4, 1]) == 3
    assert lru.match([9, 1]) == 0  # a miss stops the prefix


def test_hit_tokens_capped_by_partial_last_block() -> None:
    reqs = [TraceRequest(0.0, 700, 1, hash_ids=(1, 2)), TraceRequest(1.0, 600, 1, hash_ids=(1, 2))]
    res = replay_fleet_cache(reqs, 10 * 512)
    assert res.hit_tokens == 600
    assert res.input_tokens == 1300
