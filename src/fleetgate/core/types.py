"""Plain, frozen values passed between the core and its shells."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, TypeVar


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

    #: ``RequestInfo(...)`` with every field given, positional or by name, built the cheap way
    #: (``frozen_builder``): the gateway makes one per request.
    of: ClassVar[Callable[..., RequestInfo]]


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

    #: ``ReplicaSnapshot(...)`` with every field given, built the cheap way (``frozen_builder``): the gateway
    #: makes one per replica per pick.
    of: ClassVar[Callable[..., ReplicaSnapshot]]

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

    #: ``Usage(...)`` with every field given, built the cheap way (``frozen_builder``).
    of: ClassVar[Callable[..., Usage]]

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


_T = TypeVar("_T")


def frozen_builder(cls: type[_T], names: tuple[str, ...] | None = None) -> Callable[..., _T]:
    """Cheap constructor of a frozen, slotted dataclass: ``names`` (default: every field, in order) as its
    parameters, the other fields' defaults for the rest.

    A frozen dataclass's ``__init__`` writes each field through an ``object.__setattr__`` call; the gateway
    builds a ``RequestInfo`` per request and a ``ReplicaSnapshot`` per replica per pick, the simulator one
    per counter change. The built function fills an instance of a plain class with the same slots (plain
    attribute stores, a tenth of the cost) and then gives it ``cls`` as its class (same slot layout, so
    Python allows it): the object ``cls(...)`` builds from the same values (same type, fields, equality,
    hash, repr), frozen from then on. Classes with a ``__post_init__``, a base class, an unknown name or a
    default factory get their own ``__init__`` instead, so a change here costs speed, never correctness.
    """
    flds = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    names = tuple(flds) if names is None else names
    rest = [f for name, f in flds.items() if name not in names]
    slots = vars(cls).get("__slots__")
    usable = (
        slots is not None
        and cls.__bases__ == (object,)
        and not hasattr(cls, "__post_init__")  # introspection: no hook to skip
        and all(n in flds for n in names)
        and all(f.default is not MISSING for f in rest)
    )
    params = ", ".join(names)
    env: dict[str, Any] = {"_cls": cls}
    if not usable:
        exec(f"def build({params}):\n    return _cls({', '.join(f'{n}={n}' for n in names)})", env)
    else:  # unrolled, like the ``__init__`` that ``dataclasses`` generates: one slot store per line
        env["_fill"] = type(f"_{cls.__name__}Fill", (), {"__slots__": slots})
        lines = [f"def build({params}):", "    o = _fill()", *(f"    o.{n} = {n}" for n in names)]
        for j, f in enumerate(rest):
            env[f"_v{j}"] = f.default
            lines.append(f"    o.{f.name} = _v{j}")
        exec("\n".join([*lines, "    o.__class__ = _cls", "    return o"]), env)  # from the field names only
    build: Callable[..., _T] = env["build"]
    return build


RequestInfo.of = staticmethod(frozen_builder(RequestInfo))
ReplicaSnapshot.of = staticmethod(frozen_builder(ReplicaSnapshot))
Usage.of = staticmethod(frozen_builder(Usage))
