"""Admission verdicts: why a request was (not) admitted, its HTTP status, and its meters as they stood.

The verdict carries numbers only; the gateway turns them into ``x-ratelimit-*`` and ``Retry-After`` headers
(``fleetgate.gateway.ratelimit``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from fleetgate.core.admission.buckets import (
    BucketState,
    Charge,
    ChargeKind,
    available_now,
    drain,
    remaining_per_min,
    reset_s,
)
from fleetgate.core.admission.planning import Tier

SATURATED_RETRY_S = 0.5
"""How long best-effort is held after the engines were found saturated (``CapacityView.engines_saturated``)
before it is tried again: about one metrics scrape (``scrape_interval_s``, 1 s by default) or less."""

MAX_RETRY_AFTER_S = 60.0
"""Retry-After for waits on the fleet's idle capacity (best-effort) is capped here; a wait on the tenant's own
meters is reported as it is."""


@dataclass(frozen=True, slots=True)
class MeterReading:
    """One of a tenant's meters at decision time, in its own unit (requests, tokens or MU) per minute.

    ``remaining``: for requests, how many may be sent right now and pass (a paced meter admits one at a
    time, however much of the minute is left); for tokens and MU, the per-minute limit less what has not
    drained yet. ``reset_s``: seconds until the meter has fully drained.
    """

    kind: ChargeKind
    limit_per_min: float
    remaining: float
    reset_s: float


def read_meters(
    charges: Sequence[Charge], states: Mapping[str, BucketState], now: float
) -> tuple[MeterReading, ...]:
    """The first meter of each kind the tenant is charged to (the fleet meter is not the tenant's)."""
    seen: set[ChargeKind] = set()
    out: list[MeterReading] = []
    for c in charges:
        if c.kind in seen or c.kind == ChargeKind.FLEET:
            continue
        seen.add(c.kind)
        st = drain(states.get(c.key, BucketState(0.0, now)), c.params, now)
        if c.kind == ChargeKind.REQUESTS:
            remaining = float(available_now(st, c.params, now))
        else:
            remaining = remaining_per_min(st, c.params, now)
        out.append(MeterReading(c.kind, c.params.per_min, remaining, reset_s(st, c.params, now)))
    return tuple(out)


class Reason(StrEnum):
    OK = "ok"
    RATE_LIMITED = "rate_limited"  # the tenant's own meters: 429
    SATURATED = "saturated"  # best-effort and the fleet meter is full: 503
    QUEUE_FULL = "queue_full"  # 503 for best-effort, 429 for reserved
    DEADLINE = "deadline"  # waited in the queue until its deadline
    STORE_UNAVAILABLE = "store_unavailable"  # shared store unreachable and fail-closed: 503


@dataclass(frozen=True, slots=True)
class Decision:
    """The admission verdict for one request; ``retry_after_s > 0`` exactly when not allowed."""

    allowed: bool
    retry_after_s: float
    reason: Reason
    tier: Tier | None = None
    charges: tuple[Charge, ...] = ()
    meters: tuple[MeterReading, ...] = ()  # the tenant's meters as they stood (for x-ratelimit-* headers)
    admitted_s: float | None = None
    waited_s: float = 0.0
    cause: Reason | None = None  # for QUEUE_FULL / DEADLINE: what the request was waiting for
    note: str = ""  # why, when no meter explains it (e.g. no reservation on this model)
    #: denied for lack of capacity: some tier was refused only by the fleet meter (a reserved tenant's
    #: excess shed as best-effort included, whose verdict is the reservation's 429), or it waited for idle
    #: capacity. Offered demand the fleet did not serve: the autoscaler counts it (``DemandMeter.refused``).
    for_capacity: bool = False

    def __post_init__(self) -> None:
        if self.allowed != (self.retry_after_s <= 0):
            raise ValueError("retry_after_s must be > 0 exactly when denied")

    @property
    def status(self) -> int:
        """HTTP status the client sees (200 when admitted)."""
        if self.allowed:
            return 200
        if self.reason in (Reason.SATURATED, Reason.STORE_UNAVAILABLE):
            return 503
        if self.reason == Reason.QUEUE_FULL and self.tier == Tier.BEST_EFFORT:
            return 503  # best-effort shed from a full queue
        if self.reason == Reason.DEADLINE and self.cause == Reason.SATURATED:
            return 503  # waited for idle capacity that never came
        return 429


def denial_reason(charges: Sequence[Charge], blocked: Sequence[str]) -> Reason:
    """A denial by the tenant's own meters is a rate limit; one only by the fleet meter is saturation."""
    kinds = {c.key: c.kind for c in charges}
    if any(kinds.get(k) != ChargeKind.FLEET for k in blocked):
        return Reason.RATE_LIMITED
    return Reason.SATURATED


def settle_deltas(
    decision: Decision, actual_mu: float, estimate_mu: float, actual_tokens: int | None, estimate_tokens: int
) -> tuple[Charge, ...]:
    """What settle adds to each meter the admission charged (refund when negative)."""
    out: list[Charge] = []
    for c in decision.charges:
        if c.kind in (ChargeKind.MU, ChargeKind.FLEET):
            delta = actual_mu - estimate_mu
        elif c.kind == ChargeKind.TOKENS and actual_tokens is not None:
            delta = float(actual_tokens - estimate_tokens)
        else:
            continue
        if delta != 0:
            out.append(replace(c, amount=delta))
    return tuple(out)
