"""The bounded admission queue: entries, their per-tier plans, and the sums that keep an arrival O(log n).

Requests that cannot pass now may wait in one bounded queue, served in ``PRIORITY_ORDER`` (probes never
wait), then by virtual token counters between tenants of one class (core.fairness), then FIFO. Each entry
has a deadline.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from fleetgate.core.admission.buckets import MIN_RETRY_AFTER_S, BucketState, Charge, ChargeKind
from fleetgate.core.admission.decisions import Decision, Reason, denial_reason
from fleetgate.core.admission.planning import CapacityView, TenantLimits, Tier
from fleetgate.core.fairness import VirtualTokenCounters
from fleetgate.core.types import PRIORITY_ORDER, Priority, RequestInfo


@dataclass(slots=True, eq=False)
class QueueEntry:
    """One request waiting for admission."""

    seq: int
    request: RequestInfo
    tenant: TenantLimits
    priority: Priority
    tiers: tuple[Tier, ...]
    enqueued_s: float
    deadline_s: float
    retry_after_s: float = MIN_RETRY_AFTER_S
    last_reason: Reason = Reason.RATE_LIMITED
    last_tier: Tier | None = None
    last_charges: tuple[Charge, ...] = ()
    last_states: Mapping[str, BucketState] = field(default_factory=dict)
    last_blocked: tuple[ChargeKind, ...] = ()
    blocked_wait_s: float = 0.0  # when skipped behind an entry blocked on the same meter: that entry's wait
    #: some tier was refused only by the fleet meter (the tenant's own meters had room): lack of capacity
    capacity_blocked: bool = False
    decision: Decision | None = None
    plans: tuple[CapacityView | None, tuple[tuple[Tier, tuple[Charge, ...]], ...]] | None = None
    seen_pass: int = -1  # the full pass that last looked at it (-1: never queued)


def _apply_skip(
    entry: QueueEntry,
    tier: Tier,
    charges: tuple[Charge, ...],
    blocked: list[str],
    waits: Mapping[str, float],
    states: Mapping[str, BucketState],
) -> None:
    """``entry`` waits behind an earlier entry blocked on the same meter(s): remember why, for its verdict."""
    entry.blocked_wait_s = max(waits[k] for k in blocked)
    if not entry.capacity_blocked and denial_reason(charges, blocked) == Reason.SATURATED:
        entry.capacity_blocked = True
    if entry.last_tier is None and tier == entry.tiers[0]:
        kinds = {c.key: c.kind for c in charges}
        entry.last_reason = denial_reason(charges, blocked)
        entry.last_blocked = tuple(kinds[k] for k in blocked)
        entry.last_charges = charges
        entry.last_states = {k: states[k] for k in blocked if k in states}


_Signature = tuple[str, "CapacityView | None", tuple[frozenset[str], ...]] | None


def _signature(entry: QueueEntry) -> _Signature:
    """Model, capacity of its plans, and the enforced meters of each tier (``None``: no plans yet)."""
    if entry.plans is None:
        return None
    keysets = tuple(frozenset(c.key for c in ch if c.enforce) for _t, ch in entry.plans[1])
    return (entry.request.model, entry.plans[0], keysets)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of one queued entry in one tier during a pump pass."""

    entry: QueueEntry
    tier: Tier
    charges: tuple[Charge, ...]


class _Group:
    """The queued entries of one (class, tenant): count, newest seq, and MU summed per meter key."""

    __slots__ = ("count", "seqs", "sums", "weight")

    def __init__(self) -> None:
        self.count = 0
        self.seqs: list[int] = []  # heap of -seq (lazy deletion): the newest member on top
        self.sums: dict[str, float] = {}  # first-tier charges of members with plans, per meter key
        self.weight = 1.0


def _contribution(entry: QueueEntry) -> dict[str, float]:
    """What ``entry`` adds to the meters of its first tier (``AdmissionCore.estimated_wait``'s unit)."""
    if entry.plans is None or not entry.plans[1]:
        return {}
    out: dict[str, float] = {}
    for c in entry.plans[1][0][1]:
        out[c.key] = out.get(c.key, 0.0) + c.amount
    return out


