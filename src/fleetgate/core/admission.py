"""Admission in model units (MU): buckets, tiers, priority queue and fairness. Pure: time is passed in.

Buckets
    A bucket is a GCRA meter kept as a *level*: the MU charged and not yet drained. It drains at ``rate``
    MU/s. A charge of ``cost`` is allowed when ``level <= max(burst - cost, 0)``, so a request larger than the
    burst still passes when the bucket is empty. Hence in any window of ``W`` seconds a bucket admits at most
    ``rate * W + max(burst, largest cost)``; with the default burst of 0 a limit of L MU/min is exceeded in
    any 60 s window by at most one request's cost. The tokens a client can still use,
    ``clamp(burst - level, 0, burst)``, never go negative nor above the burst; a level above the burst is
    debt (a settle that cost more than estimated), repaid by draining before the next admission.

Reserve, then settle
    Admission charges the *estimate*; settle adds ``actual - estimate`` (a refund when negative; a refund
    never lowers a level below 0, i.e. never fills a bucket above its burst).

Tiers
    ``reserved``: the tenant's reservation on the deployment (guaranteed; it also charges the deployment's
    fleet meter without being checked by it). ``best_effort``: the tenant's best-effort allowance *and* the
    fleet meter, whose rate is the capacity the ledger reports times a target utilisation; reserved traffic
    fills that meter first, so best-effort only gets unsold or idle capacity and is shed first (503).
    When every replica reports requests waiting in its own queue (``CapacityView.engines_saturated``), there
    is no idle capacity whatever the meters say: best-effort is held until a scrape shows a free slot.

Queue
    Requests that cannot pass now may wait in one bounded queue, served in ``PRIORITY_ORDER`` (probes never
    wait), then by virtual token counters between tenants of one class (core.fairness), then FIFO. Each
    entry has a deadline. An entry blocked on a bucket blocks later entries needing the same bucket within
    one pass, so order is kept per bucket.

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

The Redis store (stores/redis.py) implements ``take_all``/``adjust_all`` with the same arithmetic in Lua.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from fleetgate.core.fairness import VirtualTokenCounters
from fleetgate.core.types import PRIORITY_ORDER, Priority, RequestInfo

EPS = 1e-9
"""Slack in comparisons so that float drain arithmetic never denies an exactly-full bucket."""

MIN_RETRY_AFTER_S = 0.001
"""Every denial carries at least this much ``retry_after`` (retry_after > 0 exactly when denied)."""

SATURATED_RETRY_S = 0.5
"""How long best-effort is held after the engines were found saturated (``CapacityView.engines_saturated``)
before it is tried again: about one metrics scrape (``scrape_interval_s``, 1 s by default) or less."""

MAX_RETRY_AFTER_S = 60.0
"""Retry-After given to clients is capped here (e.g. best-effort with no capacity at all)."""


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


# ------------------------------------------------------------------------------------------------ headers
def format_duration(seconds: float) -> str:
    """OpenAI's reset format: ``20ms``, ``1.5s``, ``6m0s``."""
    seconds = max(0.0, seconds)
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60.0:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    minutes = int(seconds // 60)
    return f"{minutes}m{int(seconds - 60 * minutes)}s"


def rate_limit_headers(
    charges: Sequence[Charge], states: Mapping[str, BucketState], now: float
) -> dict[str, str]:
    """OpenAI ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (+ ``-mu``) for these meters.

    ``tokens`` reports the tenant's tokens-per-minute limit when it has one, else its MU bucket (then the
    unit is MU). Limits are per minute; ``remaining`` is the per-minute limit minus what is still undrained;
    ``reset`` is the time until the meter has fully drained.
    """
    by_kind: dict[ChargeKind, Charge] = {}
    for c in charges:
        by_kind.setdefault(c.kind, c)
    headers: dict[str, str] = {}

    def put(suffix: str, c: Charge, integer: bool) -> None:
        st = states.get(c.key, BucketState(0.0, now))
        limit, remaining = c.params.per_min, remaining_per_min(st, c.params, now)
        fmt: Callable[[float], str] = (
            (lambda v: str(math.floor(v + EPS)))
            if integer
            else (lambda v: f"{v:.3f}".rstrip("0").rstrip("."))
        )
        headers[f"x-ratelimit-limit-{suffix}"] = fmt(limit)
        headers[f"x-ratelimit-remaining-{suffix}"] = fmt(remaining)
        headers[f"x-ratelimit-reset-{suffix}"] = format_duration(reset_s(st, c.params, now))

    if ChargeKind.REQUESTS in by_kind:
        put("requests", by_kind[ChargeKind.REQUESTS], True)
    if ChargeKind.TOKENS in by_kind:
        put("tokens", by_kind[ChargeKind.TOKENS], True)
    if ChargeKind.MU in by_kind:
        if ChargeKind.TOKENS not in by_kind:
            put("tokens", by_kind[ChargeKind.MU], False)
        put("mu", by_kind[ChargeKind.MU], False)
    return headers


# ------------------------------------------------------------------------------------ tenants and tiers
class Tier(StrEnum):
    """Which meters a request is charged to."""

    PROBE = "probe"  # health probes: never limited
    UNLIMITED = "unlimited"  # no tenants configured (anonymous)
    RESERVED = "reserved"
    BEST_EFFORT = "best_effort"


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """A tenant's purchase, as the core needs it (admission/tenants.py builds it from config).

    ``priority`` is the class of its reserved traffic (interactive or batch; best_effort means it has no
    reservation class at all). ``best_effort_mu_per_min``: 0 = none, ``inf`` = only the fleet limits it.
    """

    name: str
    priority: Priority = Priority.INTERACTIVE
    reserved_mu_per_min: Mapping[str, float] = field(default_factory=dict)
    best_effort_mu_per_min: float = 0.0
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    weight: float = 1.0
    burst_s: float | None = None
    unlimited: bool = False

    def reservation(self, model: str) -> float:
        return (
            0.0 if self.priority == Priority.BEST_EFFORT else float(self.reserved_mu_per_min.get(model, 0.0))
        )

    def tiers(self, model: str) -> tuple[Tier, ...]:
        """Tiers to try, in order: the reservation first, then best-effort use of idle capacity."""
        if self.unlimited:
            return (Tier.UNLIMITED,)
        out: list[Tier] = []
        if self.reservation(model) > 0:
            out.append(Tier.RESERVED)
        if self.best_effort_mu_per_min > 0:
            out.append(Tier.BEST_EFFORT)
        return tuple(out)


ANONYMOUS = TenantLimits(name="anonymous", unlimited=True)


@dataclass(frozen=True, slots=True)
class CapacityView:
    """Capacity ledger numbers for one deployment, passed in (the ledger owns them).

    ``engines_saturated``: every routable replica reports requests waiting in its own queue (scraped), i.e.
    there is no idle capacity whatever the MU meters say (a slow or mis-calibrated engine, a host short of
    CPU). Best-effort is then held (503 or a queue wait) so that the slots that free up go to reserved
    traffic; reserved tenants are never held by it.
    """

    capacity_mu_per_min: float
    sold_mu_per_min: float = 0.0
    engines_saturated: bool = False

    @property
    def unsold_mu_per_min(self) -> float:
        return max(0.0, self.capacity_mu_per_min - self.sold_mu_per_min)


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    """Knobs shared by all tenants (config: ``admission``)."""

    burst_s: float = 0.0
    best_effort_max_utilization: float = 0.8
    fleet_burst_s: float = 2.0
    queue_max: int = 1000
    default_deadline_s: float = 10.0
    namespace: str = "fleetgate"


def _k(settings: AdmissionSettings, *parts: str) -> str:
    return ":".join((settings.namespace, *parts))


def estimated_tokens(request: RequestInfo) -> int:
    """Tokens charged against a tokens-per-minute limit at admission (settled to real usage later)."""
    out = (
        request.max_output_tokens
        if request.max_output_tokens is not None
        else request.estimated_output_tokens
    )
    return max(0, request.input_tokens) + max(0, out or 0)


def plan_charges(
    tenant: TenantLimits,
    request: RequestInfo,
    tier: Tier,
    capacity: CapacityView | None,
    settings: AdmissionSettings,
) -> tuple[Charge, ...]:
    """The meters one request charges in ``tier`` (all-or-nothing)."""
    if tier in (Tier.PROBE, Tier.UNLIMITED):
        return ()
    cost = max(0.0, request.cost_mu)
    burst_s = settings.burst_s if tenant.burst_s is None else tenant.burst_s
    name, model = tenant.name, request.model
    out: list[Charge] = []
    if tenant.requests_per_minute:
        out.append(
            Charge(
                _k(settings, "rpm", name),
                BucketParams.per_minute(tenant.requests_per_minute, burst_s),
                1.0,
                ChargeKind.REQUESTS,
            )
        )
    if tenant.tokens_per_minute:
        out.append(
            Charge(
                _k(settings, "tpm", name),
                BucketParams.per_minute(tenant.tokens_per_minute, burst_s),
                float(estimated_tokens(request)),
                ChargeKind.TOKENS,
            )
        )
    fleet_rate = 0.0
    if capacity is not None and capacity.capacity_mu_per_min > 0:
        fleet_rate = capacity.capacity_mu_per_min * settings.best_effort_max_utilization
    if tier == Tier.RESERVED:
        out.append(
            Charge(
                _k(settings, "res", name, model),
                BucketParams.per_minute(tenant.reservation(model), burst_s),
                cost,
                ChargeKind.MU,
            )
        )
        if fleet_rate > 0:
            out.append(
                Charge(
                    _k(settings, "fleet", model),
                    BucketParams.per_minute(fleet_rate, settings.fleet_burst_s),
                    cost,
                    ChargeKind.FLEET,
                    enforce=False,
                )
            )
    elif tier == Tier.BEST_EFFORT:
        if math.isfinite(tenant.best_effort_mu_per_min):
            out.append(
                Charge(
                    _k(settings, "be", name, model),
                    BucketParams.per_minute(tenant.best_effort_mu_per_min, burst_s),
                    cost,
                    ChargeKind.MU,
                )
            )
        if capacity is None:
            return tuple(out)  # capacity unknown: only the tenant's own allowance limits it
        if fleet_rate <= 0:
            fleet_rate = 1e-6  # no healthy capacity at all: best-effort is shed
        out.append(
            Charge(
                _k(settings, "fleet", model),
                BucketParams.per_minute(fleet_rate, settings.fleet_burst_s),
                cost,
                ChargeKind.FLEET,
            )
        )
    return tuple(out)


# ----------------------------------------------------------------------------------------- decisions
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
    headers: Mapping[str, str] = field(default_factory=dict)
    admitted_s: float | None = None
    waited_s: float = 0.0
    cause: Reason | None = None  # for QUEUE_FULL / DEADLINE: what the request was waiting for

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


# ------------------------------------------------------------------------------------------------ queue
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


def request_priority(tenant: TenantLimits, request: RequestInfo) -> Priority:
    """Probes are probes; otherwise the tenant's class, or best-effort when it has no reservation here."""
    if request.priority == Priority.PROBE:
        return Priority.PROBE
    tiers = tenant.tiers(request.model)
    if tenant.unlimited:
        return request.priority
    if Tier.RESERVED in tiers:
        # A tenant may mark a request as less urgent than its class, never as more urgent.
        cls = tenant.priority
        return request.priority if PRIORITY_ORDER[request.priority] > PRIORITY_ORDER[cls] else cls
    return Priority.BEST_EFFORT


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


class PumpPass:
    """One pass over the queue in order; the caller performs each attempt's charge and reports back.

    Used the same way by the pure ``LocalAdmission`` (in-memory buckets) and by the async service (any
    store)::

        p = core.pump(now, capacity_of)
        while (a := p.next_attempt()) is not None:
            p.report(a, store.take(a.charges, now))

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
    ) -> None:
        self.core = core
        self.now = now
        self.capacity_of = capacity_of
        self.finished: list[QueueEntry] = []  # entries with a final decision (admitted or rejected)
        self._only = only
        self.full = only is None if full is None else full  # a pass over the whole queue
        if only is None:
            for e in core.queue.expired(now):
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
                    self.core._after_pass(self)
                return None
            self._plan(entry)
            assert entry.plans is not None
            self._pending.extend(Attempt(entry, t, charges) for t, charges in entry.plans[1])

    def _engines_saturated(self, a: Attempt) -> bool:
        """A best-effort attempt while the engines queue is denied on the fleet meter without a store call
        (as if that meter were full), for ``SATURATED_RETRY_S``: by then a new scrape may show a free slot."""
        cap = self.capacity(a.entry.request.model)
        if cap is None or not cap.engines_saturated:
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
                headers={
                    "x-fleetgate-reason": f"no reservation or allowance for model {entry.request.model}"
                },
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
    ) -> PumpPass:
        """A pass over the whole queue, or over ``only`` (an entry the full queue refused)."""
        if only is None:
            self._valid = False  # until this pass completes
            self.full_passes += 1
            self.pass_id += 1
        return PumpPass(self, now, capacity_of, only)

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
        self, entry: QueueEntry, now: float, capacity_of: Callable[[str], CapacityView | None]
    ) -> PumpPass:
        """The pass to run after ``entry`` was queued: equivalent to a full pass, but O(log n).

        Since the last full pass nothing was admitted, refunded or re-ranked and no meter can have freed up
        (time is before the earliest unblock), so every other queued entry is still blocked exactly as that
        pass found; only ``entry`` needs trying, behind the meters blocked by entries ranked ahead of it.
        Otherwise (or when a blocking entry left, or a capacity changed) this is a full pass.
        """
        expired = self.queue.expired(now)
        for e in expired:
            self.finish_rejected(e, Reason.DEADLINE, now)
        ok = self._valid and now < self._valid_until and entry in self.queue
        if ok:
            ok = all(b in self.queue for b, _w, _s in self._blockers.values())
        if ok:
            ok = all(capacity_of(m) == cap for m, cap in self._caps.items())
        if not ok:
            p = self.pump(now, capacity_of)
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
        entry.decision = Decision(
            True,
            0.0,
            Reason.OK,
            attempt.tier,
            attempt.charges,
            rate_limit_headers(attempt.charges, outcome.states, outcome.now),
            admitted_s=outcome.now,
            waited_s=max(0.0, outcome.now - entry.enqueued_s),
        )

    def finish_rejected(self, entry: QueueEntry, reason: Reason, now: float) -> None:
        self.materialize(entry)
        self.queue.remove(entry)
        retry = min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, entry.retry_after_s))
        if reason == Reason.QUEUE_FULL:
            retry = max(retry, 1.0)
        tier = entry.last_tier or (entry.tiers[0] if entry.tiers else None)
        if reason in (Reason.QUEUE_FULL, Reason.DEADLINE) and entry.priority == Priority.BEST_EFFORT:
            tier = Tier.BEST_EFFORT
        headers = rate_limit_headers(entry.last_charges, entry.last_states, now)
        cause = entry.last_reason if entry.last_tier is not None or entry.last_blocked else None
        waited = max(0.0, now - entry.enqueued_s)
        entry.decision = Decision(False, retry, reason, tier, (), headers, waited_s=waited, cause=cause)

    def settled(
        self, decision: Decision, tenant: TenantLimits, request: RequestInfo, actual_mu: float
    ) -> None:
        """Correct the fairness counter by ``actual - estimate`` (and note that meters were refunded)."""
        self.invalidate()
        prio = request_priority(tenant, request)
        self.vtc.charge(prio, tenant.name, actual_mu - request.cost_mu, tenant.weight)


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


class LocalAdmission:
    """Synchronous admission over in-memory buckets: for the simulator and core tests (time passed in).

    ``submit`` returns a decision now, or ``None`` when the request waits in the queue; ``poll`` (call it
    whenever time advances) returns the decisions reached for queued requests.
    """

    def __init__(
        self,
        settings: AdmissionSettings | None = None,
        capacity_of: Callable[[str], CapacityView | None] | None = None,
    ) -> None:
        self.core = AdmissionCore(settings)
        self.buckets = MemoryBuckets()
        self.capacity_of: Callable[[str], CapacityView | None] = capacity_of or (lambda _m: None)
        self._queued: dict[str, QueueEntry] = {}
        self._next_wake: float | None = None  # nothing can change before then unless something is submitted

    def _run(self, now: float, only: QueueEntry | None = None, arrival: QueueEntry | None = None) -> PumpPass:
        if arrival is not None:
            p = self.core.pump_arrival(arrival, now, self.capacity_of)
        else:
            p = self.core.pump(now, self.capacity_of, only)
        while (a := p.next_attempt()) is not None:
            p.report(a, self.buckets.take(a.charges, now))
        if only is None:
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
        return p

    def submit(
        self, tenant: TenantLimits, request: RequestInfo, now: float, deadline_s: float | None = None
    ) -> Decision | None:
        entry = self.core.new_entry(tenant, request, now, deadline_s)
        d = self.core.immediate(entry, now)
        if d is not None:
            return d
        accepted, _evicted = self.core.enqueue(entry, now)
        if not accepted:
            self._run(now, only=entry)
            if entry.decision is None:
                self.core.finish_rejected(entry, Reason.QUEUE_FULL, now)
            return entry.decision
        self._queued[request.request_id] = entry
        self._run(now, arrival=entry)
        self.core.give_up_if_hopeless(entry, now)
        if entry.decision is not None:
            self._queued.pop(request.request_id, None)
            return entry.decision
        return None

    def poll(self, now: float) -> list[tuple[RequestInfo, Decision]]:
        if not self._queued:
            return []
        if self._next_wake is None or now >= self._next_wake:
            self._run(now)
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
        deltas = settle_deltas(decision, actual_mu, request.cost_mu, actual_tokens, estimated_tokens(request))
        self.buckets.adjust(deltas, now)
        if any(d.amount < 0 for d in deltas):
            self._next_wake = None  # a refund may let a queued request in
        self.core.settled(decision, tenant, request, actual_mu)

    @property
    def queued(self) -> int:
        return len(self.core.queue)


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
