"""The admission hook the gateway calls: authenticate -> admit -> (dispatch) -> settle or release.

``Admission`` is the protocol that ``fleetgate.admission.service.AdmissionService`` implements; the gateway
only depends on this protocol. ``OpenAdmission`` is the default when no tenants are configured: everyone is
the anonymous tenant and every request is admitted at once (no per-request bookkeeping on the hot path).
A ticket may carry ``headers`` (e.g. ``x-ratelimit-*``) that the gateway adds to the response.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleetgate.core.admission.headroom import LatencyHeadroom
from fleetgate.core.types import Priority, ReplicaSnapshot, RequestInfo, Usage


@dataclass(frozen=True, slots=True)
class TenantSummary:
    """A tenant as the status page shows it."""

    name: str
    priority: str
    reserved_mu_per_min: Mapping[str, float] = field(default_factory=dict)


class Caller(Protocol):
    """An authenticated caller as the gateway sees it (``AnonymousTenant``, ``admission.tenants.Tenant``)."""

    @property
    def name(self) -> str: ...

    @property
    def priority(self) -> Priority: ...


class AdmissionTicket(Protocol):
    """What ``admit`` returns: response headers to add (``x-ratelimit-*``), and whatever settle needs."""

    @property
    def headers(self) -> Mapping[str, str]: ...


@dataclass(frozen=True, slots=True)
class OpenTicket:
    """``OpenAdmission``'s ticket: nothing to add, nothing to settle."""

    headers: Mapping[str, str] = field(default_factory=dict)


class Admission(Protocol):
    """What the gateway needs from admission control. A ticket returned by ``admit`` must be passed to
    exactly one of ``settle`` (the request ran; charge its real cost) or ``release`` (it never ran).

    The optional hooks below have no-op defaults in :class:`AdmissionHooks` (inherit it)."""

    def authenticate(self, authorization_header: str | None) -> Caller: ...

    async def admit(self, tenant: Any, request: RequestInfo, now: float) -> AdmissionTicket: ...

    @property
    def clock(self) -> Callable[[], float] | None:
        """The clock admission wants ``now`` from (``None``: the gateway's)."""
        ...

    @property
    def open(self) -> bool:
        """No tenants and no admin keys are configured: no key exists, nothing needs one."""
        ...

    def is_admin(self, caller: Any) -> bool: ...

    def tenant_summaries(self) -> list[TenantSummary]: ...

    def queue_length(self) -> int | None: ...

    def capacity_overview(self) -> list[dict[str, Any]] | None: ...

    def use_replica_capacity(
        self, snapshots_of: Callable[[str], Iterable[ReplicaSnapshot] | None]
    ) -> None: ...

    def use_latency_headroom(
        self, headroom_of: Callable[[str], LatencyHeadroom | None], clock: Callable[[], float]
    ) -> None: ...

    async def settle(
        self, ticket: Any, actual_mu: float, now: float, *, usage: Usage | None = None
    ) -> None: ...

    def release(self, ticket: Any) -> None: ...

    def record_overhead(self, model: str, mu: float, now: float) -> None:
        """Work the fleet did that no tenant is charged for (failover), for the capacity ledger."""

    def tenant_used_mu_per_min(self) -> Mapping[str, Mapping[str, float]] | None:
        """Deployment -> tenant -> MU/min settled over the capacity ledger's window, as ``/admin/capacity``
        reports it (every gateway's with a shared store); ``None``: no ledger here."""
        ...

    async def start(self) -> None:
        """Before the gateway serves (e.g. check the store)."""

    async def aclose(self) -> None:
        """After the gateway drained: answer what still waits, close the store."""


@dataclass(frozen=True, slots=True)
class AnonymousTenant:
    name: str = "anonymous"
    priority: Priority = Priority.INTERACTIVE


class AdmissionHooks:
    """No-op defaults of the optional ``Admission`` hooks (status page, admin check, live capacity)."""

    #: the clock admission wants ``now`` from (``None``: the gateway's own)
    clock: Callable[[], float] | None = None

    @property
    def open(self) -> bool:
        return True

    def is_admin(self, caller: Any) -> bool:
        return False

    def tenant_summaries(self) -> list[TenantSummary]:
        return []

    def queue_length(self) -> int | None:
        """Requests waiting for admission (``None``: this admission has no queue)."""
        return None

    def capacity_overview(self) -> list[dict[str, Any]] | None:
        """Capacity, sold and used MU per deployment (``None``: not tracked)."""
        return None

    def use_replica_capacity(self, snapshots_of: Callable[[str], Iterable[ReplicaSnapshot] | None]) -> None:
        """Take each deployment's capacity live from its replicas (no-op: capacity is not tracked)."""
        return None

    def use_latency_headroom(
        self, headroom_of: Callable[[str], LatencyHeadroom | None], clock: Callable[[], float]
    ) -> None:
        """Hold best-effort beyond each deployment's latency-headroom limit (no-op: no tiers here)."""
        return None

    def tenant_used_mu_per_min(self) -> Mapping[str, Mapping[str, float]] | None:
        return None

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


class OpenAdmission(AdmissionHooks):
    """No tenants, no limits: the embedded default."""

    def __init__(self) -> None:
        self.tenant = AnonymousTenant()
        self.admitted = 0
        self.settled = 0
        self.released = 0

    def authenticate(self, authorization_header: str | None) -> AnonymousTenant:
        return self.tenant

    async def admit(self, tenant: Any, request: RequestInfo, now: float) -> OpenTicket:
        self.admitted += 1
        return OpenTicket()

    async def settle(self, ticket: Any, actual_mu: float, now: float, *, usage: Usage | None = None) -> None:
        self.settled += 1

    def release(self, ticket: Any) -> None:
        self.released += 1

    def record_overhead(self, model: str, mu: float, now: float) -> None:
        """No ledger to tell."""


def admission_clock(admission: Admission, default: Callable[[], float]) -> Callable[[], float]:
    """The clock the admission service wants its ``now`` from (it may be wall time for shared Redis)."""
    return admission.clock if admission.clock is not None else default


def tenant_name(tenant: Caller) -> str:
    return tenant.name or "anonymous"


def tenant_priority(tenant: Caller) -> Priority:
    priority = tenant.priority
    if type(priority) is Priority:  # (what ``Priority(priority)`` would return, without the enum's call)
        return priority
    try:
        return Priority(priority)
    except ValueError:
        return Priority.INTERACTIVE
