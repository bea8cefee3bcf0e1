"""The admission state machine: requests, settles and time in; commands out; outcomes reported back.

Executors (the async ``AdmissionService`` over any store, the synchronous ``LocalAdmission`` over
in-memory buckets, and through it the simulator) never sequence the core themselves. They start a
``Round`` (``submit``, ``pump``, ``settle``, ``close``) and run its commands until it returns ``None``::

    r = machine.submit(tenant, request, now)
    while (cmd := r.next()) is not None:
        match cmd:
            case TakeCharges():   r.taken(store.take(cmd.charges, now))    # or r.store_failed(fail_open)
            case AdjustCharges(): store.adjust(cmd.deltas, now)
            case Resolve():       hand cmd.entry.decision to whoever waits for it
            case Exclusive():     hold the admission lock until the round ends
            case Wake():          run machine.pump(now) soon
    r.decision     # None: the request waits in the queue (a later Resolve decides it)

A round that touches the shared queue first yields ``Exclusive``; only the first try of a request while
nothing waits (``try_alone``) runs without it, since stores charge atomically and there is no order to keep.

Estimates below the bound (issue 22, finding 4)
    A request's estimate (``cost_mu``) may use the tenant's output history and be far below what the
    request can cost (``bound_mu``: its whole ``max_tokens``, else the context). Each (tenant, deployment)
    may have *one* request on such an estimate at a time; any other is charged its bound (refunded to the
    actual cost at settle). When another request arrives while that one runs, the one is charged the rest
    of its bound first (``AdjustCharges``), so every request in flight but the newest is budgeted in full
    and a meter admits at most its limit plus one request per window, however the history was gamed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace

from fleetgate.core.admission.buckets import Charge, ChargeKind, TakeOutcome
from fleetgate.core.admission.decisions import Decision, Reason, settle_deltas
from fleetgate.core.admission.planning import (
    AdmissionSettings,
    CapacityView,
    TenantLimits,
    Tier,
    estimated_tokens,
)
from fleetgate.core.admission.pump import AdmissionCore, PumpPass
from fleetgate.core.admission.queue import QueueEntry
from fleetgate.core.types import RequestInfo


# ------------------------------------------------------------------------------------------------ commands
@dataclass(frozen=True, slots=True)
class TakeCharges:
    """Take these charges from the store, all or none; reply with ``Round.taken`` or ``store_failed``.

    An admitted request adds one request and ``cost_mu`` to its tenant's usage counters; ``seq`` names the
    admission (e.g. for a lease in a shared store).
    """

    tenant: TenantLimits
    charges: tuple[Charge, ...]
    cost_mu: float
    seq: int


@dataclass(frozen=True, slots=True)
class AdjustCharges:
    """Settle: add each delta to its meter (a refund when negative). Nothing to reply.

    ``charged``: what the admission charged (a store whose lease for it lapsed charges it again).
    """

    tenant: TenantLimits
    deltas: tuple[Charge, ...]
    charged: tuple[Charge, ...]


@dataclass(frozen=True, slots=True)
class Resolve:
    """``entry.decision`` is final: hand it to whoever waits for it."""

    entry: QueueEntry


@dataclass(frozen=True, slots=True)
class Exclusive:
    """The rest of this round changes the shared queue: hold the admission lock until the round ends."""


@dataclass(frozen=True, slots=True)
class Wake:
    """A refund may let a queued request in: run ``AdmissionMachine.pump`` soon."""


Command = TakeCharges | AdjustCharges | Resolve | Exclusive | Wake
_Reply = (
    TakeOutcome | bool | None
)  # a take's outcome, or False (store failed, fail closed) / True (fail open)


class Round:
    """One step of the machine as a sequence of commands (see the module docstring)."""

    __slots__ = ("_gen", "_reply", "entry")

    def __init__(self, gen: Generator[Command, _Reply, None], entry: QueueEntry | None = None) -> None:
        self._gen = gen
        self._reply: _Reply = None
        self.entry = entry

    def next(self) -> Command | None:
        reply, self._reply = self._reply, None
        try:
            return self._gen.send(reply)
        except StopIteration:
            return None

    def taken(self, outcome: TakeOutcome) -> None:
        """The outcome of the last ``TakeCharges``."""
        self._reply = outcome

    def store_failed(self, fail_open: bool) -> None:
        """The last ``TakeCharges`` could not reach the store: admit unmetered (fail open) or reject (503)."""
        self._reply = fail_open

    @property
    def decision(self) -> Decision | None:
        return None if self.entry is None else self.entry.decision


@dataclass(slots=True, eq=False)
class _Exposure:
    """The request of a (tenant, deployment) admitted (or queued) on an estimate below its bound."""

    entry: QueueEntry
    gap: float  # bound - estimate
    upgraded: bool = False  # charged the gap since (another request of the tenant arrived)


class AdmissionMachine:
    """Queue, fairness and decisions (``AdmissionCore``) behind one command protocol.

    ``capacity_of(model)`` gives the capacity ledger's numbers for a deployment (``None`` when unknown).
    """

    def __init__(
        self,
        settings: AdmissionSettings | None = None,
        capacity_of: Callable[[str], CapacityView | None] | None = None,
    ) -> None:
        self.core = AdmissionCore(settings)
        self.settings = self.core.settings
        self.capacity_of: Callable[[str], CapacityView | None] = capacity_of or (lambda _m: None)
        self.closed = False
        self._next_wake: float | None = None  # nothing can change before then unless something arrives
        self._exposed: dict[tuple[str, str], _Exposure] = {}

    @property
    def queued(self) -> int:
        return len(self.core.queue)

    def next_wake(self) -> float | None:
        """When ``pump`` may decide something new (``None``: at the next chance)."""
        return self._next_wake

    # ------------------------------------------------------------------------------------------ rounds
    def submit(
        self,
        tenant: TenantLimits,
        request: RequestInfo,
        now: float,
        deadline_s: float | None = None,
        *,
        try_alone: bool = False,
    ) -> Round:
        """A new request: decided at once, or queued until a later round resolves it.

        ``try_alone``: while nothing waits, first try it without the queue (no ``Exclusive`` needed); an
        executor that serialises everything anyway leaves it off.
        """
        entry = self.core.new_entry(tenant, request, now, deadline_s)
        return Round(self._submit(entry, now, try_alone), entry)

    def pump(self, now: float) -> Round:
        """A pass over the whole queue: deadlines, meters that drained, refunds.

        A pass that runs after it was due (``next_wake``: the executor's timer fired late, e.g. its event
        loop was busy or descheduled) first rejects only the entries whose deadline passed by the time it was
        due; those whose deadline passed since are tried once (a meter may have freed up before their
        deadline: the executor's lateness must not refuse them, with a ``Retry-After`` computed before it
        freed), and those still waiting are rejected at the end of the pass.
        """
        return Round(self._pump(now, self._expire_before(now)))

    def _expire_before(self, now: float) -> float | None:
        """Deadlines before this are past (``None``: before ``now``); see ``pump``."""
        due = self._next_wake
        return None if due is None or due >= now else math.nextafter(due, math.inf)

    def settle(
        self,
        decision: Decision,
        tenant: TenantLimits,
        request: RequestInfo,
        actual_mu: float,
        actual_tokens: int | None = None,
    ) -> Round:
        """The request ran and cost ``actual_mu`` (``actual_tokens``): correct every meter it was charged."""
        return Round(self._settle(decision, tenant, request, actual_mu, actual_tokens))

    def close(self, now: float) -> Round:
        """Reject everything queued (the service stops); later submissions are rejected too."""
        return Round(self._close(now))

    def cancel(self, entry: QueueEntry) -> None:
        """Whoever waited for ``entry`` gave up before it was decided: it leaves the queue."""
        if entry.decision is None:
            self.core.queue.remove(entry)
            key = (entry.tenant.name, entry.request.model)
            held = self._exposed.get(key)
            if held is not None and held.entry is entry:
                del self._exposed[key]

    # --------------------------------------------------------------------------------------- internals
    def _submit(self, entry: QueueEntry, now: float, try_alone: bool) -> Generator[Command, _Reply, None]:
        core = self.core
        if core.immediate(entry, now) is not None:
            return
        yield from self._budget(entry)
        if try_alone and len(core.queue) == 0:
            # Nobody waits, so no order to keep; concurrent takes are atomic in the store.
            yield from self._run(core.pump(now, self.capacity_of, entry), now)
            if entry.decision is not None:
                return
        yield Exclusive()
        if self.closed:  # closed meanwhile: nothing would ever wake it
            entry.retry_after_s = max(entry.retry_after_s, 1.0)
            core.finish_rejected(entry, Reason.STORE_UNAVAILABLE, now)
            return
        accepted, evicted = core.enqueue(entry, now)
        if evicted is not None:
            yield Resolve(evicted)
        if not accepted:
            yield from self._run(core.pump(now, self.capacity_of, entry), now)
            if entry.decision is None:
                core.finish_rejected(entry, Reason.QUEUE_FULL, now)
            return
        late = self._expire_before(now)
        yield from self._run(core.pump_arrival(entry, now, self.capacity_of, expire_before=late), now)
        if entry.decision is None:
            core.give_up_if_hopeless(entry, now)

    def _budget(self, entry: QueueEntry) -> Generator[Command, _Reply, None]:
        """Let ``entry`` run on its estimate, or charge it its bound (see the module docstring)."""
        r = entry.request
        if r.bound_mu is None or r.bound_mu <= r.cost_mu:
            return
        key = (entry.tenant.name, r.model)
        held = self._exposed.get(key)
        if held is not None and held.entry.decision is not None and not held.entry.decision.allowed:
            held = None  # refused: it holds nothing
        if held is None:
            self._exposed[key] = _Exposure(entry, r.bound_mu - r.cost_mu)
            return
        entry.request = replace(r, cost_mu=r.bound_mu)
        decision = held.entry.decision
        if decision is not None and not held.upgraded:  # running on its estimate: charge it the rest now
            held.upgraded = True
            deltas = tuple(
                replace(c, amount=held.gap)
                for c in decision.charges
                if c.kind in (ChargeKind.MU, ChargeKind.FLEET)
            )
            if deltas:
                yield AdjustCharges(entry.tenant, deltas, ())

    def _pump(self, now: float, expire_before: float | None) -> Generator[Command, _Reply, None]:
        yield Exclusive()
        yield from self._run(self.core.pump(now, self.capacity_of, expire_before=expire_before), now)

    def _run(self, p: PumpPass, now: float) -> Generator[Command, _Reply, None]:
        """Drive one pass: each attempt becomes a take; then resolve what it decided, note the next wake."""
        while (a := p.next_attempt()) is not None:
            entry = a.entry
            reply = yield TakeCharges(entry.tenant, a.charges, entry.request.cost_mu, entry.seq)
            if isinstance(reply, TakeOutcome):
                p.report(a, reply)
            elif reply:  # fail open: admitted unmetered, so settle must not refund anything either
                p.report(replace(a, charges=()), TakeOutcome(True, 0.0, (), {}, now))
            else:
                entry.retry_after_s = max(entry.retry_after_s, 1.0)
                self.core.finish_rejected(entry, Reason.STORE_UNAVAILABLE, now)
                p.finished.append(entry)
        if p.full or p.arrival:
            self._note_wake(p, now)
        for e in p.finished:
            yield Resolve(e)

    def _note_wake(self, p: PumpPass, now: float) -> None:
        wake = None if p.min_retry_s is None else now + p.min_retry_s
        valid_until = self.core.wake_at()
        if valid_until is not None and not math.isinf(valid_until):
            wake = valid_until if wake is None else min(wake, valid_until)
        deadline = self.core.queue.next_deadline()
        if deadline is not None:
            wake = deadline if wake is None else min(wake, deadline)
        if not p.full and self._next_wake is not None:  # a pass over one arrival: keep the queue's wake
            wake = self._next_wake if wake is None else min(wake, self._next_wake)
        self._next_wake = wake

    def _settle(
        self,
        decision: Decision,
        tenant: TenantLimits,
        request: RequestInfo,
        actual_mu: float,
        actual_tokens: int | None,
    ) -> Generator[Command, _Reply, None]:
        # what was charged: the estimate the meters got, plus the rest of the bound if it was upgraded
        estimate = next(
            (c.amount for c in decision.charges if c.kind in (ChargeKind.MU, ChargeKind.FLEET)),
            request.cost_mu,
        )
        key = (tenant.name, request.model)
        held = self._exposed.get(key)
        if held is not None and held.entry.decision is decision:
            del self._exposed[key]
            if held.upgraded:
                estimate += held.gap
        deltas = settle_deltas(decision, actual_mu, estimate, actual_tokens, estimated_tokens(request))
        yield AdjustCharges(tenant, deltas, decision.charges)
        if decision.tier not in (Tier.PROBE, Tier.UNLIMITED, None):
            self.core.settled(decision, tenant, request, actual_mu)
        if any(d.amount < 0 for d in deltas):
            self._next_wake = None
            if len(self.core.queue):
                yield Wake()

    def _close(self, now: float) -> Generator[Command, _Reply, None]:
        yield Exclusive()
        self.closed = True
        for entry in self.core.queue.ordered():
            entry.retry_after_s = max(entry.retry_after_s, 1.0)
            self.core.finish_rejected(entry, Reason.STORE_UNAVAILABLE, now)
            yield Resolve(entry)
