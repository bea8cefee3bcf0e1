"""Issue 18 (session 6): the fleet-wide ledger's sync round on a real Redis, and conflicting reservation
raises from two gateways' ReservationBooks (two Redis clients) at the same instant.

    PYTHONPATH=src python bench/fleet_ledger_race.py redis://127.0.0.1:6379/0

Prints the sync round's median and p95 (80 deployment x tenant entries sent, 13 buckets read back) and, of
200 rounds of two raises that fit a pool of 4 GPUs alone but not together, how many let exactly one through.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid

from fleetgate.admission.reservations import ReservationBook
from fleetgate.admission.tenants import TenantDirectory
from fleetgate.config import parse_config
from fleetgate.core.errors import ConflictError
from fleetgate.stores.base import SettledUse
from fleetgate.stores.redis import RedisStore


async def ledger(url: str) -> None:
    store = RedisStore(url, namespace=f"b{uuid.uuid4().hex}")
    batch = [SettledUse(f"dep{d}", f"tenant{t}", 1.25) for d in range(4) for t in range(20)]
    rounds = []
    for _ in range(200):
        t0 = time.perf_counter()
        await store.add_used(batch, 0.0)
        rows = await store.used(60.0, 0.0)
        rounds.append(time.perf_counter() - t0)
    assert len(rows) == 80
    median, p95 = statistics.median(rounds) * 1e3, statistics.quantiles(rounds, n=20)[18] * 1e3
    print(f"fleet ledger sync (80 entries sent, 13 buckets read): median {median:.2f} ms, p95 {p95:.2f} ms")
    await store.close()


async def race(url: str) -> None:
    ns = f"b{uuid.uuid4().hex}"
    replica = [{"name": "r", "url": "http://127.0.0.1:9"}]
    cfg = parse_config(
        {
            "pools": [{"name": "gpus", "gpus": 4}],
            "deployments": [
                {"model": "chat-a", "pool": "gpus", "replicas": replica},
                {"model": "chat-b", "pool": "gpus", "replicas": replica},
            ],
            "tenants": [
                {"name": "gold", "api_keys": ["k1"], "reserved_mu_per_min": {"chat-a": 70}},
                {"name": "silver", "api_keys": ["k2"], "reserved_mu_per_min": {"chat-b": 70}},
            ],
            "admission": {"admin_api_keys": ["a"], "store": {"kind": "redis", "url": url, "namespace": ns}},
        }
    )
    books = [
        ReservationBook(cfg, RedisStore(url, namespace=ns), TenantDirectory.from_config(cfg.tenants, ["a"]))
        for _ in range(2)
    ]
    outcomes = {"exactly one": 0, "both (oversold)": 0, "none": 0}
    t0 = time.perf_counter()
    for i in range(200):
        a, b = books[i % 2], books[1 - i % 2]
        got = await asyncio.gather(
            a.put("gold", {"chat-a": 210}), b.put("silver", {"chat-b": 140}), return_exceptions=True
        )
        assert all(isinstance(r, ConflictError) for r in got if isinstance(r, BaseException)), got
        ok = sum(1 for r in got if not isinstance(r, BaseException))
        outcomes[{1: "exactly one", 2: "both (oversold)"}.get(ok, "none")] += 1
        await books[0].put("gold", {"chat-a": 70})
        await books[0].put("silver", {"chat-b": 70})
    print(f"reservation race, 200 rounds: {outcomes} in {time.perf_counter() - t0:.1f} s")
    for book in books:
        await book.store.close()


if __name__ == "__main__":
    asyncio.run(ledger(sys.argv[1]))
    asyncio.run(race(sys.argv[1]))
