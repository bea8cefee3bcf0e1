"""The approximate prefix record (PrefixIndex) and the SGLang-style cache_aware policy."""

from __future__ import annotations

import random

import pytest

from fleetgate.core.routing import build_policy
from fleetgate.core.routing.cache_aware import CacheAwarePolicy
from fleetgate.core.routing.prefix_index import PrefixIndex
from fleetgate.core.types import ReplicaSnapshot, RequestInfo


def req(i: int, hashes: tuple[int, ...], tokens: int | None = None, block: int = 16) -> RequestInfo:
    return RequestInfo(
        request_id=f"q{i}",
        model="m",
        input_tokens=tokens if tokens is not None else len(hashes) * block,
        prefix_hashes=hashes,
        prefix_block_tokens=block,
    )


# -- PrefixIndex -----------------------------------------------------------------------------------------


def test_match_depths_are_leading_blocks_per_replica() -> None:
    idx = PrefixIndex()
    idx.insert("a", (1, 2, 3))
    idx.insert("b", (1, 2, 9))
    idx.insert("c", (7,))
    assert idx.match_depths((1, 2, 3, 4)) == {"a": 3, "b": 2}
    assert idx.match_depths((1, 2, 9)) == {"a": 2, "b": 3}
    assert idx.match_depths((5, 1)) == {}
    assert idx.match_depths((1, 2, 3), among={"b"}) == {"b": 2}
    assert idx.longest_match((1, 2, 3, 4)) == (3, {"a"})
    assert idx.longest_match((1, 2)) == (2, {"a", "b"})
    assert idx.longest_match((1, 2, 3), among={"b", "c"}) == (2, {"b"})


def test_lru_evicts_leaves_before_their_prefixes() -> None:
    idx = PrefixIndex(capacity_blocks=4)
    idx.insert("a", (1, 2, 3))
    idx.insert("a", (1, 5))  # touches the shared root again
    assert idx.size("a") == 4
    idx.insert("a", (8,))
    # The oldest entry is the deepest block of the first path, not its root.
    assert idx.match_depths((1, 2, 3)) == {"a": 2}
    assert idx.recency("a", 1) > idx.recency("a", 2)


def test_evict_to_and_drop_keep_reverse_index_consistent() -> None:
    idx = PrefixIndex()
    for i in range(10):
        idx.insert("a", (100, i))
        idx.insert("b", (100, i))
    idx.evict_to(3)
    assert idx.size("a") == 3 and idx.size("b") == 3
    idx.drop("a")
    assert idx.size("a") == 0
    assert idx.match_depths((100, 9)) == {"b": 2}
    assert set(idx.replicas()) == {"b"}


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        PrefixIndex(0)


# -- cache_aware -----------------------------------------------------------------------------------------


def snaps(loads: dict[str, int]) -> list[ReplicaSnapshot]:
    return [ReplicaSnapshot(n, inflight_requests=v) for n, v in loads.items()]


def test_cache_aware_prefers_the_replica_holding_the_prefix() -> None:
    policy = build_policy("cache_aware")
    rng = random.Random(0)
    fleet = snaps({"a": 0, "b": 0, "c": 0})
    first = req(0, (1, 2, 3, 4))
    d0 = policy.pick(first, fleet, 0.0, rng)
    policy.on_dispatch(first, d0.replica, 0.0)
    for i in range(1, 20):
        r = req(i, (1, 2, 3, 4, 100 + i))  # the same conversation, one block longer
        d = policy.pick(r, fleet, float(i), rng)
        assert d.replica == d0.replica
        assert d.reason == "cache_aware:match"


def test_cache_aware_low_match_goes_to_smallest_tree() -> None:
    policy = build_policy("cache_aware")
    rng = random.Random(0)
    fleet = snaps({"a": 0, "b": 0, "c": 0})
    for i, name in enumerate(["a", "a", "b"]):
        policy.on_dispatch(req(i, (10 + i, 20 + i, 30 + i)), name, 0.0)
    d = policy.pick(req(9, (99, 98, 97)), fleet, 1.0, rng)
    assert (d.replica, d.reason) == ("c", "cache_aware:smallest_tree")
    # A one-block match of a ten-block prompt is below the 0.3 threshold: still the smallest tree.
    d = policy.pick(req(10, (10, *range(500, 509))), fleet, 1.0, rng)
    assert d.replica == "c"


@pytest.mark.parametrize(
    ("loads", "imbalanced"),
    [
        ({"a": 100, "b": 30}, True),  # 70 > 64 and 100 > 1.5 * 30
        ({"a": 90, "b": 30}, False),  # 60 <= 64
        ({"a": 200, "b": 140}, False),  # 200 <= 1.5 * 140
    ],
)
def test_cache_aware_falls_back_to_least_loaded_when_imbalanced(
    loads: dict[str, int], imbalanced: bool
) -> None:
    policy = build_policy("cache_aware")
    policy.on_dispatch(req(0, (1, 2, 3)), "a", 0.0)
    d = policy.pick(req(1, (1, 2, 3)), snaps(loads), 1.0, random.Random(0))
    if imbalanced:
        assert (d.replica, d.reason) == ("b", "cache_aware:imbalanced")
    else:
        assert (d.replica, d.reason) == ("a", "cache_aware:match")


def test_cache_aware_defaults_are_sglang_router_defaults() -> None:
    p = CacheAwarePolicy()
    assert (p.cache_threshold, p.balance_abs_threshold, p.balance_rel_threshold) == (0.3, 64, 1.5)
    assert (p.eviction_interval_s, p.max_tree_size) == (60.0, 2**26)


def test_cache_aware_periodic_eviction_bounds_trees() -> None:
    policy = build_policy("cache_aware", {"max_tree_size": 4 * 16 * 5, "eviction_interval_s": 10})
    assert isinstance(policy, CacheAwarePolicy)
    fleet = snaps({"a": 0})
    policy.pick(req(0, (1,)), fleet, 0.0, random.Random(0))
    for i in range(50):
        policy.on_dispatch(req(i, (i, 1000 + i)), "a", 1.0)
    assert policy.index.size("a") == 100
    policy.pick(req(99, (5,)), fleet, 11.0, random.Random(0))  # the eviction tick
    assert policy.index.size("a") == 5


def test_cache_aware_never_follows_affinity_to_an_excluded_replica() -> None:
    policy = build_policy("cache_aware")
    policy.on_dispatch(req(0, (1, 2, 3)), "a", 0.0)
    d = policy.pick(req(1, (1, 2, 3)), snaps({"a": 0, "b": 0}), 1.0, random.Random(0), frozenset({"a"}))
    assert d.replica == "b"
