"""The async admission shell the gateway calls: authenticate -> admit -> (run) -> settle or release.

All decisions come from ``fleetgate.core.admission``'s state machine; this module only executes its commands
(store calls, the admission lock, waking waiters) and does the bookkeeping (metrics, usage). Wiring into a
gateway takes a few lines::

    admission = AdmissionService.from_config(cfg, registry=metrics.registry, clock=clock)
    await admission.start()          # optional: checks the store, starts the queue waker
    tenant = admission.authenticate(request.headers.get("Authorization"))   # 401 on a bad key
    ticket = await admission.admit(tenant, info, clock())                    # 429 / 503 errors
    response.headers.update(ticket.headers)                                  # x-ratelimit-*
    await admission.settle(ticket, actual_mu, clock())   # or admission.release(ticket) if it never ran
    await admission.aclose()

``now`` arguments must come from the service's clock (``clock=``; default ``time.monotonic``, or wall time
when several gateways share Redis without its server clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client import CollectorRegistry

from fleetgate.admission.fleet_ledger import FleetLedger
from fleetgate.admission.metrics import AdmissionMetrics
from fleetgate.admission.reservations import ReservationBook
from fleetgate.admission.tenants import ANONYMOUS_TENANT, Tenant, TenantDirectory
from fleetgate.config import FleetgateConfig
from fleetgate.core.admission import (
    AdjustCharges,
    AdmissionMachine,
    AdmissionSettings,
    CapacityView,
    ChargeKind,
    Decision,
    Exclusive,
    QueueEntry,
    Reason,
    Resolve,
    Round,
    TakeCharges,
    TenantLimits,
    Tier,
    Wake,
    estimated_tokens,
)
from fleetgate.core.admission.headroom import LatencyHeadroom
from fleetgate.core.capacity import CapacityLedger, capacity_of
from fleetgate.core.errors import FleetgateError, RateLimitError, ServiceUnavailableError
from fleetgate.core.types import ReplicaSnapshot, RequestInfo, Usage
from fleetgate.gateway.admission import AdmissionHooks, TenantSummary
from fleetgate.gateway.ratelimit import decision_headers
from fleetgate.profiles import replica_capacity_mu_per_min
from fleetgate.stores import AdmissionStore, StoreUnavailableError, build_store
from fleetgate.tasks import cancel_and_wait

log = logging.getLogger("fleetgate.admission")


def engines_saturated(snapshots: Iterable[ReplicaSnapshot]) -> bool:
    """Every routable replica reports requests waiting in its engine's own queue (scraped ``num_waiting``):
    no idle capacity anywhere. Unknown (no scrape yet, engine without the metric) counts as not waiting."""
    routable = [s for s in snapshots if s.routable]
    return bool(routable) and all((s.engine_waiting or 0) > 0 for s in routable)


_METER_NAMES = {
    ChargeKind.REQUESTS: "requests per min (RPM)",
    ChargeKind.TOKENS: "tokens per min (TPM)",
    ChargeKind.MU: "model units per min",
    ChargeKind.FLEET: "deployment capacity for best-effort traffic",
}


@dataclass(eq=False, slots=True)
class Ticket:
    """An admitted request. Pass it to exactly one of ``settle`` or ``release``."""

    tenant: Tenant
    request: RequestInfo
    decision: Decision
    estimate_tokens: int
    headers: dict[str, str] = field(default_factory=dict)
    done: bool = False
    lease: str | None = None  # the store's lease on this admission's charges (renewed while it runs)

    @property
    def ticket_id(self) -> str:
        return self.request.request_id

    @property
    def tier(self) -> Tier | None:
        return self.decision.tier

    @property
    def estimate_mu(self) -> float:
        return self.request.cost_mu

    @property
    def waited_s(self) -> float:
        return self.decision.waited_s


#: The capacity ledger's name for work done by failover (continued streams) that no tenant is charged for.
FAILOVER_TENANT = "(failover)"


class AdmissionService(AdmissionHooks):
    """Tenants, limits, a bounded priority queue and a (possibly shared) state store."""

    def __init__(
        self,
        directory: TenantDirectory,
        store: AdmissionStore,
        settings: AdmissionSettings | None = None,
        *,
        capacity_of: Callable[[str], CapacityView | None] | None = None,
        capacities: Mapping[str, float] | None = None,
        fail_open: bool = False,
        clock: Callable[[], float] = time.monotonic,
        metrics: AdmissionMetrics | None = None,
        registry: CollectorRegistry | None = None,
        time_scale: float = 1.0,
        reservations: ReservationBook | None = None,
    ) -> None:
        self.directory = directory
        #: run-time reservation changes (admin API), kept in the store; ``None``: only the configured ones
        self.reservations = reservations
        self.store = store
        self.settings = settings or AdmissionSettings()
        self.machine = AdmissionMachine(self.settings, self.capacity)
        self.core = self.machine.core
        self.fail_open = fail_open
        self.clock: Callable[[], float] = clock
        self.time_scale = time_scale  # clock seconds per real second (tests run a faster clock)
        self.metrics = metrics or AdmissionMetrics(registry)
        self.metrics.watch(lambda: self.machine.queued, lambda: self.store.available)
        self._capacity_of = capacity_of
        self._capacities: dict[str, float] = dict(capacities or {})
        self._headroom_of: Callable[[str], LatencyHeadroom | None] | None = None
        self._headroom_clock: Callable[[], float] = clock
        self._lock = asyncio.Lock()
        self._waiters: dict[int, asyncio.Future[Decision]] = {}
        self._wake = asyncio.Event()
        self._waker: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._rejected: dict[str, int] = {}
        self._ledgers: dict[str, CapacityLedger] = {}  # per deployment: settled MU over a sliding window
        #: with a shared store, ``used`` summed over every gateway replica (``None``: this one is the fleet)
        self.fleet_ledger: FleetLedger | None = FleetLedger(store, window_s=60.0) if store.shared else None
        self._closed = False
        self._clock_warned = False
        self._instance = uuid.uuid4().hex[:16]  # names this service's leases in a shared store
        self._leases: set[str] = set()  # leases of admitted requests not yet settled
        self._renewer: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------------ construction
    @classmethod
    def from_config(
        cls,
        cfg: FleetgateConfig,
        *,
        store: AdmissionStore | None = None,
        capacity_of: Callable[[str], CapacityView | None] | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] | None = None,
        time_scale: float = 1.0,
    ) -> AdmissionService:
        """Everything from the config tree; ``capacity_of`` (e.g. from the capacity ledger) overrides the
        static capacity (replicas x ``capacity_mu_per_min``) of each deployment."""
        adm = cfg.admission
        settings = AdmissionSettings(
            burst_s=adm.burst_s,
            best_effort_max_utilization=adm.best_effort_max_utilization,
            fleet_burst_s=adm.fleet_burst_s,
            queue_max=adm.queue_max,
            default_deadline_s=adm.deadline_s,
            namespace=adm.store.namespace,
        )
        if clock is None:
            shared_wall_clock = adm.store.kind == "redis" and not adm.store.server_time
            clock = time.time if shared_wall_clock else time.monotonic
        capacities = {
            d.model: replica_capacity_mu_per_min(d) * len(d.replicas) for d in cfg.deployments if d.replicas
        }
        directory = TenantDirectory.from_config(cfg.tenants, adm.admin_api_keys)
        store = store or build_store(adm.store)
        return cls(
            directory,
            store,
            settings,
            capacity_of=capacity_of,
            capacities=capacities,
            fail_open=adm.store.fail_open,
            clock=clock,
            registry=registry,
            time_scale=time_scale,
            reservations=ReservationBook(cfg, store, directory),
        )

    async def start(self) -> None:
        """Check the store once (logs when unreachable; admission still follows fail_open)."""
        if not await self.store.ping():
            log.warning(
                "admission store %s not reachable at start (fail_open=%s)", self.store.kind, self.fail_open
            )

    async def aclose(self) -> None:
        """Stop the waker, finish pending releases, reject queued requests, close the store."""
        self._closed = True
        for task in (self._waker, self._renewer):
            await cancel_and_wait(task)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._execute(self.machine.close(self.clock()), self.clock())
        await self.store.close()

    # ------------------------------------------------------------------------------------ tenants
    @property
    def enabled(self) -> bool:
        """Whether tenants (or admin keys) are configured, i.e. whether requests need a key."""
        return not self.directory.open

    def authenticate(self, authorization_header: str | None) -> Tenant:
        """``Authorization: Bearer <key>`` -> tenant; raises AuthenticationError (401)."""
        return self.directory.authenticate(authorization_header)

    @property
    def open(self) -> bool:
        return self.directory.open

    def is_admin(self, caller: Any) -> bool:
        return isinstance(caller, Tenant) and caller.admin

    def tenant_summaries(self) -> list[TenantSummary]:
        return [
            TenantSummary(name, str(t.limits.priority), dict(t.limits.reserved_mu_per_min))
            for name, t in self.directory.tenants().items()
        ]

    def queue_length(self) -> int | None:
        return len(self.core.queue)

    def use_replica_capacity(self, snapshots_of: Callable[[str], Iterable[ReplicaSnapshot] | None]) -> None:
        """Take each deployment's capacity live from its replicas (routable ones' ``capacity_mu_per_min``),
        e.g. ``service.use_replica_capacity(lambda m: fleet.deployments[m].snapshots() if m in
        fleet.deployments else None)``: best-effort then follows scaling and health at once."""

        def view(model: str) -> CapacityView | None:
            snaps = snapshots_of(model)
            if snaps is None:
                return None
            snaps = list(snaps)
            return CapacityView(
                capacity_of(snaps), self.directory.sold_mu_per_min(model), engines_saturated(snaps)
            )

        self._capacity_of = view

    def use_latency_headroom(
        self, headroom_of: Callable[[str], LatencyHeadroom | None], clock: Callable[[], float]
    ) -> None:
        """Hold best-effort beyond each deployment's latency-headroom limit (``core.admission.headroom``;
        ``clock``: the one its lifecycle events are timed with) and report the headroom in the ledger."""
        self._headroom_of = headroom_of
        self._headroom_clock = clock

    def _limited(self, model: str, view: CapacityView | None) -> CapacityView | None:
        if view is None or self._headroom_of is None:
            return view
        headroom = self._headroom_of(model)
        if headroom is None:
            return view
        limit = headroom.best_effort_limit(self._headroom_clock())
        return view if limit is None else replace(view, best_effort_limit=limit)

    def set_capacity(self, model: str, capacity_mu_per_min: float) -> None:
        """Update a deployment's capacity (e.g. after scaling) when no ``capacity_of`` was given."""
        self._capacities[model] = capacity_mu_per_min

    def capacity(self, model: str) -> CapacityView | None:
        if self._capacity_of is not None:
            return self._limited(model, self._capacity_of(model))
        cap = self._capacities.get(model)
        if cap is None:
            return None
        return self._limited(model, CapacityView(cap, self.directory.sold_mu_per_min(model)))

    def _usage_key(self, limits: TenantLimits) -> str | None:
        if limits.unlimited:
            return None
        return f"{self.settings.namespace}:usage:{limits.name}"

    def _now(self, now: float | None) -> float:
        clock_now = self.clock()
        if now is None:
            return clock_now
        if abs(now - clock_now) > 5.0:
            if not self._clock_warned:
                self._clock_warned = True
                log.warning("admission: 'now' is not from the service clock; using the service clock")
            return clock_now
        return now

    # ------------------------------------------------------------------------------------ admission
    @property
    def queue_depth(self) -> int:
        """Requests waiting for admission now."""
        return self.machine.queued

    async def admit(
        self,
        tenant: Tenant | Any,
        request: RequestInfo,
        now: float | None = None,
        *,
        deadline_s: float | None = None,
    ) -> Ticket:
        """Admit now, or wait in the priority queue up to the deadline; raises 429/503 errors."""
        now = self._now(now)
        if not isinstance(tenant, Tenant):
            tenant = ANONYMOUS_TENANT
        r = self.machine.submit(tenant.limits, request, now, deadline_s, try_alone=True)
        entry = r.entry
        assert entry is not None
        fut = await self._execute(r, now)
        if fut is not None:
            self._ensure_waker()
            try:
                await fut
            except asyncio.CancelledError:
                self._waiters.pop(entry.seq, None)
                self.machine.cancel(entry)
                if entry.decision is not None and entry.decision.allowed:
                    self.release(self._ticket(tenant, entry, entry.decision, {}))
                raise
        decision = entry.decision
        assert decision is not None
        self._record(tenant, entry, decision)
        if decision.allowed:
            headers = decision_headers(decision)
            if decision.tier is not None:
                headers["x-fleetgate-tier"] = str(decision.tier)
            return self._ticket(tenant, entry, decision, headers)
        raise self._error(tenant, entry, decision)

    def _lease_id(self, seq: int) -> str | None:
        return None if self.store.lease_ttl_s is None else f"{self._instance}:{seq}"

    def _ticket(
        self, tenant: Tenant, entry: QueueEntry, decision: Decision, headers: dict[str, str]
    ) -> Ticket:
        """The ticket of an admitted entry; its lease (when the store keeps leases) is renewed from now on."""
        lease = self._lease_id(entry.seq) if decision.charges else None
        if lease is not None:
            self._leases.add(lease)
            if self._renewer is None or self._renewer.done():
                self._renewer = asyncio.get_running_loop().create_task(self._renew(), name="lease-renewer")
        return Ticket(tenant, entry.request, decision, estimated_tokens(entry.request), headers, lease=lease)

    async def _renew(self) -> None:
        """Renew the leases of running requests every third of their lifetime (they lapse if we die)."""
        ttl = self.store.lease_ttl_s
        assert ttl is not None
        while not self._closed:
            await asyncio.sleep(ttl / 3.0 / self.time_scale)
            if self._leases:
                try:
                    await self.store.renew(sorted(self._leases), self.clock())
                except StoreUnavailableError:
                    self.metrics.store_errors.labels(self.store.kind).inc()

    async def _execute(self, r: Round, now: float) -> asyncio.Future[Decision] | None:
        """Run one round of the admission machine; returns the future to await when its request waits."""
        locked = False
        try:
            while (cmd := r.next()) is not None:
                if isinstance(cmd, TakeCharges):
                    key = self._usage_key(cmd.tenant)
                    try:
                        lease = self._lease_id(cmd.seq)
                        outcome = await self.store.take(cmd.charges, now, key, cmd.cost_mu, lease)
                    except StoreUnavailableError:
                        self.metrics.store_errors.labels(self.store.kind).inc()
                        if self.fail_open:
                            self.metrics.fail_open.inc()
                        r.store_failed(self.fail_open)
                        continue
                    r.taken(outcome)
                elif isinstance(cmd, Resolve):
                    self._resolve(cmd.entry)
                elif isinstance(cmd, Exclusive):
                    await self._lock.acquire()
                    locked = True
                elif isinstance(cmd, Wake):
                    self._wake.set()
                elif isinstance(cmd, AdjustCharges):  # a request on an estimate is charged its bound
                    try:
                        await self.store.adjust(cmd.deltas, now)
                    except StoreUnavailableError:
                        self.metrics.store_errors.labels(self.store.kind).inc()
            if r.entry is not None and r.entry.decision is None:
                # registered before the lock is released, so the pass that decides it finds it
                fut: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
                self._waiters[r.entry.seq] = fut
                return fut
            return None
        finally:
            if locked:
                self._lock.release()

    def _resolve(self, entry: QueueEntry) -> None:
        fut = self._waiters.pop(entry.seq, None)
        if fut is not None and not fut.done() and entry.decision is not None:
            fut.set_result(entry.decision)

    def _ensure_waker(self) -> None:
        if self._waker is None or self._waker.done():
            self._waker = asyncio.get_running_loop().create_task(self._run_waker(), name="admission-waker")
        self._wake.set()

    async def _run_waker(self) -> None:
        """Re-run the queue when a bucket should have refilled, a deadline passes, or something settles."""
        while not self._closed:
            try:
                if self.machine.queued == 0:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                wake = self.machine.next_wake()  # a meter may free up or a deadline pass then
                delay = 0.05 if wake is None else wake - self.clock()
                delay = min(max(delay / self.time_scale, 0.001), 0.5)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
                now = self.clock()
                await self._execute(self.machine.pump(now), now)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the queue stall silently
                log.exception("admission waker failed; retrying")
                await asyncio.sleep(0.1)

    def _record(self, tenant: Tenant, entry: QueueEntry, decision: Decision) -> None:
        tier = str(decision.tier) if decision.tier is not None else "none"
        result = "admitted" if decision.allowed else str(decision.reason)
        self.metrics.decisions.labels(tenant.name, tier, result).inc()
        if decision.allowed:
            self.metrics.admitted_mu.labels(tenant.name, tier).inc(max(0.0, entry.request.cost_mu))
            self.metrics.wait.labels(str(entry.priority)).observe(decision.waited_s)
        else:
            self._rejected[tenant.name] = self._rejected.get(tenant.name, 0) + 1

    def _error(self, tenant: Tenant, entry: QueueEntry, decision: Decision) -> FleetgateError:
        retry = decision.retry_after_s
        headers = decision_headers(decision)  # Retry-After is added where errors become HTTP
        headers["x-fleetgate-admission"] = str(decision.reason)
        model = entry.request.model
        wait = f"Please try again in {retry:.3g}s."
        if decision.reason == Reason.STORE_UNAVAILABLE:
            return ServiceUnavailableError(
                f"Admission state is unavailable. {wait}", retry_after_s=retry, headers=headers
            )
        if decision.reason == Reason.SATURATED or decision.status == 503:
            what = (
                "has a full admission queue"
                if decision.reason == Reason.QUEUE_FULL
                else "has no idle capacity"
            )
            if decision.reason == Reason.DEADLINE:
                what = "had no idle capacity before the request's deadline"
            return ServiceUnavailableError(
                f"Deployment {model} {what} for best-effort traffic of tenant {tenant.name}. {wait}",
                retry_after_s=retry,
                headers=headers,
                offered_demand=decision.for_capacity,  # not served: the autoscaler counts it
            )
        if not entry.tiers:
            return RateLimitError(
                f"Tenant {tenant.name} has no reservation or best-effort allowance on model {model}.",
                retry_after_s=retry,
                headers=headers,
            )
        meters = ", ".join(_METER_NAMES[k] for k in dict.fromkeys(entry.last_blocked)) or "its limits"
        if decision.reason == Reason.QUEUE_FULL:
            msg = f"Too many requests waiting for admission; tenant {tenant.name} on {model}. {wait}"
        else:
            msg = f"Rate limit reached for tenant {tenant.name} on {model}: {meters}. {wait}"
        # a reserved tenant's excess refused as best-effort for lack of capacity still answers the
        # reservation's 429, but it is offered demand (``offered_demand``)
        return RateLimitError(msg, retry_after_s=retry, headers=headers, offered_demand=decision.for_capacity)

    # ------------------------------------------------------------------------------------ settle
    async def settle(
        self,
        ticket: Ticket,
        actual_mu: float,
        now: float | None = None,
        *,
        usage: Usage | None = None,
        actual_tokens: int | None = None,
    ) -> None:
        """Charge the real cost: refund (or charge) ``actual - estimate`` on every meter admission charged."""
        if ticket.done:
            return
        ticket.done = True
        await self._settle(ticket, max(0.0, actual_mu), self._now(now), usage, actual_tokens, released=False)

    def release(self, ticket: Ticket) -> None:
        """The request never ran: refund its whole estimate (done in the background)."""
        if ticket.done:
            return
        ticket.done = True
        task = asyncio.get_running_loop().create_task(
            self._settle(ticket, 0.0, self.clock(), None, 0, released=True)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(
        self,
        ticket: Ticket,
        actual_mu: float,
        now: float,
        usage: Usage | None,
        actual_tokens: int | None,
        *,
        released: bool,
    ) -> None:
        if usage is not None and actual_tokens is None:
            actual_tokens = usage.total_tokens
        fields: dict[str, float] = (
            {"released": 1.0} if released else {"settled": 1.0, "settled_mu": actual_mu}
        )
        if usage is not None:
            fields["prompt_tokens"] = float(usage.prompt_tokens)
            fields["completion_tokens"] = float(usage.completion_tokens)
        key = self._usage_key(ticket.tenant.limits)
        if ticket.lease is not None:
            self._leases.discard(ticket.lease)
        r = self.machine.settle(
            ticket.decision, ticket.tenant.limits, ticket.request, actual_mu, actual_tokens
        )
        while (cmd := r.next()) is not None:
            if isinstance(cmd, AdjustCharges) and (cmd.deltas or key is not None or ticket.lease):
                try:
                    await self.store.adjust(cmd.deltas, now, key, fields, ticket.lease, cmd.charged)
                except StoreUnavailableError:
                    self.metrics.store_errors.labels(self.store.kind).inc()
            elif isinstance(cmd, Wake):
                self._wake.set()
        if not released:
            self.metrics.settled_mu.labels(ticket.tenant.name).inc(actual_mu)
            self.ledger(ticket.request.model).record(ticket.tenant.name, actual_mu, now)
            if self.fleet_ledger is not None:
                self.fleet_ledger.record(ticket.request.model, ticket.tenant.name, actual_mu)

    # ------------------------------------------------------------------------------------ admin views
    async def usage(self, tenant_name: str) -> dict[str, Any]:
        """One tenant's limits and usage (what that tenant, or an admin, may read)."""
        tenant = self.directory.get(tenant_name)
        if tenant is None:
            raise KeyError(tenant_name)
        key = self._usage_key(tenant.limits)
        totals: dict[str, float] = {}
        store_ok = True
        if key is not None:
            try:
                totals = await self.store.usage(key)
            except StoreUnavailableError:
                store_ok = False
        return {
            "tenant": tenant.public(),
            "usage": totals,
            "rejected_by_this_gateway": self._rejected.get(tenant.name, 0),
            "store_available": store_ok,
        }

    def record_overhead(self, model: str, mu: float, now: float | None = None) -> None:
        """Failover work no tenant pays for (broken attempts, re-prefill): in the ledger's ``used`` under
        the pseudo-tenant ``FAILOVER_TENANT`` (no tenant name can clash: names cannot hold parentheses)."""
        if mu > 0:
            self.ledger(model).record(FAILOVER_TENANT, mu, self._now(now))
            if self.fleet_ledger is not None:
                self.fleet_ledger.record(model, FAILOVER_TENANT, mu, requests=0.0)

    def ledger(self, model: str) -> CapacityLedger:
        """The deployment's capacity ledger (settled MU of this gateway over the last minute)."""
        ledger = self._ledgers.get(model)
        if ledger is None:
            ledger = self._ledgers[model] = CapacityLedger(model, window_s=60.0)
        return ledger

    def used_by_tenant(self, model: str) -> tuple[dict[str, float], str]:
        """MU settled per tenant on ``model`` over the ledger's window and whose it is: ``fleet`` (every
        gateway sharing the store, ``FleetLedger``) or ``gateway`` (this one's exact ledger: the memory
        store, or a shared store not reachable lately)."""
        fleet = None if self.fleet_ledger is None else self.fleet_ledger.used_mu(model)
        if fleet is not None:
            return fleet, "fleet"
        return self.ledger(model).used_by_tenant(self.clock()), "gateway"

    def tenant_used_mu_per_min(self) -> dict[str, dict[str, float]]:
        """Per deployment and tenant, MU/min settled over the ledger's window: ``used_by_tenant``'s figures
        (fleet-wide with a shared store), what ``fleetgate_tenant_used_mu_per_minute`` exports."""
        out: dict[str, dict[str, float]] = {}
        for model in sorted(set(self._capacities) | set(self._ledgers)):
            by_tenant, _ = self.used_by_tenant(model)
            rate = 60.0 / self.ledger(model).window_s
            out[model] = {t: mu * rate for t, mu in by_tenant.items() if t != FAILOVER_TENANT}
        return out

    def capacity_overview(self) -> list[dict[str, Any]] | None:
        """Capacity, sold, used and headroom (MU/min) per deployment known to admission.

        ``used`` is what was settled over the ledger's window: with a shared store (Redis), by every gateway
        replica (``used_scope: fleet``, from the store's per-bucket sums); else by this gateway (``gateway``,
        exact sums of the settled costs).
        """
        models = set(self._capacities) | set(self._ledgers)
        for t in self.directory.tenants().values():
            models.update(t.limits.reserved_mu_per_min)
        now = self.clock()
        out = []
        for model in sorted(models):
            view = self.capacity(model)
            sold = self.directory.sold_mu_per_min(model)
            ledger = self.ledger(model)
            window = ledger.in_window(now)  # one walk of the window for the sum and the count
            used_mu = math.fsum(s.mu for s in window)
            overhead_mu = math.fsum(s.mu for s in window if s.tenant == FAILOVER_TENANT)
            settled_in_window: float = len(window)
            fleet = None if self.fleet_ledger is None else self.fleet_ledger.used_mu(model)
            if fleet is not None and self.fleet_ledger is not None:
                used_mu = math.fsum(fleet.values())
                overhead_mu = fleet.get(FAILOVER_TENANT, 0.0)
                settled_in_window = self.fleet_ledger.settled_requests(model) or 0.0
            used = used_mu * 60.0 / ledger.window_s
            out.append(
                {
                    "deployment": model,
                    "capacity_mu_per_min": None if view is None else view.capacity_mu_per_min,
                    "sold_mu_per_min": sold,
                    "unsold_mu_per_min": None if view is None else max(0.0, view.capacity_mu_per_min - sold),
                    "used_mu_per_min": used,
                    "headroom_mu_per_min": None if view is None else view.capacity_mu_per_min - used,
                    "used_mu": used_mu,
                    "used_window_s": ledger.window_s,
                    "failover_overhead_mu": overhead_mu,
                    "settled_requests_in_window": settled_in_window,
                    "used_scope": "gateway" if fleet is None else "fleet",
                    "settled_requests_total": ledger.total_settled_requests,
                    "best_effort_max_utilization": self.settings.best_effort_max_utilization,
                    "best_effort_in_flight": self.core.in_flight(model, Tier.BEST_EFFORT),
                    "latency": self._latency_report(model),
                }
            )
        return out

    def _latency_report(self, model: str) -> dict[str, Any] | None:
        headroom = None if self._headroom_of is None else self._headroom_of(model)
        return None if headroom is None else headroom.report(self._headroom_clock())

    async def overview(self) -> dict[str, Any]:
        """Everything an admin sees: every tenant's usage, capacity, queue and store state."""
        tenants = [await self.usage(name) for name in sorted(self.directory.tenants())]
        return {
            "tenants": tenants,
            "deployments": self.capacity_overview(),
            "queue_depth": self.machine.queued,
            "store": {"kind": self.store.kind, "available": self.store.available},
        }
