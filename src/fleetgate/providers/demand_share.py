"""Demand across gateway replicas: each gateway publishes its deployment's MU demand to Redis, the autoscaler
reads the sum.

Every gateway meters only the requests it admitted (``core.autoscale.DemandMeter``), so with N gateways in
front of one engine Deployment the elected leader's autoscaler would see about 1/N of the demand and
under-scale. :class:`SharedDemand` is what the leader's ``AutoscalerLoop`` reads instead: this gateway's
meter, live, plus the last reading every other gateway published (settled MU/min, MU and requests in flight).
Each gateway, leader or not, writes its reading every ``interval_s`` to ``<namespace>:demand:<model>:<id>``
with a TTL of three intervals, so a dead gateway's demand drops out within that. Used when the admission
store is Redis (the store every gateway replica already shares); without it each gateway sees its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import orjson
import redis.asyncio as aioredis

from fleetgate.core.autoscale import DemandMeter
from fleetgate.tasks import cancel_and_wait

log = logging.getLogger("fleetgate.demand")


class SharedDemand:
    """A deployment's demand over every gateway (reads like a ``DemandMeter``)."""

    def __init__(
        self,
        local: DemandMeter,
        *,
        url: str,
        prefix: str,
        identity: str,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        timeout_s: float = 1.0,
    ) -> None:
        self.local = local
        self.prefix = prefix
        self.key = f"{prefix}:{identity}"
        self.interval_s = interval_s
        self.clock = clock
        self.others: dict[str, tuple[float, float, int]] = {}  # key -> settled/min, inflight MU, requests
        self._redis: aioredis.Redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=True
        )
        self._task: asyncio.Task[None] | None = None

    # -- what the autoscaler loop reads --------------------------------------------------------------------

    @property
    def inflight_mu(self) -> float:
        return self.local.inflight_mu + sum(o[1] for o in self.others.values())

    @property
    def inflight_requests(self) -> int:
        return self.local.inflight_requests + sum(o[2] for o in self.others.values())

    def settled_mu_per_min(self, now_s: float) -> float:
        return self.local.settled_mu_per_min(now_s) + sum(o[0] for o in self.others.values())

    # -- exchange ------------------------------------------------------------------------------------------

    async def exchange(self) -> None:
        """Publish this gateway's reading, then read the others' (a key that expired is a gateway gone)."""
        local = self.local
        mine = [local.settled_mu_per_min(self.clock()), local.inflight_mu, local.inflight_requests]
        ttl_ms = max(1000, int(self.interval_s * 3000))
        await self._redis.set(self.key, orjson.dumps(mine).decode(), px=ttl_ms)
        keys = [k async for k in self._redis.scan_iter(match=f"{self.prefix}:*", count=100)]
        keys = [k for k in keys if k != self.key]
        values = await self._redis.mget(keys) if keys else []
        others: dict[str, tuple[float, float, int]] = {}
        for key, raw in zip(keys, values, strict=True):
            if raw is None:
                continue
            settled, inflight, requests = orjson.loads(raw)
            others[key] = (float(settled), float(inflight), int(requests))
        self.others = others

    async def _run(self) -> None:
        while True:
            try:
                await self.exchange()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: only this gateway's demand until it is back
                log.warning("demand exchange failed (%s): %s", self.prefix, exc)
                self.others = {}
            await asyncio.sleep(self.interval_s)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"fleetgate-demand-{self.prefix}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        with contextlib.suppress(Exception):
            await self._redis.delete(self.key)
        await self._redis.aclose()
