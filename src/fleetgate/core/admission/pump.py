"""Passes over the queue and the decision-making core (queue, fairness, verdicts; no bucket state).

A pass tries queued entries in order; the caller (``machine.Round``) performs each attempt's charge on a
store and reports the outcome. An entry blocked on a bucket blocks later entries needing the same bucket
within one pass, so order is kept per bucket.

Cost of a pass (docs/benchmarks.md, "Admission queue under overload")
    A full pass sorts the queue, so it is O(n log n); it runs when something other than a new arrival may
    have changed the outcome: an admission or a settle (fair shares and meters moved), a meter that may have
    drained enough (the earliest unblock time the last pass saw), a blocking entry that left, a capacity
    change. It stops as soon as every queued entry has a blocked meter in each of its tiers; the skipped
    entries' notes (why they wait) are filled in when needed (``AdmissionCore.materialize``). A new arrival
    otherwise is tried alone behind the meters blocked by entries ranked ahead of it
    (``AdmissionCore.pump_arrival``), which decides exactly what a full pass would; its wait estimate uses
    per-(class, tenant) sums, and deadlines and evictions use heaps, so an arrival costs O(log n + classes x
    tenants) rather than a pass over the queue.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping

from fleetgate.core.admission.buckets import (
    EPS,
    MIN_RETRY_AFTER_S,
    BucketState,
    Charge,
    ChargeKind,
    TakeOutcome,
    wait_s,
)
from fleetgate.core.admission.decisions import (
    MAX_RETRY_AFTER_S,
    SATURATED_RETRY_S,
    Decision,
    Reason,
    denial_reason,
    read_meters,
)
from fleetgate.core.admission.planning import (
    AdmissionSettings,
    CapacityView,
    TenantLimits,
    Tier,
    plan_charges,
    request_priority,
)
from fleetgate.core.admission.queue import AdmissionQueue, Attempt, QueueEntry, _apply_skip
from fleetgate.core.fairness import VirtualTokenCounters
from fleetgate.core.types import PRIORITY_ORDER, Priority, RequestInfo


class PumpPass:
    """One pass over the queue in order; the caller performs each attempt's charge and reports back::

        p = core.pump(now, capacity_of)
        while (a := p.next_attempt()) is not None:
            p.report(a, store.take(a.charges, now))

    (``machine.Round`` is that caller; executors see its commands, never a pass.)

    ``blocked`` seeds the meters already blocked by entries ranked ahead (an incremental pass over one new
    entry, see ``AdmissionCore.pump_arrival``): meter key -> (wait, drained state).
    """

    def __init__(
        self,
        core: AdmissionCore,
        now: float,
        capacity_of: Callable[[str], CapacityView | None],
        only: QueueEntry | None = None,
        *,
        blocked: Mapping[str, tuple[float, BucketState | None]] | None = None,
        full: bool | None = None,
        expire_before: float | None = None,
    ) -> None:
        self.core = core
        self.now = now
        self.capacity_of = capacity_of
        self.finished: list[QueueEntry] = []  # entries with a final decision (admitted or rejected)
        self._only = only
        self.full = only is None if full is None else full  # a pass over the whole queue
        # a late pass (``expire_before`` < now) tries the entries whose deadline passed since it was due
        # once, and rejects those still waiting at its end
        self._late = only is None and expire_before is not None and expire_before < now
        if only is None:
            for e in core.queue.expired(now if expire_before is None else min(now, expire_before)):
                core.finish_rejected(e, Reason.DEADLINE, now)
                self.finished.append(e)
        self._blocked: dict[str, float] = {}  # meter key -> wait of the entry it blocked
        self._blocked_states: dict[str, BucketState] = {}
        for k, (w, st) in (blocked or {}).items():
            self._blocked[k] = w
            if st is not None:
                self._blocked_states[k] = st
        self._order: Iterator[QueueEntry] = iter([only] if only is not None else core.queue.ordered())
        self._pending: deque[Attempt] = deque()
        self._caps: dict[str, CapacityView | None] = {}
        self.min_retry_s: float | None = None
        self.unblock_s: float | None = None  # earliest time (store clock) a blocked meter frees up
        self.blockers: dict[str, tuple[QueueEntry, float, BucketState | None]] = {}  # first entry blocked
        self.admitted = False
        self.arrival = False
        self._closed = False
        self._check_stop = False
        self.stopped_early = False

    def capacity(self, model: str) -> CapacityView | None:
        """The deployment's capacity, read once per pass."""
        if model in self._caps:
            return self._caps[model]
        cap = self._caps[model] = self.capacity_of(model)
        return cap

    def next_attempt(self) -> Attempt | None:
        while True:
            if self._pending:
                a = self._pending.popleft()
                if a.entry.decision is not None or (self._only is None and a.entry not in self.core.queue):
                    continue
                blocked_map = self._blocked
                blocked = [c.key for c in a.charges if c.enforce and c.key in blocked_map]
                if blocked:
                    self._skip(a, blocked)
                    continue
                if a.tier == Tier.BEST_EFFORT and self._engines_saturated(a):
                    continue
                return a
            if self._check_stop and self.full:
                self._check_stop = False
                for e in self.core.queue.unplanned():
                    self._plan(e)  # as the pass will when it gets there (capacity is read once per pass)
                if self._blocked and self.core.queue.all_blocked(self._blocked, self.capacity):
                    # Every entry left would only be skipped: stop; their skip notes are filled in lazily.
                    self.stopped_early = True
                    self._order = iter(())
                    self.core._lazy = (self.core.pass_id, dict(self._blocked), dict(self._blocked_states))
            entry = next(self._order, None)
            if entry is not None and self.full:
                entry.seen_pass = self.core.pass_id
            if entry is None:
                if not self._closed:
                    self._closed = True
                    if self._late:
                        for e in self.core.queue.expired(self.now):
                            self.core.finish_rejected(e, Reason.DEADLINE, self.now)
                            self.finished.append(e)
                    self.core._after_pass(self)
                return None
            self._plan(entry)
            assert entry.plans is not None
            self._pending.extend(Attempt(entry, t, charges) for t, charges in entry.plans[1])

    def _engines_saturated(self, a: Attempt) -> bool:
        """A best-effort attempt while the engines queue, or while the deployment's best-effort limit
        (``CapacityView.best_effort_limit``, the latency headroom) is reached, is denied on the fleet meter
        without a store call (as if that meter were full), for ``SATURATED_RETRY_S``: by then a new scrape
        may show a free slot, or a request may have finished."""
        cap = self.capacity(a.entry.request.model)
        if cap is None:
            return False
        if not cap.engines_saturated and (
            cap.best_effort_limit is None
            or self.core.in_flight(a.entry.request.model, Tier.BEST_EFFORT) < cap.best_effort_limit
        ):
            return False
        fleet = [c.key for c in a.charges if c.kind == ChargeKind.FLEET and c.enforce]
        if not fleet:
            return False
        self.report(a, TakeOutcome(False, SATURATED_RETRY_S, (fleet[0],), {}, self.now))
        return True

    def _plan(self, entry: QueueEntry) -> None:
        cap = self.capacity(entry.request.model)
        if entry.plans is None or entry.plans[0] != cap:  # plans change only with the capacity
            st, tenant, r = self.core.settings, entry.tenant, entry.request
            plans = (cap, tuple((t, plan_charges(tenant, r, t, cap, st)) for t in entry.tiers))
            self.core.queue.set_plans(entry, plans)

    def _skip(self, a: Attempt, blocked: list[str]) -> None:
        """``a`` waits behind an earlier entry blocked on the same meter(s): remember why, for its verdict."""
        _apply_skip(a.entry, a.tier, a.charges, blocked, self._blocked, self._blocked_states)

    def report(self, attempt: Attempt, outcome: TakeOutcome) -> None:
        entry = attempt.entry
        self._check_stop = True
        if outcome.allowed:
            self.admitted = True
            self._pending.clear()
            self.core.finish_admitted(entry, attempt, outcome)
            self.finished.append(entry)
            return
        by_key = {c.key: c for c in attempt.charges}
        for k in outcome.blocked:
            self._blocked[k] = max(self._blocked.get(k, 0.0), outcome.retry_after_s)
            st = outcome.states.get(k)
            if st is not None:
                self._blocked_states.setdefault(k, st)
            if k not in self.blockers:
                self.blockers[k] = (entry, self.now + outcome.retry_after_s, st)  # blocked until
            # When this meter alone frees up for this charge (the entry may stay blocked on another).
            c = by_key.get(k)
            free_in = outcome.retry_after_s
            if c is not None and st is not None:
                free_in = max(MIN_RETRY_AFTER_S, wait_s(st, c.params, c.amount, st.updated_s))
                free_in = min(free_in, outcome.retry_after_s)
                free_in -= 4 * EPS / c.params.rate_per_s  # wait_s tolerates EPS: never assume too late
            at = self.now + max(0.0, free_in - 1e-9)
            self.unblock_s = at if self.unblock_s is None else min(self.unblock_s, at)
        if not outcome.blocked:  # denied without naming a meter: retry after its wait
            at = self.now + outcome.retry_after_s
            self.unblock_s = at if self.unblock_s is None else min(self.unblock_s, at)
        reason = denial_reason(attempt.charges, outcome.blocked)
        if reason == Reason.SATURATED:
            entry.capacity_blocked = True  # offered demand the fleet could not take (its verdict may be 429)
        # The first tier (the reservation when there is one) names the verdict; any tier may shorten the wait.
        if attempt.tier == entry.tiers[0] or entry.last_tier is None:
            entry.retry_after_s = outcome.retry_after_s
            entry.last_reason = reason
            entry.last_tier = attempt.tier
            entry.last_charges = attempt.charges
            entry.last_states = outcome.states
            kinds = {c.key: c.kind for c in attempt.charges}
            entry.last_blocked = tuple(kinds[k] for k in outcome.blocked if k in kinds)
        else:
            entry.retry_after_s = min(entry.retry_after_s, outcome.retry_after_s)
        self.min_retry_s = (
            outcome.retry_after_s
            if self.min_retry_s is None
            else min(self.min_retry_s, outcome.retry_after_s)
        )


