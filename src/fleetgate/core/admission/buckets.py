"""GCRA buckets in model units (or tokens, or requests): pure arithmetic, time passed in.

A bucket is a GCRA meter kept as a *level*: the MU charged and not yet drained. It drains at ``rate`` MU/s.
A charge of ``cost`` is allowed when ``level <= max(burst - cost, 0)``, so a request larger than the burst
still passes when the bucket is empty. Hence in any window of ``W`` seconds a bucket admits at most
``rate * W + max(burst, largest cost)``; with the default burst of 0 a limit of L MU/min is exceeded in any
60 s window by at most one request's cost. The tokens a client can still use,
``clamp(burst - level, 0, burst)``, never go negative nor above the burst; a level above the burst is debt
(a settle that cost more than estimated), repaid by draining before the next admission.

Admission charges the *estimate*; settle adds ``actual - estimate`` (a refund when negative; a refund never
lowers a level below 0, i.e. never fills a bucket above its burst). The Redis store (stores/redis.py)
implements ``take_all``/``adjust_all`` with the same arithmetic in Lua.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

EPS = 1e-9
"""Slack in comparisons so that float drain arithmetic never denies an exactly-full bucket."""

MIN_RETRY_AFTER_S = 0.001
"""Every denial carries at least this much ``retry_after`` (retry_after > 0 exactly when denied)."""


# ---------------------------------------------------------------------------------------------- buckets
@dataclass(frozen=True, slots=True)
class BucketParams:
    """A meter that drains ``rate_per_s`` MU (or tokens, or requests) per second and tolerates ``burst``."""

    rate_per_s: float
    burst: float = 0.0

    def __post_init__(self) -> None:
        if not (self.rate_per_s > 0 and math.isfinite(self.rate_per_s)):
            raise ValueError(f"rate_per_s must be positive and finite, got {self.rate_per_s!r}")
        if not (self.burst >= 0 and math.isfinite(self.burst)):
            raise ValueError(f"burst must be >= 0 and finite, got {self.burst!r}")

    @classmethod
    def per_minute(cls, per_min: float, burst_s: float = 0.0) -> BucketParams:
        """``per_min`` per minute, with a burst of ``burst_s`` seconds of that rate."""
        rate = per_min / 60.0
        return cls(rate_per_s=rate, burst=rate * max(0.0, burst_s))

    @property
    def per_min(self) -> float:
        return self.rate_per_s * 60.0


@dataclass(frozen=True, slots=True)
class BucketState:
    """``level``: charged and not yet drained (>= 0) as of ``updated_s``."""

    level: float = 0.0
    updated_s: float = 0.0

    def tokens(self, params: BucketParams) -> float:
        """What may still be taken at once: in ``[0, burst]``."""
        return min(params.burst, max(0.0, params.burst - self.level))

    def debt(self, params: BucketParams) -> float:
        """Charged beyond the burst (a settle above the estimate); repaid before the next admission."""
        return max(0.0, self.level - params.burst)


def drain(state: BucketState, params: BucketParams, now: float) -> BucketState:
    """The state at ``now`` (time never runs backwards: an older ``now`` changes nothing)."""
    elapsed = now - state.updated_s
    if elapsed <= 0:
        return state
    return BucketState(level=max(0.0, state.level - params.rate_per_s * elapsed), updated_s=now)


def threshold(params: BucketParams, cost: float) -> float:
    """Highest level at which a charge of ``cost`` is still allowed."""
    return max(params.burst - cost, 0.0)


def wait_s(state: BucketState, params: BucketParams, cost: float, now: float) -> float:
    """Seconds until ``cost`` may be charged (0 when it may now)."""
    level = drain(state, params, now).level
    excess = level - threshold(params, cost)
    return 0.0 if excess <= EPS else excess / params.rate_per_s


def charge(state: BucketState, params: BucketParams, cost: float, now: float) -> BucketState:
    """Charge unconditionally (callers check ``wait_s`` first, or charge non-enforced meters)."""
    s = drain(state, params, now)
    return BucketState(level=max(0.0, s.level + cost), updated_s=max(now, s.updated_s))


def adjust(state: BucketState, params: BucketParams, delta: float, now: float) -> BucketState:
    """Settle: add ``delta`` (negative = refund); the level never goes below 0 (tokens never above burst)."""
    return charge(state, params, delta, now)


def reset_s(state: BucketState, params: BucketParams, now: float) -> float:
    """Seconds until the bucket has fully drained (OpenAI's ``x-ratelimit-reset-*``)."""
    return drain(state, params, now).level / params.rate_per_s


def remaining_per_min(state: BucketState, params: BucketParams, now: float) -> float:
    """How much of the per-minute limit is still free (OpenAI's ``x-ratelimit-remaining-*``)."""
    return max(0.0, params.per_min - drain(state, params, now).level)


def available_now(state: BucketState, params: BucketParams, now: float, unit: float = 1.0) -> int:
    """How many charges of ``unit`` would pass back to back at ``now`` (what a client can send at once).

    Each passes while the level is at most ``max(burst - unit, 0)``: with no burst that is one charge on
    an empty meter and none otherwise, whatever is left of the per-minute figure.
    """
    level = drain(state, params, now).level
    limit = threshold(params, unit)
    if level - limit > EPS:
        return 0
    return math.floor((limit - level) / unit + EPS) + 1


# ---------------------------------------------------------------------------------------- multi-bucket
class ChargeKind(StrEnum):
    """What a meter counts (decides headers and which error a denial becomes)."""

    MU = "mu"  # the tenant's MU bucket of the tier (reservation or best-effort allowance)
    TOKENS = "tokens"  # optional tokens-per-minute limit
    REQUESTS = "requests"  # optional requests-per-minute limit
    FLEET = "fleet"  # the deployment's capacity meter (shared by all tenants)


@dataclass(frozen=True, slots=True)
class Charge:
    """One meter touched by one request: ``enforce=False`` charges without checking (reserved on fleet)."""

    key: str
    params: BucketParams
    amount: float
    kind: ChargeKind = ChargeKind.MU
    enforce: bool = True


@dataclass(frozen=True, slots=True)
class TakeOutcome:
    """Result of an all-or-nothing charge of several meters at ``now``."""

    allowed: bool
    retry_after_s: float
    blocked: tuple[str, ...]
    states: Mapping[str, BucketState]
    now: float

    def __post_init__(self) -> None:
        if self.allowed != (self.retry_after_s <= 0):
            raise ValueError("retry_after_s must be > 0 exactly when denied")


def take_all(states: Mapping[str, BucketState], charges: Sequence[Charge], now: float) -> TakeOutcome:
    """Charge every meter or none: denied when any enforced meter would have to wait.

    ``states`` maps keys to their stored state (missing = empty). The outcome's ``states`` are the new
    states of every key in ``charges`` (charged when allowed, merely drained when denied).
    """
    current = {c.key: drain(states.get(c.key, BucketState(0.0, now)), c.params, now) for c in charges}
    waits = {c.key: wait_s(current[c.key], c.params, c.amount, now) for c in charges if c.enforce}
    blocked = tuple(k for k, w in waits.items() if w > 0)
    if blocked:
        retry = max(MIN_RETRY_AFTER_S, max(waits[k] for k in blocked))
        return TakeOutcome(False, retry, blocked, current, now)
    new = dict(current)
    for c in charges:
        new[c.key] = charge(new[c.key], c.params, c.amount, now)
    return TakeOutcome(True, 0.0, (), new, now)


def adjust_all(
    states: Mapping[str, BucketState], deltas: Sequence[Charge], now: float
) -> dict[str, BucketState]:
    """Settle several meters: each gets ``amount`` added (refund when negative), clamped at level 0."""
    out: dict[str, BucketState] = {}
    for c in deltas:
        out[c.key] = adjust(states.get(c.key, BucketState(0.0, now)), c.params, c.amount, now)
    return out


class MemoryBuckets:
    """Bucket states in a dict: the in-memory store and the simulator both use this."""

    def __init__(self) -> None:
        self.states: dict[str, BucketState] = {}

    def take(self, charges: Sequence[Charge], now: float) -> TakeOutcome:
        out = take_all(self.states, charges, now)
        if out.allowed:
            self.states.update(out.states)
        return out

    def adjust(self, deltas: Sequence[Charge], now: float) -> None:
        self.states.update(adjust_all(self.states, deltas, now))

    def peek(self, charges: Sequence[Charge], now: float) -> dict[str, BucketState]:
        return {c.key: drain(self.states.get(c.key, BucketState(0.0, now)), c.params, now) for c in charges}
