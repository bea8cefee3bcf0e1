"""The admission state store interface: bucket charges, settle adjustments and per-tenant usage totals.

Every store applies the pure bucket arithmetic of ``fleetgate.core.admission`` (``take_all`` /
``adjust_all``) atomically: the memory store in-process, the Redis store in Lua scripts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from fleetgate.core.admission import BucketState, Charge, TakeOutcome

USAGE_FIELDS = (
    "requests",
    "admitted_mu",
    "settled",
    "settled_mu",
    "prompt_tokens",
    "completion_tokens",
)
"""Per-tenant usage counters (totals since the store started)."""


@dataclass(frozen=True, slots=True)
class SettledUse:
    """Settled MU (and requests) of one tenant on one deployment: what a gateway adds to the fleet-wide
    capacity ledger, and the sum over a window that the store answers."""

    deployment: str
    tenant: str
    mu: float
    requests: float = 1.0


#: Every run-time reservation (tenant -> {model: MU/min}) -> one tenant's new reservations (may raise).
ReservationChange = Callable[[dict[str, dict[str, float]]], Mapping[str, float]]


class StoreUnavailableError(Exception):
    """The shared store cannot be reached; the service applies its fail-open / fail-closed policy."""


@runtime_checkable
class AdmissionStore(Protocol):
    """Where bucket levels and usage counters live (``now`` is ignored by stores using their own clock)."""

    kind: str
    #: Whether several gateway replicas share this store (Redis): the capacity ledger's ``used`` is then
    #: read from it, summed over them; otherwise this process's own ledger is the fleet's.
    shared: bool

    @property
    def available(self) -> bool:
        """Whether the store answered its last call (Redis: false while it is unreachable)."""
        ...

    #: Seconds an admission's lease lives unless renewed (``None``: the store keeps no leases, e.g. memory,
    #: whose state dies with the process that would settle it).
    lease_ttl_s: float | None

    async def take(
        self,
        charges: Sequence[Charge],
        now: float,
        usage_key: str | None = None,
        cost_mu: float = 0.0,
        lease: str | None = None,
    ) -> TakeOutcome:
        """Charge all meters or none; an admitted request adds 1 request and ``cost_mu`` to ``usage_key``.

        With ``lease``, an admitted charge is recorded under that id: unless it is settled (``adjust`` with
        the same id) or renewed within ``lease_ttl_s``, it lapses and its charges are refunded.
        """
        ...

    async def adjust(
        self,
        deltas: Sequence[Charge],
        now: float,
        usage_key: str | None = None,
        usage: Mapping[str, float] | None = None,
        lease: str | None = None,
        charged: Sequence[Charge] = (),
    ) -> None:
        """Settle: add each delta (refund when negative) and add ``usage`` to the usage counters.

        ``lease`` ends that admission's lease; if it had already lapsed (and was refunded), what it had
        ``charged`` is charged again, so the settled total is the actual cost either way.
        """
        ...

    async def renew(self, leases: Sequence[str], now: float) -> None:
        """Extend these leases by ``lease_ttl_s`` (their requests still run)."""
        ...

    async def peek(self, charges: Sequence[Charge], now: float) -> dict[str, BucketState]:
        """Current (drained) states of these meters, charging nothing."""
        ...

    async def usage(self, usage_key: str) -> dict[str, float]:
        """Usage counters of one tenant."""
        ...

    async def reservations(self) -> dict[str, dict[str, float]]:
        """Reservations set at run time (admin API): tenant -> {model: MU/min}; a tenant absent here keeps
        its configured ones."""
        ...

    async def set_reservations(self, tenant: str, reserved: Mapping[str, float]) -> None:
        """Replace ``tenant``'s run-time reservations (``{}``: it has none, whatever its config says)."""
        ...

    async def update_reservations(self, tenant: str, change: ReservationChange) -> dict[str, float]:
        """Atomically: read every run-time reservation, ``change(them)`` -> ``tenant``'s new ones, write
        those, unless another writer changed any reservation in between (then read and decide again). An
        exception from ``change`` (a refusal) writes nothing. Two gateways changing reservations at the
        same instant thus decide one after the other: neither can oversell a pool the other just filled."""
        ...

    async def add_used(self, settled: Sequence[SettledUse], now: float) -> None:
        """Add settled MU per deployment and tenant to the fleet-wide ledger (buckets of a few seconds)."""
        ...

    async def used(self, window_s: float, now: float) -> list[SettledUse]:
        """Settled MU and requests per deployment and tenant over the last ``window_s``, summed over every
        gateway that added them (the oldest bucket weighted by the part of it inside the window)."""
        ...

    async def put_pool_views(self, views: Mapping[str, bytes], ttl_s: float) -> None:
        """Publish the pool leader's recent decisions: one compact document per pool, expiring after
        ``ttl_s`` (a leader that stops publishing leaves no stale picture)."""
        ...

    async def pool_views(self, pools: Sequence[str]) -> dict[str, bytes]:
        """The documents ``put_pool_views`` left for ``pools`` that have not expired."""
        ...

    async def ping(self) -> bool:
        """Whether the store answers now."""
        ...

    async def close(self) -> None: ...
