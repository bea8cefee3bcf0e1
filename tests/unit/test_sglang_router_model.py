"""bench/sglang_router_model.py: the simulator's model of sglang-router's cache_aware decisions (sans-IO)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from sglang_router_model import SglangCacheAwareModel, preference

from fleetgate.core.types import ReplicaSnapshot, RequestInfo

NAMES = ("r0", "r1", "r2", "r3")


def fleet(loads: dict[str, int] | None = None) -> list[ReplicaSnapshot]:
    loads = loads or {}
    return [ReplicaSnapshot(name=n, inflight_requests=loads.get(n, 0)) for n in NAMES]


def req(hashes: tuple[int, ...], tokens: int | None = None) -> RequestInfo:
    return RequestInfo(
        request_id="x", model="m", input_tokens=tokens or 16 * len(hashes), prefix_hashes=hashes
    )


def route(model: SglangCacheAwareModel, r: RequestInfo, loads: dict[str, int] | None = None) -> str:
    d = model.pick(r, fleet(loads), 0.0, random.Random(0))
    model.on_dispatch(r, d.replica, 0.0)
    return d.replica


def order(seed: int) -> list[str]:
    return sorted(NAMES, key=lambda n: preference(n, seed))


def test_misses_fill_the_smallest_tree_in_the_launch_preference_order() -> None:
    m = SglangCacheAwareModel.build({"order_seed": 3, "miss_route": "smallest_tree"})
    first = [route(m, req((100 + i,))) for i in range(4)]
    assert first == order(3)  # every tree empty, then the next empty one: ties go by the fixed order
    assert m.decisions["smallest_tree"] == 4


def test_deepest_match_goes_to_its_first_holder_whatever_its_load() -> None:
    m = SglangCacheAwareModel.build({"order_seed": 1})
    shared = (1, 2, 3)
    for i, n in enumerate(order(1)):  # every worker holds the shared prefix
        m.index.insert(n, (*shared, 50 + i))
    fav = order(1)[0]
    # the favourite is busiest (but within the balance thresholds): it still gets the match
    got = route(m, req((*shared, 99)), loads={fav: 60, order(1)[1]: 0})
    assert got == fav
    assert m.decisions["match"] == 1
    # a deeper match held only by another worker wins over the favourite
    other = order(1)[2]
    assert route(m, req((*shared, 50 + 2, 7))) == other


def test_a_match_at_or_below_the_threshold_routes_to_the_smallest_tree() -> None:
    m = SglangCacheAwareModel.build({"order_seed": 0, "cache_threshold": 0.5, "miss_route": "smallest_tree"})
    big = order(0)[-1]
    m.index.insert(big, (1, 2, 3, 4, 5, 6))
    for n in NAMES:
        if n != big:
            m.index.insert(n, (200 + NAMES.index(n),))
    # matches 2 of 4 blocks on `big` only: 0.5 is not above the threshold; the three 1-block trees tie
    assert route(m, req((1, 2, 8, 9))) == next(n for n in order(0) if n != big)
    assert m.decisions == {"imbalanced": 0, "match": 0, "least_load": 0, "smallest_tree": 1}
    # 3 of 4 is: cache routing
    assert route(m, req((1, 2, 3, 9))) == big


def test_a_miss_goes_to_the_first_least_loaded_worker_by_default() -> None:
    m = SglangCacheAwareModel.build({"order_seed": 0})
    m.index.insert("r0", (1, 2, 3, 4))
    # no match: least loaded, ties to the first in fleet order (not the preference order, not tree size)
    assert route(m, req((7, 8)), loads={"r0": 3, "r1": 1, "r2": 2, "r3": 1}) == "r1"
    assert route(m, req((9,))) == "r0"
    # 2 of 4 blocks: 0.5 > 0.3, so the holder, whatever its load
    assert route(m, req((1, 2, 5, 6)), loads={"r0": 9}) == "r0"
    assert m.decisions == {"imbalanced": 0, "match": 1, "least_load": 2, "smallest_tree": 0}


def test_imbalance_needs_both_thresholds_and_then_takes_the_least_loaded() -> None:
    m = SglangCacheAwareModel.build({"order_seed": 0})
    m.index.insert("r2", (1, 2, 3, 4))
    # difference 70 > 64 but 100 < 1.5 x 70: balanced, the match wins
    assert route(m, req((1, 2, 3, 4)), loads={"r0": 70, "r1": 70, "r2": 100, "r3": 30 + 40}) == "r2"
    # difference 65 > 64 and 65 > 1.5 x 0: imbalanced, least loaded; its tree now holds the prompt
    assert route(m, req((1, 2, 3, 4)), loads={"r0": 10, "r1": 5, "r2": 65, "r3": 0}) == "r3"
    assert m.decisions["imbalanced"] == 1
    assert m.index.longest_match((1, 2, 3, 4))[1] == {"r2", "r3"}


def test_the_preference_order_is_a_stable_function_of_the_seed() -> None:
    assert order(5) == order(5)
    assert len({tuple(order(s)) for s in range(12)}) > 1
    assert preference("r0", 1) == preference("r0", 1) != preference("r0", 2)
