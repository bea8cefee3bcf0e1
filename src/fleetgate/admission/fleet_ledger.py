"""The capacity ledger's ``used``, fleet-wide: settled MU per deployment and tenant summed over every
gateway replica that shares the admission store (issue 18 item 6).

Each gateway keeps its own exact sliding-window ledger (``core.capacity.CapacityLedger``) and, with a shared
store (Redis), also adds what it settled to the store's per-bucket sums (``AdmissionStore.add_used``: one
hash per 5 s bucket, ``HINCRBYFLOAT``, expiring after a few minutes). Every ``interval_s`` it sends what
settled since the last round (one script call, not one per request) and reads the window back summed over
every gateway (``AdmissionStore.used``), so ``/admin/capacity``, the pool gauges and the pool allocator's
ledger report the same figure on every replica, at most about two intervals behind. When the store cannot
be reached the view goes stale (``fresh`` false) and callers fall back to this gateway's own ledger; what
could not be sent is kept and sent later (bounded by the deployments x tenants it holds).

The same round carries the GPU pools' pictures (``share_pools``): the gateway leading a pool publishes its
last decision and recent history (one compact JSON document per pool, ``AdmissionStore.put_pool_views``,
expiring after three intervals), and every gateway reads them back, so that a follower's
``/admin/capacity`` and ``/ui`` show the leader's pool instead of ``decided: false``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence

from fleetgate.periodic import Periodic
from fleetgate.stores import AdmissionStore, StoreUnavailableError
from fleetgate.stores.base import SettledUse


class FleetLedger:
    """Batches this gateway's settlements into the shared store and caches the fleet-wide window."""

    def __init__(
        self,
        store: AdmissionStore,
        *,
        window_s: float = 60.0,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: the time passed to the store (ignored where it reads its own, e.g. Redis ``TIME``);
        ``monotonic``: how old the cached view is."""
        self.store = store
        self.window_s = window_s
        self.interval_s = interval_s
        self.clock = clock
        self.monotonic = monotonic
        self._pending: dict[tuple[str, str], list[float]] = {}  # (deployment, tenant) -> [mu, requests]
        self._view: dict[str, dict[str, float]] = {}  # deployment -> tenant -> MU in the window
        self._requests: dict[str, float] = {}  # deployment -> settled requests in the window
        self._read_at: float | None = None
        self._pool_source: Callable[[], Mapping[str, bytes]] | None = None
        self._pool_names: tuple[str, ...] = ()
        self._pools: dict[str, bytes] = {}
        self._loop = Periodic("fleet-ledger", self.sync, interval_s, quiet=(StoreUnavailableError,))

    def record(self, deployment: str, tenant: str, mu: float, requests: float = 1.0) -> None:
        """One settlement of this gateway (sent with the next round)."""
        row = self._pending.setdefault((deployment, tenant), [0.0, 0.0])
        row[0] += mu
        row[1] += requests

    @property
    def fresh(self) -> bool:
        """Whether the last read is recent (three intervals); callers use this gateway's ledger otherwise."""
        return self._read_at is not None and self.monotonic() - self._read_at <= 3 * self.interval_s

    def used_mu(self, deployment: str) -> dict[str, float] | None:
        """MU settled per tenant on ``deployment`` over the window, every gateway's (``None``: not fresh)."""
        if not self.fresh:
            return None
        return dict(self._view.get(deployment, {}))

    def share_pools(self, names: Sequence[str], source: Callable[[], Mapping[str, bytes]]) -> None:
        """Publish ``source()`` (the documents of the pools this gateway leads now) every round and read
        back those of ``names``."""
        self._pool_names, self._pool_source = tuple(names), source

    def pool_view(self, name: str) -> bytes | None:
        """The leader's last published document of pool ``name`` (``None``: none, or not fresh)."""
        return self._pools.get(name) if self.fresh else None

    def settled_requests(self, deployment: str) -> float | None:
        return self._requests.get(deployment, 0.0) if self.fresh else None

    async def sync(self) -> None:
        """Send what settled since the last round, then read the fleet-wide window."""
        pending, self._pending = self._pending, {}
        batch = [SettledUse(d, t, mu, n) for (d, t), (mu, n) in pending.items()]
        now = self.clock()
        try:
            await self.store.add_used(batch, now)
        except StoreUnavailableError:
            for s in batch:  # keep them for the next round
                self.record(s.deployment, s.tenant, s.mu, s.requests)
            raise
        rows = await self.store.used(self.window_s, now)
        view: dict[str, dict[str, float]] = {}
        requests: dict[str, float] = {}
        for r in rows:
            view.setdefault(r.deployment, {})[r.tenant] = r.mu
            requests[r.deployment] = requests.get(r.deployment, 0.0) + r.requests
        if self._pool_source is not None:
            await self.store.put_pool_views(self._pool_source(), 3 * self.interval_s)
            self._pools = await self.store.pool_views(self._pool_names)
        self._view, self._requests = view, requests
        self._read_at = self.monotonic()

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        """Stop, then send what settled since the last round (best effort)."""
        await self._loop.stop()
        with contextlib.suppress(StoreUnavailableError):
            await self.sync()
