"""Leader election shell: reads the lease from a store, asks ``core.leader.LeaderElection``, writes back.

One :class:`LeaderElector` per deployment whose replicas several gateways share. ``is_leader()`` gates what
only one gateway may do: the autoscaler loop steps only on the leader and the health monitor's remediation
goes through :class:`LeaderOnly` (a follower's prober still takes a hung replica out of its own routing).

Stores: :class:`RedisLeaseStore` here (``SET NX PX`` to create, a Lua compare-and-set to renew or take over;
the key expires in Redis itself one lease after the last renewal) and ``leader_lease.KubernetesLeaseStore``
(a ``coordination.k8s.io/v1`` Lease, compare-and-swap on ``resourceVersion``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import orjson
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Gauge

from fleetgate.core.health import RemediationDeclined
from fleetgate.core.leader import LeaderElection, LeaseRecord
from fleetgate.providers.base import ProviderError
from fleetgate.tasks import cancel_and_wait

log = logging.getLogger("fleetgate.leader")


class LeaseConflict(Exception):
    """The store refused a write: another candidate created or changed the lease first."""


class LeaseStore(Protocol):
    """Where the lease lives. ``version`` is the store's compare-and-swap token (None: no lease yet)."""

    description: str

    async def read(self) -> tuple[LeaseRecord | None, str | None]: ...

    async def create(self, record: LeaseRecord) -> str:
        """Create the lease; :class:`LeaseConflict` when one exists."""
        ...

    async def update(self, record: LeaseRecord, version: str) -> str:
        """Replace the lease if it is still at ``version``; :class:`LeaseConflict` otherwise."""
        ...

    async def close(self) -> None: ...


class LeaderMetrics:
    """``fleetgate_leader{deployment}``: one family for all of a gateway's electors (registered once)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.leader = Gauge(
            "fleetgate_leader",
            "1 on the gateway replica that runs the deployment's autoscaler and remediation.",
            ["deployment"],
            registry=registry,
        )


def candidate_identity() -> str:
    """This process among the candidates: the pod (host) name and a random suffix, as a restarted pod
    with the same name is another candidate."""
    host = os.environ.get("HOSTNAME") or socket.gethostname()
    return f"{host}_{uuid.uuid4().hex[:10]}"


class LeaderElector:
    """Keeps trying to acquire, then renews, one lease; ``is_leader()`` answers from the last renewal."""

    def __init__(
        self,
        store: LeaseStore,
        election: LeaderElection,
        *,
        deployment: str,
        metrics: LeaderMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.election = election
        self.deployment = deployment
        self.clock = clock
        self.wall_clock = wall_clock
        self._version: str | None = None
        self._was_leading = False
        self._task: asyncio.Task[None] | None = None
        metrics = metrics or LeaderMetrics()
        metrics.leader.labels(deployment).set_function(lambda: 1.0 if self.is_leader() else 0.0)

    @property
    def identity(self) -> str:
        return self.election.identity

    def is_leader(self) -> bool:
        return self.election.leading(self.clock())

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"fleetgate-leader-{self.deployment}")

    async def stop(self) -> None:
        """Stop trying; a leader hands the lease back so that another takes over at once."""
        await cancel_and_wait(self._task)
        self._task = None
        released = self.election.release(self.wall_clock())
        if released is not None and self._version is not None:
            try:
                async with asyncio.timeout(2.0):
                    await self.store.update(released, self._version)
                log.info("leader deployment=%s: released %s", self.deployment, self.store.description)
            except Exception as exc:  # best effort (a conflict, a timeout): the lease expires anyway
                log.warning("leader deployment=%s: release failed: %s", self.deployment, exc)
        await self.store.close()

    async def _run(self) -> None:
        while True:
            delay = self.election.timing.retry_period_s
            try:
                delay = await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # keep electing through a store hiccup: leading lapses at the deadline
                log.exception("leader election step failed deployment=%s", self.deployment)
            await asyncio.sleep(delay)

    async def step(self) -> float:
        """One read and, when due, one write; returns the seconds to the next step."""
        try:
            record, self._version = await self.store.read()
        except Exception as exc:
            where = self.store.description
            log.warning("leader deployment=%s: cannot read %s: %s", self.deployment, where, exc)
            self._report()
            return self.election.timing.retry_period_s
        self.election.observe(record, self.clock())
        want = self.election.attempt(self.clock(), self.wall_clock())
        if want is not None:
            sent = self.clock()
            try:
                if record is None:
                    self._version = await self.store.create(want)
                else:
                    assert self._version is not None
                    self._version = await self.store.update(want, self._version)
                self.election.written(want, sent)
            except LeaseConflict:
                self.election.lost()
            except Exception as exc:
                log.warning("leader deployment=%s: write failed: %s", self.deployment, exc)
        self._report()
        return self.election.next_try_in(self.clock())

    def _report(self) -> None:
        leading = self.is_leader()
        if leading != self._was_leading:
            holder = self.election.observed.holder if self.election.observed else ""
            log.info(
                "leader deployment=%s: %s (%s, identity %s, holder %s)",
                self.deployment,
                "leading: runs the autoscaler and remediation" if leading else "not leading: routes only",
                self.store.description,
                self.identity,
                holder or "-",
            )
            self._was_leading = leading


class Restarter(Protocol):
    """What the health monitor's remediation calls (``health.monitor.Remediator``)."""

    async def restart(self, name: str) -> Any: ...


