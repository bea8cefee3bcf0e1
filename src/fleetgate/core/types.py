"""Plain, frozen values passed between the core and its shells."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol


class RandomSource(Protocol):
    """The only randomness the core sees (``random.Random`` and numpy generators both fit)."""

    def random(self) -> float: ...


class HealthState(StrEnum):
    """Health of one replica as judged by the prober (core.health)."""

    HEALTHY = "healthy"
    SUSPECT = "suspect"
    UNHEALTHY = "unhealthy"
    RESTARTING = "restarting"
    STARTING = "starting"


class Priority(StrEnum):
    """Admission and dispatch classes, most urgent first (see PRIORITY_ORDER)."""

    PROBE = "probe"
    INTERACTIVE = "interactive"
    BATCH = "batch"
    BEST_EFFORT = "best_effort"


PRIORITY_ORDER: Mapping[Priority, int] = MappingProxyType(
    {
        Priority.PROBE: 0,
        Priority.INTERACTIVE: 1,
        Priority.BATCH: 2,
        Priority.BEST_EFFORT: 3,
    }
)


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What the core knows about one request before it is dispatched.

    ``prefix_hashes`` are chained hashes of consecutive prompt blocks (``prefix_block_tokens`` tokens each):
    two requests share a cached prefix exactly as far as their leading hashes agree. The live gateway derives
    them from the prompt text; the simulator takes them from the trace (Mooncake ``hash_ids``).
    """

    request_id: str
    model: str
    tenant: str = "anonymous"
    input_tokens: int = 0
    max_output_tokens: int | None = None
    estimated_output_tokens: int = 0
    cost_mu: float = 0.0
    stream: bool = False
    priority: Priority = Priority.INTERACTIVE
    session_key: str | None = None
    prefix_hashes: tuple[int, ...] = ()
    prefix_block_tokens: int = 16
    image_tokens: int = 0
    arrival_s: float = 0.0
    #: MU the request costs at most (its whole output budget: ``max_tokens``, else the context length);
    #: ``None`` when unknown. Admission charges it instead of ``cost_mu`` while the tenant already has a
    #: request in flight on an optimistic estimate (``core.admission.machine``).
    bound_mu: float | None = None

    @classmethod
    def of(
        cls,
        request_id: str,
        model: str,
        tenant: str,
        input_tokens: int,
        max_output_tokens: int | None,
        estimated_output_tokens: int,
        cost_mu: float,
        stream: bool,
        priority: Priority,
        session_key: str | None,
        prefix_hashes: tuple[int, ...],
        prefix_block_tokens: int,
        image_tokens: int,
        arrival_s: float,
        bound_mu: float | None,
    ) -> RequestInfo:
        """``RequestInfo(...)`` with every field given, built the cheap way (see ``_filler``): the gateway
        makes one per request."""
        o = _REQUEST_INFO_FILL()
        o.request_id = request_id
        o.model = model
        o.tenant = tenant
        o.input_tokens = input_tokens
        o.max_output_tokens = max_output_tokens
        o.estimated_output_tokens = estimated_output_tokens
        o.cost_mu = cost_mu
        o.stream = stream
        o.priority = priority
        o.session_key = session_key
        o.prefix_hashes = prefix_hashes
        o.prefix_block_tokens = prefix_block_tokens
        o.image_tokens = image_tokens
        o.arrival_s = arrival_s
        o.bound_mu = bound_mu
        o.__class__ = cls
        return o


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    """One replica as the router sees it at decision time.

    ``inflight_*`` are the gateway's own counters (updated at dispatch and settle, so they never lag);
    the ``engine_*`` fields come from scraping the engine's /metrics and may be ``None`` when unknown.
    """

    name: str
    url: str = ""
    health: HealthState = HealthState.HEALTHY
    draining: bool = False
    inflight_requests: int = 0
    inflight_mu: float = 0.0
    capacity_mu_per_min: float = 100.0
    engine_waiting: int | None = None
    engine_running: int | None = None
    engine_kv_usage: float | None = None
    engine_prefix_hit_rate: float | None = None
    consecutive_failures: int = 0
    ejected_until_s: float = 0.0
    #: Engine rates learned online for this replica (``None`` until enough observations): prompt tokens
    #: prefilled per second, and seconds per decoded token. The router prefers a configured rate when set.
    learned_prefill_tokens_per_s: float | None = None
    learned_decode_s_per_token: float | None = None

    @classmethod
    def of(
        cls,
        name: str,
        url: str,
        health: HealthState,
        draining: bool,
        inflight_requests: int,
        inflight_mu: float,
        capacity_mu_per_min: float,
        engine_waiting: int | None,
        engine_running: int | None,
        engine_kv_usage: float | None,
        engine_prefix_hit_rate: float | None,
        consecutive_failures: int,
        ejected_until_s: float,
        learned_prefill_tokens_per_s: float | None,
        learned_decode_s_per_token: float | None,
    ) -> ReplicaSnapshot:
        """``ReplicaSnapshot(...)`` with every field given, built the cheap way (see ``_filler``): the gateway
        makes one per replica per pick."""
        o = _REPLICA_SNAPSHOT_FILL()
        o.name = name
        o.url = url
        o.health = health
        o.draining = draining
        o.inflight_requests = inflight_requests
        o.inflight_mu = inflight_mu
        o.capacity_mu_per_min = capacity_mu_per_min
        o.engine_waiting = engine_waiting
        o.engine_running = engine_running
        o.engine_kv_usage = engine_kv_usage
        o.engine_prefix_hit_rate = engine_prefix_hit_rate
        o.consecutive_failures = consecutive_failures
        o.ejected_until_s = ejected_until_s
        o.learned_prefill_tokens_per_s = learned_prefill_tokens_per_s
        o.learned_decode_s_per_token = learned_decode_s_per_token
        o.__class__ = cls
        return o

    @property
    def routable(self) -> bool:
        """Whether new requests may be sent here at all."""
        return not self.draining and self.health in (HealthState.HEALTHY, HealthState.SUSPECT)


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The router's pick, with the per-scorer scores that explain it (for logs and debugging)."""

    replica: str
    scores: Mapping[str, float] = field(default_factory=dict)
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts reported by the engine after a request (OpenAI ``usage``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    image_tokens: int = 0

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int, image_tokens: int) -> Usage:
        """``Usage(...)`` with every field given, built the cheap way (see ``_filler``)."""
        o = _USAGE_FILL()
        o.prompt_tokens = prompt_tokens
        o.completion_tokens = completion_tokens
        o.cached_tokens = cached_tokens
        o.image_tokens = image_tokens
        o.__class__ = cls
        return o

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def _filler(cls: type) -> Any:
    """A plain class with the slots of the frozen, slotted dataclass ``cls``, for its ``of`` constructor.

    A frozen dataclass's ``__init__`` writes each field through an ``object.__setattr__`` call; an instance of
    this class takes plain attribute stores (a tenth of the cost) and is then given ``cls`` as its class (the
    same slot layout, so Python allows it). The result is the object ``cls(...)`` builds from the same values:
    same type, fields, equality, hash and repr, and frozen from then on. ``of`` sets every field, so no slot
    is left empty (``tests/unit/test_types_of.py`` checks its parameters against the fields).
    """
    return type(f"_{cls.__name__}Fill", (), {"__slots__": vars(cls)["__slots__"]})


_REQUEST_INFO_FILL = _filler(RequestInfo)
_REPLICA_SNAPSHOT_FILL = _filler(ReplicaSnapshot)
_USAGE_FILL = _filler(Usage)
