"""Entities of the fleet simulator (Vidur's vocabulary): requests, replicas, and the event kinds.

Entities carry state only; the simulator (``sim.des``) owns the clock and moves them. Ids are injected by the
simulator's id factory, never drawn from globals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple, Protocol

from fleetgate.core.engine_rates import LearnedRates
from fleetgate.core.lifecycle import ReplicaLoad
from fleetgate.core.types import HealthState, ReplicaSnapshot, RequestInfo, frozen_builder
from fleetgate.simengine.perfmodel import EngineRequest, StepResult


class EventKind(IntEnum):
    """What an event on the heap means; the int value breaks no ties (the sequence number does)."""

    ARRIVAL = 0
    ENGINE_STEP = 1
    REPLICA_READY = 2
    AUTOSCALE_TICK = 3
    SCRAPE_TICK = 4
    GATE_WAKE = 5


class ReplicaState(IntEnum):
    STARTING = 0
    READY = 1
    DRAINING = 2
    STOPPED = 3


class EngineModel(Protocol):
    """One replica's engine performance model as the simulator drives it: ``simengine.perfmodel.EngineModel``.

    ``advance(t)`` applies every iteration ending by ``t`` and returns a ``StepResult`` (first tokens,
    finishes, cached tokens); ``next_event_time()`` is the end of the segment in flight (next batch change,
    ``None`` when idle); ``submit(request, now)`` enqueues a request at ``now``.
    """

    def submit(self, request: EngineRequest, now: float) -> None: ...

    def advance(self, until: float) -> StepResult: ...

    def next_event_time(self) -> float | None: ...

    def fits(self, input_tokens: int, max_output_tokens: int) -> bool: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    @property
    def kv_usage(self) -> float: ...

    prefix_cache_queries: int
    prefix_cache_hits: int


_snapshot = frozen_builder(
    ReplicaSnapshot,
    (
        "name",
        "health",
        "draining",
        "inflight_requests",
        "inflight_mu",
        "capacity_mu_per_min",
        "engine_waiting",
        "engine_running",
        "engine_kv_usage",
        "engine_prefix_hit_rate",
        "learned_prefill_tokens_per_s",
        "learned_decode_s_per_token",
    ),
)
_NOT_LEARNED = LearnedRates()
#: ``RequestInfo`` of a trace request, positional in this order (see ``Simulator._on_arrival``); every
#: simulated request is streamed (its first token is reported, as the gateway reports a streamed one's).
request_info = frozen_builder(
    RequestInfo,
    (
        "request_id",
        "model",
        "tenant",
        "input_tokens",
        "estimated_output_tokens",
        "cost_mu",
        "prefix_hashes",
        "prefix_block_tokens",
        "session_key",
        "arrival_s",
        "stream",
    ),
)
#: ``EngineRequest(request_id, input_tokens, max_output_tokens, block_hashes, priority, hash_block_tokens,
#: prompt_tokens)``.
engine_request = frozen_builder(
    EngineRequest,
    (
        "request_id",
        "input_tokens",
        "max_output_tokens",
        "block_hashes",
        "priority",
        "hash_block_tokens",
        "prompt_tokens",
    ),
)


class SimRequest(NamedTuple):
    """A request in flight through the simulated gateway: its index in the trace and what the router knows
    (a named tuple: one is built per request, by ``new_sim_request`` without the Python ``__new__``)."""

    idx: int
    info: RequestInfo


def new_sim_request(idx: int, info: RequestInfo) -> SimRequest:
    """``SimRequest(idx, info)``, built as the tuple it is."""
    return _new_tuple(SimRequest, (idx, info))


_new_tuple = tuple.__new__


@dataclass(slots=True)
class SimReplica(ReplicaLoad):
    """One engine replica plus the gateway-side counters the router sees (``ReplicaLoad``, kept by the
    lifecycle; a change marks the snapshot for rebuilding)."""

    idx: int
    name: str
    engine: EngineModel
    capacity_mu_per_min: float
    state: ReplicaState = ReplicaState.STARTING
    provisioned_s: float = 0.0
    ready_s: float = 0.0
    stopped_s: float | None = None
    version: int = 0
    scheduled_s: float | None = None
    # Engine metrics as last "scraped" by the gateway (lag like the live scraper's).
    scraped_waiting: int | None = None
    scraped_running: int | None = None
    scraped_kv: float | None = None
    scraped_hit_rate: float | None = None
    snapshot: ReplicaSnapshot | None = None
    dirty: bool = True
    pos: int = -1  # index in the simulator's snapshot list
    sink: list[SimReplica] | None = None  # where to report "my snapshot changed"
    inflight_ids: set[int] = field(default_factory=set)
    #: the simulator's online engine-rate estimates by replica (``EngineRateLearner.current``), as live
    learned: Mapping[str, LearnedRates] = field(default_factory=dict)

    def health(self) -> HealthState:
        if self.state == ReplicaState.STARTING:
            return HealthState.STARTING
        return HealthState.HEALTHY

    # (``mark_dirty`` written out in ``begin``/``end``: they run at every dispatch and completion; the
    # counters stay ``ReplicaLoad``'s, one definition for the gateway and the simulator)

    def begin(self, cost_mu: float) -> None:
        ReplicaLoad.begin(self, cost_mu)
        if not self.dirty:
            self.dirty = True
            if self.sink is not None:
                self.sink.append(self)

    def end(self, cost_mu: float, ok: bool, now: float) -> None:
        ReplicaLoad.end(self, cost_mu, ok, now)
        if not self.dirty:
            self.dirty = True
            if self.sink is not None:
                self.sink.append(self)

    def mark_dirty(self) -> None:
        """A counter the router sees changed: rebuild the snapshot before the next pick."""
        if not self.dirty:
            self.dirty = True
            if self.sink is not None:
                self.sink.append(self)

    def make_snapshot(self) -> ReplicaSnapshot:
        """The snapshot the gateway would hand the router now (cached until a counter changes)."""
        if self.dirty or self.snapshot is None:
            state = self.state
            learned = self.learned.get(self.name, _NOT_LEARNED)
            self.snapshot = _snapshot(
                self.name,
                HealthState.STARTING if state == ReplicaState.STARTING else HealthState.HEALTHY,
                state == ReplicaState.DRAINING,
                self.inflight_requests,
                self.inflight_mu,
                self.capacity_mu_per_min,
                self.scraped_waiting,
                self.scraped_running,
                self.scraped_kv,
                self.scraped_hit_rate,
                learned.prefill_tokens_per_s,
                learned.decode_s_per_token,
            )
            self.dirty = False
        return self.snapshot

    def scrape(self) -> None:
        """Copy the engine's current metrics into what the router sees (the live scraper's job)."""
        eng = self.engine
        q = eng.prefix_cache_queries
        hr = eng.prefix_cache_hits / q if q else None
        w, r, kv = eng.num_waiting, eng.num_running, eng.kv_usage
        if (w, r, kv, hr) != (
            self.scraped_waiting,
            self.scraped_running,
            self.scraped_kv,
            self.scraped_hit_rate,
        ):
            self.scraped_waiting, self.scraped_running, self.scraped_kv, self.scraped_hit_rate = w, r, kv, hr
            self.mark_dirty()