class NotLeaderError(ProviderError, RemediationDeclined):
    """A follower's remediation request: expected while a replica is unhealthy and another gateway leads."""


class LeaderOnly:
    """A remediator that acts only on the leader; a follower's request fails (its prober retries later,
    by then the leader has replaced the replica or this gateway leads)."""

    def __init__(self, inner: Restarter, is_leader: Callable[[], bool]) -> None:
        self.inner = inner
        self.is_leader = is_leader

    async def restart(self, name: str) -> Any:
        if not self.is_leader():
            raise NotLeaderError(f"not the leader: replica {name} is left to the gateway that leads")
        return await self.inner.restart(name)


# -- Redis ------------------------------------------------------------------------------------------------

# KEYS[1] lease key; ARGV: expected version, new value, ttl ms. The value is the JSON record
# with its version; the write happens only when the stored version is the expected one.
_COMPARE_AND_SET = """
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
if cjson.decode(cur)['version'] ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', tonumber(ARGV[3]))
return 1
"""


class RedisLeaseStore:
    """The lease as one Redis key (``<namespace>:leader:<name>``) whose TTL is the lease duration."""

    def __init__(self, url: str, key: str, *, timeout_s: float = 1.0) -> None:
        self.key = key
        self.description = f"Redis lock {key}"
        self._redis: aioredis.Redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=True
        )
        self._cas = self._redis.register_script(_COMPARE_AND_SET)

    @staticmethod
    def _value(record: LeaseRecord, version: str) -> str:
        return orjson.dumps({
            "version": version, "holder": record.holder, "duration_s": record.duration_s,
            "acquired_at": record.acquired_at, "renewed_at": record.renewed_at,
            "transitions": record.transitions,
        }).decode()  # fmt: skip

    @staticmethod
    def _ttl_ms(record: LeaseRecord) -> int:
        return max(1, int(record.duration_s * 1000))

    async def read(self) -> tuple[LeaseRecord | None, str | None]:
        raw = await self._redis.get(self.key)
        if raw is None:
            return None, None
        v = orjson.loads(raw)
        record = LeaseRecord(
            holder=str(v["holder"]),
            duration_s=float(v["duration_s"]),
            acquired_at=v.get("acquired_at"),
            renewed_at=v.get("renewed_at"),
            transitions=int(v.get("transitions", 0)),
        )
        return record, str(v["version"])

    async def create(self, record: LeaseRecord) -> str:
        version = uuid.uuid4().hex
        ok = await self._redis.set(self.key, self._value(record, version), nx=True, px=self._ttl_ms(record))
        if not ok:
            raise LeaseConflict(f"{self.key} exists")
        return version

    async def update(self, record: LeaseRecord, version: str) -> str:
        new = uuid.uuid4().hex
        value = self._value(record, new)
        done = await self._cas(keys=[self.key], args=[version, value, self._ttl_ms(record)])
        if int(done) != 1:
            raise LeaseConflict(f"{self.key} changed or expired")
        return new

    async def close(self) -> None:
        await self._redis.aclose()
