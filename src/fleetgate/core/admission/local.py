"""Synchronous executors of the admission machine over in-memory buckets: core tests and the simulator."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fleetgate.core.admission.buckets import MemoryBuckets
from fleetgate.core.admission.decisions import Decision
from fleetgate.core.admission.machine import AdjustCharges, AdmissionMachine, Round, TakeCharges
from fleetgate.core.admission.planning import ANONYMOUS, AdmissionSettings, CapacityView, TenantLimits
from fleetgate.core.admission.pump import AdmissionCore
from fleetgate.core.admission.queue import QueueEntry
from fleetgate.core.types import RequestInfo


class LocalAdmission:
    """Admission over in-memory buckets, time passed in; one caller, so ``Exclusive`` needs no lock.

    ``submit`` returns a decision now, or ``None`` when the request waits in the queue; ``poll`` (call it
    whenever time advances) returns the decisions reached for queued requests.
    """

    def __init__(
        self,
        settings: AdmissionSettings | None = None,
        capacity_of: Callable[[str], CapacityView | None] | None = None,
    ) -> None:
        self.machine = AdmissionMachine(settings, capacity_of)
        self.buckets = MemoryBuckets()
        self._queued: dict[str, QueueEntry] = {}

    @property
    def core(self) -> AdmissionCore:
        return self.machine.core

    def _execute(self, r: Round, now: float) -> None:
        while (cmd := r.next()) is not None:
            if isinstance(cmd, TakeCharges):
                r.taken(self.buckets.take(cmd.charges, now))
            elif isinstance(cmd, AdjustCharges):
                self.buckets.adjust(cmd.deltas, now)
            # Resolve: ``poll`` hands out queued requests' decisions; Exclusive: there is one caller;
            # Wake: ``poll`` runs a pass whenever ``machine.next_wake()`` says so (a refund clears it).

    def submit(
        self, tenant: TenantLimits, request: RequestInfo, now: float, deadline_s: float | None = None
    ) -> Decision | None:
        r = self.machine.submit(tenant, request, now, deadline_s)
        assert r.entry is not None
        self._queued[request.request_id] = r.entry
        self._execute(r, now)
        if r.decision is not None:
            self._queued.pop(request.request_id, None)
        return r.decision

    def poll(self, now: float) -> list[tuple[RequestInfo, Decision]]:
        if not self._queued:
            return []
        wake = self.machine.next_wake()
        if wake is None or now >= wake:
            self._execute(self.machine.pump(now), now)
        out: list[tuple[RequestInfo, Decision]] = []
        for rid, e in list(self._queued.items()):
            if e.decision is not None:
                out.append((e.request, e.decision))
                del self._queued[rid]
        return out

    def settle(
        self,
        tenant: TenantLimits,
        request: RequestInfo,
        decision: Decision,
        actual_mu: float,
        now: float,
        actual_tokens: int | None = None,
    ) -> None:
        self._execute(self.machine.settle(decision, tenant, request, actual_mu, actual_tokens), now)

    @property
    def queued(self) -> int:
        return self.machine.queued


class SimAdmission:
    """The simulator's admission hook (``sim.des.Admission``): admit now or reject, no waiting.

    Requests name their tenant in ``RequestInfo.tenant``; unknown tenants get ``default``.
    """

    def __init__(
        self,
        tenants: Mapping[str, TenantLimits],
        settings: AdmissionSettings | None = None,
        capacity_of: Callable[[str], CapacityView | None] | None = None,
        default: TenantLimits = ANONYMOUS,
    ) -> None:
        self.local = LocalAdmission(settings, capacity_of)
        self.tenants = dict(tenants)
        self.default = default
        self._admitted: dict[str, Decision] = {}
        self.rejected: dict[str, int] = {}

    def admit(self, request: RequestInfo, now: float) -> bool:
        tenant = self.tenants.get(request.tenant, self.default)
        d = self.local.submit(tenant, request, now, deadline_s=0.0)  # zero deadline: decided now
        if d is not None and d.allowed:
            self._admitted[request.request_id] = d
            return True
        self.rejected[request.tenant] = self.rejected.get(request.tenant, 0) + 1
        return False

    def settle(self, request: RequestInfo, cost_mu: float, now: float) -> None:
        d = self._admitted.pop(request.request_id, None)
        if d is not None:
            tenant = self.tenants.get(request.tenant, self.default)
            self.local.settle(tenant, request, d, cost_mu, now)