class AdmissionQueue:
    """Bounded priority queue; order: priority class, then VTC within the class, then arrival.

    Besides the entries it keeps, per (class, tenant), the count, the newest entry and the first-tier MU
    per meter, and a heap of deadlines, so that pushing, evicting, expiring and estimating a new entry's
    wait cost O(log n + classes x tenants) rather than a pass over the queue.
    """

    def __init__(self, max_size: int, vtc: VirtualTokenCounters | None = None) -> None:
        self.max_size = max_size
        self.vtc = vtc or VirtualTokenCounters()
        self._entries: dict[int, QueueEntry] = {}
        self._groups: dict[tuple[Priority, str], _Group] = {}
        self._deadlines: list[tuple[float, int]] = []  # heap (deadline, seq), lazy deletion
        self._contrib: dict[int, dict[str, float]] = {}
        self._sigs: dict[_Signature, int] = {}  # how many queued entries have each signature
        self._sig_of: dict[int, _Signature] = {}
        self._unplanned: dict[int, QueueEntry] = {}  # queued entries without plans yet (just arrived)

    def unplanned(self) -> list[QueueEntry]:
        return list(self._unplanned.values())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, entry: object) -> bool:
        return isinstance(entry, QueueEntry) and self._entries.get(entry.seq) is entry

    def push(self, entry: QueueEntry) -> tuple[bool, QueueEntry | None]:
        """Add ``entry``. When full, the entry that ranks last (lowest class, then the largest fair-share
        counter, then the newest) is evicted if it ranks below ``entry``; else ``entry`` is refused.

        Returns (accepted, evicted).
        """
        evicted: QueueEntry | None = None
        if len(self._entries) >= self.max_size:
            if not self._entries:
                return False, None
            worst = self._worst()
            if self._rank(worst)[:2] <= self._rank(entry)[:2]:
                return False, None
            self.remove(worst)
            evicted = worst
        self._entries[entry.seq] = entry
        g = self._groups.get((entry.priority, entry.tenant.name))
        if g is None:
            g = self._groups[(entry.priority, entry.tenant.name)] = _Group()
        g.count += 1
        g.weight = entry.tenant.weight
        heapq.heappush(g.seqs, -entry.seq)
        heapq.heappush(self._deadlines, (entry.deadline_s, entry.seq))
        self._add_contribution(entry, g)
        self._add_sig(entry)
        self.vtc.enter(entry.priority, entry.tenant.name)
        return True, evicted

    def _rank(self, e: QueueEntry) -> tuple[int, float, int]:
        return (PRIORITY_ORDER[e.priority], self.vtc.value(e.priority, e.tenant.name), e.seq)

    def _newest(self, g: _Group) -> QueueEntry | None:
        while g.seqs:
            e = self._entries.get(-g.seqs[0])
            if e is not None:
                return e
            heapq.heappop(g.seqs)
        return None

    def _worst(self) -> QueueEntry:
        """The entry that ranks last: one candidate per (class, tenant), its newest entry."""
        worst: QueueEntry | None = None
        worst_rank: tuple[int, float, int] | None = None
        for g in self._groups.values():
            e = self._newest(g)
            if e is None:
                continue
            r = self._rank(e)
            if worst_rank is None or r > worst_rank:
                worst, worst_rank = e, r
        assert worst is not None
        return worst

    def _add_sig(self, entry: QueueEntry) -> None:
        sig = self._sig_of[entry.seq] = _signature(entry)
        self._sigs[sig] = self._sigs.get(sig, 0) + 1
        if sig is None:
            self._unplanned[entry.seq] = entry

    def _drop_sig(self, entry: QueueEntry) -> None:
        sig = self._sig_of.pop(entry.seq)
        if sig is None:
            self._unplanned.pop(entry.seq, None)
        n = self._sigs[sig] - 1
        if n <= 0:
            del self._sigs[sig]
        else:
            self._sigs[sig] = n

    def all_blocked(
        self, blocked: Mapping[str, float], capacity: Callable[[str], CapacityView | None]
    ) -> bool:
        """Whether every queued entry has, in each of its tiers, an enforced meter in ``blocked`` (with its
        plans still current): then a pass would only skip the rest of the queue."""
        for sig in self._sigs:
            if sig is None:
                return False
            model, cap, keysets = sig
            if capacity(model) != cap:
                return False
            for ks in keysets:
                if not ks or ks.isdisjoint(blocked):
                    return False
        return True

    def _add_contribution(self, entry: QueueEntry, g: _Group) -> None:
        contrib = _contribution(entry)
        if contrib:
            self._contrib[entry.seq] = contrib
            for k, v in contrib.items():
                g.sums[k] = g.sums.get(k, 0.0) + v

    def _drop_contribution(self, entry: QueueEntry, g: _Group) -> None:
        contrib = self._contrib.pop(entry.seq, None)
        if contrib:
            for k, v in contrib.items():
                g.sums[k] = g.sums.get(k, 0.0) - v

    def set_plans(
        self,
        entry: QueueEntry,
        plans: tuple[CapacityView | None, tuple[tuple[Tier, tuple[Charge, ...]], ...]],
    ) -> None:
        """Give ``entry`` its per-tier charges (kept in the per-meter sums while it is queued)."""
        g = self._groups.get((entry.priority, entry.tenant.name)) if entry in self else None
        if g is not None:
            self._drop_contribution(entry, g)
            self._drop_sig(entry)
        entry.plans = plans
        if g is not None:
            self._add_contribution(entry, g)
            self._add_sig(entry)

    def remove(self, entry: QueueEntry) -> None:
        if self._entries.pop(entry.seq, None) is not None:
            key = (entry.priority, entry.tenant.name)
            g = self._groups[key]
            g.count -= 1
            self._drop_contribution(entry, g)
            self._drop_sig(entry)
            if g.count <= 0:
                del self._groups[key]  # also forgets float residue of the sums
            self.vtc.leave(entry.priority, entry.tenant.name)

    def ordered(self) -> list[QueueEntry]:
        return sorted(self._entries.values(), key=self._rank)

    def expired(self, now: float) -> list[QueueEntry]:
        """Remove and return the entries whose deadline has passed."""
        out: list[QueueEntry] = []
        heap = self._deadlines
        while heap and heap[0][0] < now:
            _d, seq = heapq.heappop(heap)
            e = self._entries.get(seq)
            if e is not None and e.deadline_s < now:
                out.append(e)
        out.sort(key=lambda e: e.seq)
        for e in out:
            self.remove(e)
        return out

    def next_deadline(self) -> float | None:
        heap = self._deadlines
        while heap and heap[0][1] not in self._entries:
            heapq.heappop(heap)
        if len(heap) > 4 * len(self._entries) + 64:  # many removed entries: rebuild
            self._deadlines = heap = [(e.deadline_s, e.seq) for e in self._entries.values()]
            heapq.heapify(heap)
        return heap[0][0] if heap else None

    def groups(self) -> Iterator[tuple[Priority, str, _Group]]:
        for (prio, tenant), g in self._groups.items():
            yield prio, tenant, g

    def newest_of(self, priority: Priority, tenant: str) -> QueueEntry | None:
        g = self._groups.get((priority, tenant))
        return None if g is None else self._newest(g)
