"""Leader election among gateway replicas, sans-IO: given the lease last read and the time, what to write.

Several gateways in front of the same engines must act as one: exactly one runs each deployment's
autoscaler and remediation. They agree through a lease held in a shared store (a Kubernetes
``coordination.k8s.io/v1`` Lease, or a Redis key): one record with the holder's identity, how long the lease
lasts without renewal, when it was acquired and last renewed, and how many times it changed hands. The store
does compare-and-swap (a Lease's ``resourceVersion``; a Lua compare in Redis), so of several candidates
writing the same observed version one wins. The shells in ``providers/leader*.py`` read, ask
:class:`LeaderElection` and write; this module does no I/O and takes both clocks as arguments.

The rules follow the Lease API's documented semantics (``leaseDurationSeconds`` "is measured against the time
of last observed renewTime"):

* a candidate judges expiry by its own monotonic clock from the moment it *observed* the record change, never
  by comparing the record's wall-clock ``renewTime`` with its own clock (clocks of two hosts differ);
* the holder renews (same ``acquireTime`` and ``leaseTransitions``, new ``renewTime``); a new holder takes an
  expired or released lease (``leaseTransitions`` + 1) or creates the first one;
* the holder counts as leader only until ``renew_deadline_s`` after its last successful renewal *was sent*,
  which is shorter than the lease, so it stops acting before any other candidate may take over;
* stepping down on shutdown writes an empty holder, so another takes over at its next try.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One lease as stored (times are wall-clock seconds since the epoch; ``holder`` "" means released)."""

    holder: str
    duration_s: float
    acquired_at: float | None = None
    renewed_at: float | None = None
    transitions: int = 0


@dataclass(frozen=True, slots=True)
class ElectionTiming:
    """client-go's three durations. Takeover after the leader dies: at most ``lease_duration_s`` +
    ``retry_period_s`` (plus one round trip)."""

    lease_duration_s: float = 10.0
    renew_deadline_s: float = 7.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("need 0 < retry_period_s < renew_deadline_s < lease_duration_s")


class LeaderElection:
    """One candidate's view: the record last observed (and when, by its monotonic clock), and its own last
    successful write. Feed it :meth:`observe`, ask :meth:`attempt`, report :meth:`written`."""

    def __init__(self, identity: str, timing: ElectionTiming | None = None) -> None:
        if not identity:
            raise ValueError("a candidate needs a non-empty identity")
        self.identity = identity
        self.timing = timing or ElectionTiming()
        self.observed: LeaseRecord | None = None
        self.observed_at: float | None = None  # monotonic time the observed record last changed
        self.renewed_at: float | None = None  # monotonic time our last successful write was sent

    def observe(self, record: LeaseRecord | None, now: float) -> None:
        """The record just read from the store (None: there is none). Expiry counts from a *change*."""
        if self.observed_at is None or record != self.observed:
            self.observed = record
            self.observed_at = now

    def expired(self, now: float) -> bool:
        """Whether the observed lease may be taken: none, released, or not renewed for its duration."""
        rec = self.observed
        if rec is None or not rec.holder:
            return True
        assert self.observed_at is not None
        return now >= self.observed_at + rec.duration_s

    def attempt(self, now: float, wall: float) -> LeaseRecord | None:
        """The record to write now (create when nothing was observed, else compare-and-swap over it), or
        None when another candidate holds a live lease."""
        t = self.timing
        rec = self.observed
        if rec is None:
            return LeaseRecord(self.identity, t.lease_duration_s, wall, wall, 0)
        if rec.holder == self.identity:
            return replace(rec, duration_s=t.lease_duration_s, renewed_at=wall)
        if not self.expired(now):
            return None
        return LeaseRecord(self.identity, t.lease_duration_s, wall, wall, rec.transitions + 1)

    def written(self, record: LeaseRecord, sent_at: float) -> None:
        """The store took ``record`` (the write was sent at monotonic ``sent_at``)."""
        self.observed = record
        self.observed_at = sent_at
        self.renewed_at = sent_at if record.holder == self.identity else None

    def lost(self) -> None:
        """The store refused our write (another candidate's version won): not leader any more."""
        self.renewed_at = None

    def leading(self, now: float) -> bool:
        """Whether this candidate may act now (holder, and its last renewal within the renew deadline)."""
        return (
            self.renewed_at is not None
            and self.observed is not None
            and self.observed.holder == self.identity
            and now < self.renewed_at + self.timing.renew_deadline_s
        )

    def release(self, wall: float) -> LeaseRecord | None:
        """The record that hands the lease back (empty holder), if we hold it; then not leading."""
        rec = self.observed
        self.renewed_at = None
        if rec is None or rec.holder != self.identity:
            return None
        return replace(rec, holder="", duration_s=1.0, renewed_at=wall)

    def next_try_in(self, now: float) -> float:
        """Seconds until the next read: the retry period, or sooner when the observed lease expires."""
        period = self.timing.retry_period_s
        rec = self.observed
        if rec is None or not rec.holder or rec.holder == self.identity or self.observed_at is None:
            return period
        return max(0.05, min(period, self.observed_at + rec.duration_s - now + 0.01))
