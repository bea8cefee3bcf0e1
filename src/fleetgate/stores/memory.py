"""In-process admission state (the default): exact, no I/O; limits are per gateway process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from fleetgate.core.admission import BucketState, Charge, MemoryBuckets, TakeOutcome
from fleetgate.core.capacity.ledger import bucket_of, window_buckets
from fleetgate.stores.base import ReservationChange, SettledUse

#: Buckets of settled MU kept (a few minutes: windows are 60 s).
_KEEP_BUCKETS = 64


class MemoryStore:
    """Bucket levels and usage counters in dicts. Atomic because nothing awaits inside a call."""

    kind = "memory"
    shared = False  #: one process: its own capacity ledger is the fleet's
    available = True  #: always: it lives in this process
    lease_ttl_s: float | None = None  # state lives and dies with the process that settles it

    def __init__(self) -> None:
        self.buckets = MemoryBuckets()
        self._usage: dict[str, dict[str, float]] = {}
        self._reservations: dict[str, dict[str, float]] = {}
        self._reservations_lock = asyncio.Lock()
        self._used: dict[int, dict[tuple[str, str], list[float]]] = {}  # bucket -> (dep, tenant) -> [mu, n]
        self._pool_views: dict[str, tuple[float, bytes]] = {}  # pool -> (expires, monotonic; document)

    def _add(self, usage_key: str, fields: Mapping[str, float]) -> None:
        row = self._usage.setdefault(usage_key, {})
        for name, value in fields.items():
            row[name] = row.get(name, 0.0) + value

    async def take(
        self,
        charges: Sequence[Charge],
        now: float,
        usage_key: str | None = None,
        cost_mu: float = 0.0,
        lease: str | None = None,
    ) -> TakeOutcome:
        out = self.buckets.take(charges, now)
        if usage_key is not None and out.allowed:
            self._add(usage_key, {"requests": 1, "admitted_mu": cost_mu})
        return out

    async def adjust(
        self,
        deltas: Sequence[Charge],
        now: float,
        usage_key: str | None = None,
        usage: Mapping[str, float] | None = None,
        lease: str | None = None,
        charged: Sequence[Charge] = (),
    ) -> None:
        self.buckets.adjust(deltas, now)
        if usage_key is not None and usage:
            self._add(usage_key, usage)

    async def renew(self, leases: Sequence[str], now: float) -> None:
        return None

    async def peek(self, charges: Sequence[Charge], now: float) -> dict[str, BucketState]:
        return self.buckets.peek(charges, now)

    async def usage(self, usage_key: str) -> dict[str, float]:
        return dict(self._usage.get(usage_key, {}))

    async def reservations(self) -> dict[str, dict[str, float]]:
        return {t: dict(r) for t, r in self._reservations.items()}

    async def set_reservations(self, tenant: str, reserved: Mapping[str, float]) -> None:
        self._reservations[tenant] = dict(reserved)

    async def update_reservations(self, tenant: str, change: ReservationChange) -> dict[str, float]:
        async with self._reservations_lock:  # ``change`` is sync; the lock keeps it so if that changes
            new = dict(change(await self.reservations()))
            self._reservations[tenant] = new
            return dict(new)

    async def add_used(self, settled: Sequence[SettledUse], now: float) -> None:
        bucket = self._used.setdefault(bucket_of(now), {})
        for s in settled:
            row = bucket.setdefault((s.deployment, s.tenant), [0.0, 0.0])
            row[0] += s.mu
            row[1] += s.requests
        horizon = bucket_of(now) - _KEEP_BUCKETS
        for b in [b for b in self._used if b < horizon]:
            del self._used[b]

    async def put_pool_views(self, views: Mapping[str, bytes], ttl_s: float) -> None:
        expires = time.monotonic() + ttl_s
        self._pool_views.update({name: (expires, doc) for name, doc in views.items()})

    async def pool_views(self, pools: Sequence[str]) -> dict[str, bytes]:
        now = time.monotonic()
        found = {name: self._pool_views.get(name) for name in pools}
        return {name: v[1] for name, v in found.items() if v is not None and v[0] > now}

    async def used(self, window_s: float, now: float) -> list[SettledUse]:
        sums: dict[tuple[str, str], list[float]] = {}
        for b, weight in window_buckets(now, window_s):
            for key, (mu, n) in self._used.get(b, {}).items():
                row = sums.setdefault(key, [0.0, 0.0])
                row[0] += weight * mu
                row[1] += weight * n
        return [SettledUse(d, t, mu, n) for (d, t), (mu, n) in sorted(sums.items())]

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
