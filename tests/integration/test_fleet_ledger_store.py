"""The fleet-wide ledger's buckets in both stores (``add_used`` / ``used``): the same sums for the same
settlements, the oldest bucket weighted by its share of the window, nothing after it has left the window.
The Redis store runs against the real test Redis (FLEETGATE_TEST_REDIS_URL) with the caller's clock."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator

import pytest

from fleetgate.core.capacity import USED_BUCKET_S, window_buckets
from fleetgate.stores import AdmissionStore, MemoryStore
from fleetgate.stores.base import SettledUse

REDIS_URL = os.environ.get("FLEETGATE_TEST_REDIS_URL")
STORES = ["memory", pytest.param("redis", marks=pytest.mark.skipif(not REDIS_URL, reason="no test Redis"))]


def test_window_buckets_weigh_the_oldest_by_its_share() -> None:
    assert USED_BUCKET_S == 5.0
    # (40, 100]: buckets 8 (40-45) .. 20 (100-105); all whole but the newest, which holds only up to now
    got = window_buckets(100.0, 60.0)
    assert got[0] == (8, 1.0) and got[-1] == (20, 1.0) and len(got) == 13
    got = window_buckets(102.5, 60.0)  # (42.5, 102.5]: half of bucket 8 is inside
    assert got[0] == (8, 0.5) and got[-1] == (20, 1.0) and sum(w for _, w in got) == 12.5


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[AdmissionStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    from fleetgate.stores.redis import RedisStore

    redis = RedisStore(str(REDIS_URL), server_time=False, namespace=f"t{uuid.uuid4().hex}")
    yield redis
    await redis.close()


async def test_used_sums_every_writer_over_the_window(store: AdmissionStore) -> None:
    t0 = 1_000_000.0  # bucket 200000 starts here
    await store.add_used([SettledUse("chat", "gold", 10.0), SettledUse("chat", "silver", 1.5, 2.0)], t0)
    await store.add_used([SettledUse("chat", "gold", 5.0)], t0 + 1.0)  # another gateway, same bucket
    await store.add_used([SettledUse("code", "gold", 4.0)], t0 + 30.0)
    got = {(u.deployment, u.tenant): (u.mu, u.requests) for u in await store.used(60.0, t0 + 31.0)}
    assert got == {
        ("chat", "gold"): (15.0, 2.0),
        ("chat", "silver"): (1.5, 2.0),
        ("code", "gold"): (4.0, 1.0),
    }
    # 62.5 s later the first bucket is half outside the window: its settlements count half
    got = {(u.deployment, u.tenant): u.mu for u in await store.used(60.0, t0 + 62.5)}
    assert got == {("chat", "gold"): 7.5, ("chat", "silver"): 0.75, ("code", "gold"): 4.0}
    assert [u for u in await store.used(60.0, t0 + 65.0) if u.deployment == "chat"] == []


async def test_pool_views_are_published_read_back_and_expire(store: AdmissionStore) -> None:
    """The pool leader's documents (``put_pool_views``): read back by pool name, the latest wins, gone
    once their time to live is over (a leader that stops publishing leaves no stale picture)."""
    assert await store.pool_views(["gpus", "other"]) == {}
    await store.put_pool_views({"gpus": b'{"n": 1}'}, ttl_s=30.0)
    await store.put_pool_views({"gpus": b'{"n": 2}', "short": b"{}"}, ttl_s=30.0)
    assert await store.pool_views(["gpus", "other"]) == {"gpus": b'{"n": 2}'}
    await store.put_pool_views({"short": b"{}"}, ttl_s=0.2)
    assert await store.pool_views(["short"]) == {"short": b"{}"}
    await asyncio.sleep(0.4)
    assert await store.pool_views(["short", "gpus"]) == {"gpus": b'{"n": 2}'}