class AdmissionCore:
    """Queue, fairness and decision-making; bucket state lives in a store the caller drives.

    ``capacity_of(model)`` gives the ledger's numbers for a deployment (``None`` when unknown).
    """

    def __init__(self, settings: AdmissionSettings | None = None) -> None:
        self.settings = settings or AdmissionSettings()
        self.queue = AdmissionQueue(self.settings.queue_max)
        self._seq = 0
        # What the last full pass learnt, kept up to date by arrivals: while it holds, a new arrival is
        # decided by trying it alone against the meters blocked by entries ranked ahead of it.
        self._valid = False
        self._valid_until = math.inf  # a blocked meter may free up then (pass clock)
        self._blockers: dict[str, tuple[QueueEntry, float, BucketState | None]] = {}
        self._caps: dict[str, CapacityView | None] = {}
        self._undo: tuple[QueueEntry, dict[str, tuple[QueueEntry, float, BucketState | None]], float] | None
        self._undo = None
        self.full_passes = 0
        self.arrival_passes = 0
        self.pass_id = 0
        # The last full pass that stopped early: (its id, blocked meters, their states). Queued entries it
        # did not reach (``seen_pass`` older) get its skip notes when they are next needed (materialize).
        self._lazy: tuple[int, dict[str, float], dict[str, BucketState]] | None = None
        # (deployment, tier) -> admitted and not yet settled (the best-effort limit counts against it)
        self._in_flight: dict[tuple[str, Tier], int] = {}

    def in_flight(self, model: str, tier: Tier) -> int:
        """Requests of ``tier`` admitted to ``model`` and not settled or released yet."""
        return self._in_flight.get((model, tier), 0)

    @property
    def vtc(self) -> VirtualTokenCounters:
        return self.queue.vtc

    def new_entry(
        self, tenant: TenantLimits, request: RequestInfo, now: float, deadline_s: float | None = None
    ) -> QueueEntry:
        self._seq += 1
        wait = self.settings.default_deadline_s if deadline_s is None else max(0.0, deadline_s)
        prio = request_priority(tenant, request)
        tiers = (Tier.PROBE,) if prio == Priority.PROBE else tenant.tiers(request.model)
        return QueueEntry(self._seq, request, tenant, prio, tiers, now, now + wait)

    def immediate(self, entry: QueueEntry, now: float) -> Decision | None:
        """A decision that needs no meter: probes and unlimited tenants pass; no tier = rate limited."""
        if entry.tiers and entry.tiers[0] in (Tier.PROBE, Tier.UNLIMITED):
            entry.decision = Decision(True, 0.0, Reason.OK, entry.tiers[0], admitted_s=now)
            return entry.decision
        if not entry.tiers:
            entry.decision = Decision(
                False,
                60.0,
                Reason.RATE_LIMITED,
                None,
                note=f"no reservation or allowance for model {entry.request.model}",
            )
            return entry.decision
        return None

    def enqueue(self, entry: QueueEntry, now: float) -> tuple[bool, QueueEntry | None]:
        """Queue ``entry``; returns (accepted, an evicted lower-priority entry, already rejected, if any).

        When refused, the caller may still try ``entry`` alone (``pump(..., only=entry)``) and must
        otherwise reject it with ``finish_rejected(entry, Reason.QUEUE_FULL, now)``.
        """
        entry.seen_pass = self.pass_id
        accepted, evicted = self.queue.push(entry)
        if evicted is not None:
            self.finish_rejected(evicted, Reason.QUEUE_FULL, now)
        return accepted, evicted

    def pump(
        self,
        now: float,
        capacity_of: Callable[[str], CapacityView | None],
        only: QueueEntry | None = None,
        *,
        expire_before: float | None = None,
    ) -> PumpPass:
        """A pass over the whole queue, or over ``only`` (an entry the full queue refused).

        ``expire_before``: entries whose deadline is before it are rejected first (default ``now``; a pass
        that runs late gives the time it was due, see ``AdmissionMachine.pump``).
        """
        if only is None:
            self._valid = False  # until this pass completes
            self.full_passes += 1
            self.pass_id += 1
        return PumpPass(self, now, capacity_of, only, expire_before=expire_before)

    def materialize(self, entry: QueueEntry) -> None:
        """Give ``entry`` the skip notes of the last full pass if that pass stopped before reaching it."""
        lazy = self._lazy
        if lazy is None or entry.seen_pass < 0 or entry.seen_pass >= lazy[0] or entry.plans is None:
            return
        entry.seen_pass = lazy[0]
        _pid, waits, states = lazy
        for tier, charges in entry.plans[1]:
            blocked = [c.key for c in charges if c.enforce and c.key in waits]
            if blocked:
                _apply_skip(entry, tier, charges, blocked, waits, states)

    def invalidate(self) -> None:
        """Something other than time changed the meters or the order (refund, capacity, fair shares): the
        next arrival runs a full pass."""
        self._valid = False
        self._undo = None

    def wake_at(self) -> float | None:
        """When a full pass may decide something new (``None``: now); deadlines are separate."""
        return self._valid_until if self._valid else None

    def pump_arrival(
        self,
        entry: QueueEntry,
        now: float,
        capacity_of: Callable[[str], CapacityView | None],
        *,
        expire_before: float | None = None,
    ) -> PumpPass:
        """The pass to run after ``entry`` was queued: equivalent to a full pass, but O(log n).

        Since the last full pass nothing was admitted, refunded or re-ranked and no meter can have freed up
        (time is before the earliest unblock), so every other queued entry is still blocked exactly as that
        pass found; only ``entry`` needs trying, behind the meters blocked by entries ranked ahead of it.
        Otherwise (or when a blocking entry left, or a capacity changed) this is a full pass.
        """
        expired = self.queue.expired(now if expire_before is None else min(now, expire_before))
        for e in expired:
            self.finish_rejected(e, Reason.DEADLINE, now)
        ok = self._valid and now < self._valid_until and entry in self.queue
        if ok:
            ok = all(b in self.queue for b, _w, _s in self._blockers.values())
        if ok:
            ok = all(capacity_of(m) == cap for m, cap in self._caps.items())
        if ok and expire_before is not None and expire_before < now:
            ok = False  # a late pass (rare): the full pass tries the entries whose deadline passed since
        if not ok:
            p = self.pump(now, capacity_of, expire_before=expire_before)
        else:
            self.arrival_passes += 1
            rank = self.queue._rank(entry)
            seed = {  # the blocker's wait as a pass would find it now (it drains as time passes)
                k: (max(MIN_RETRY_AFTER_S, until - now), st)
                for k, (b, until, st) in self._blockers.items()
                if self.queue._rank(b) < rank
            }
            entry.seen_pass = self.pass_id
            p = PumpPass(self, now, capacity_of, entry, blocked=seed, full=False)
            p.arrival = True
        p.finished[:0] = expired
        return p

    def _after_pass(self, p: PumpPass) -> None:
        if p.full:
            if p.admitted:
                return  # fair shares moved: the order may differ now, so the next arrival runs a full pass
            self._blockers = dict(p.blockers)
            self._valid_until = math.inf if p.unblock_s is None else p.unblock_s
            self._caps = dict(p._caps)
            self._valid = True
            self._undo = None
            return
        if not p.arrival or not self._valid or p.admitted:
            return
        entry = p._only
        assert entry is not None
        self._undo = (entry, dict(self._blockers), self._valid_until)
        if p.unblock_s is not None:
            self._valid_until = min(self._valid_until, p.unblock_s)
        rank = self.queue._rank(entry)
        if p.blockers and any(rank < self.queue._rank(b) for b, _u, _s in self._blockers.values()):
            # It now blocks meters ahead of entries a full pass tried: they would be skipped there and
            # their other meters left free, so what is blocked must be recomputed by a full pass.
            self.invalidate()
            return
        for k, b in p.blockers.items():
            self._blockers.setdefault(k, b)
        for m, cap in p._caps.items():
            self._caps.setdefault(m, cap)

    def estimated_wait(self, entry: QueueEntry) -> float:
        """The entry's own wait plus the time to drain what will be served before it on the meters it needs.

        Served before it: its tenant's entries ranked ahead, every entry of a higher class, and from each
        other tenant of its class about as much as its own tenant gets meanwhile (what VTC converges to).
        """
        self.materialize(entry)
        own = entry.retry_after_s if entry.last_tier is not None else entry.blocked_wait_s
        if entry.plans is None or not entry.plans[1]:
            return own
        first = [c for c in entry.plans[1][0][1] if c.enforce]
        if not first:
            return own
        keys = {c.key for c in first}
        order = PRIORITY_ORDER[entry.priority]
        if entry in self.queue and self.queue.newest_of(entry.priority, entry.tenant.name) is entry:
            return own + self._wait_from_sums(entry, first, keys, order)
        rank = self.queue._rank(entry)
        mine: dict[str, float] = dict.fromkeys(keys, 0.0)
        higher: dict[str, float] = dict.fromkeys(keys, 0.0)
        peers: dict[tuple[str, str], float] = {}
        weights: dict[str, float] = {}
        for other in self.queue.ordered():
            if other is entry or other.plans is None or not other.plans[1]:
                continue
            o = PRIORITY_ORDER[other.priority]
            if o > order:
                continue
            for c in other.plans[1][0][1]:
                if c.key not in keys:
                    continue
                if other.tenant.name == entry.tenant.name:
                    if self.queue._rank(other) < rank:
                        mine[c.key] += c.amount
                elif o < order:
                    higher[c.key] += c.amount
                else:
                    peers[(other.tenant.name, c.key)] = peers.get((other.tenant.name, c.key), 0.0) + c.amount
                    weights[other.tenant.name] = other.tenant.weight
        return own + _wait_behind(entry, first, mine, higher, peers, weights)

    def _wait_from_sums(self, entry: QueueEntry, first: list[Charge], keys: set[str], order: int) -> float:
        """``estimated_wait``'s sum for the newest entry of its (class, tenant), from the queue's per-(class,
        tenant) sums: O(classes x tenants) instead of a pass over the queue."""
        mine: dict[str, float] = dict.fromkeys(keys, 0.0)
        higher: dict[str, float] = dict.fromkeys(keys, 0.0)
        peers: dict[tuple[str, str], float] = {}
        weights: dict[str, float] = {}
        name = entry.tenant.name
        own_contrib = self.queue._contrib.get(entry.seq, {})
        for prio, tenant, g in self.queue.groups():
            o = PRIORITY_ORDER[prio]
            if o > order or not g.sums:
                continue
            for k in keys:
                mu = g.sums.get(k)
                if mu is None:
                    continue
                if tenant == name:
                    if o == order:
                        mu -= own_contrib.get(k, 0.0)  # everything of its own but itself ranks ahead
                    mine[k] += mu
                elif o < order:
                    higher[k] += mu
                else:
                    peers[(tenant, k)] = peers.get((tenant, k), 0.0) + mu
                    weights[tenant] = g.weight
        return _wait_behind(entry, first, mine, higher, peers, weights)

    def give_up_if_hopeless(self, entry: QueueEntry, now: float) -> bool:
        """Reject a still-queued entry now when its estimated wait ends after its deadline."""
        if entry not in self.queue:
            return False
        wait = self.estimated_wait(entry)
        if now + wait > entry.deadline_s:
            self.queue.remove(entry)
            if self._undo is not None and self._undo[0] is entry:
                # It never got in: what the queue had learnt before it arrived still holds.
                _e, self._blockers, self._valid_until = self._undo
            self._undo = None
            entry.retry_after_s = max(entry.retry_after_s, wait)
            self.finish_rejected(entry, entry.last_reason, now)
            return True
        return False

    def finish_admitted(self, entry: QueueEntry, attempt: Attempt, outcome: TakeOutcome) -> None:
        self.queue.remove(entry)
        self.invalidate()
        self.vtc.charge(entry.priority, entry.tenant.name, entry.request.cost_mu, entry.tenant.weight)
        key = (entry.request.model, attempt.tier)
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        entry.decision = Decision(
            True,
            0.0,
            Reason.OK,
            attempt.tier,
            attempt.charges,
            read_meters(attempt.charges, outcome.states, outcome.now),
            admitted_s=outcome.now,
            waited_s=max(0.0, outcome.now - entry.enqueued_s),
        )

    def finish_rejected(self, entry: QueueEntry, reason: Reason, now: float) -> None:
        self.materialize(entry)
        self.queue.remove(entry)
        retry = max(MIN_RETRY_AFTER_S, entry.retry_after_s)
        if entry.last_reason != Reason.RATE_LIMITED:
            # The tenant's own meters give an exact wait (Retry-After tells it, however long); idle capacity
            # for best-effort may come back any time, so that wait is capped.
            retry = min(MAX_RETRY_AFTER_S, retry)
        if reason == Reason.QUEUE_FULL:
            retry = max(retry, 1.0)
        tier = entry.last_tier or (entry.tiers[0] if entry.tiers else None)
        if reason in (Reason.QUEUE_FULL, Reason.DEADLINE) and entry.priority == Priority.BEST_EFFORT:
            tier = Tier.BEST_EFFORT
        meters = read_meters(entry.last_charges, entry.last_states, now)
        cause = entry.last_reason if entry.last_tier is not None or entry.last_blocked else None
        waited = max(0.0, now - entry.enqueued_s)
        for_capacity = reason != Reason.STORE_UNAVAILABLE and (
            entry.capacity_blocked
            or reason == Reason.SATURATED
            or cause == Reason.SATURATED
            or (reason == Reason.QUEUE_FULL and tier == Tier.BEST_EFFORT)
        )
        entry.decision = Decision(
            False, retry, reason, tier, (), meters, waited_s=waited, cause=cause, for_capacity=for_capacity
        )

    def settled(
        self, decision: Decision, tenant: TenantLimits, request: RequestInfo, actual_mu: float
    ) -> None:
        """Correct the fairness counter by ``actual - estimate`` (and note that meters were refunded)."""
        self.invalidate()
        key = (request.model, decision.tier) if decision.tier is not None else None
        if key is not None and key in self._in_flight:
            left = self._in_flight[key] - 1
            if left > 0:
                self._in_flight[key] = left
            else:
                del self._in_flight[key]
        prio = request_priority(tenant, request)
        self.vtc.charge(prio, tenant.name, actual_mu - request.cost_mu, tenant.weight)


def _wait_behind(
    entry: QueueEntry,
    first: list[Charge],
    mine: dict[str, float],
    higher: dict[str, float],
    peers: dict[tuple[str, str], float],
    weights: dict[str, float],
) -> float:
    """Seconds until ``entry``'s first charges clear.

    Counts its own tenant's and higher classes' MU ahead of it, plus each same-class peer's MU up to that
    peer's fair (weighted) share of this entry's.
    """
    w_self = entry.tenant.weight if entry.tenant.weight > 0 else 1.0
    wait = 0.0
    for c in first:
        share = mine[c.key] + c.amount
        ahead = mine[c.key] + higher[c.key]
        for (name, key), mu in peers.items():
            if key == c.key:
                ahead += min(mu, share * weights[name] / w_self)
        wait = max(wait, ahead / c.params.rate_per_s)
    return wait
