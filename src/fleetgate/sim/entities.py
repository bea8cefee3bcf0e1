"""Entities of the fleet simulator (Vidur's vocabulary): requests, replicas, and the event kinds.

Entities carry state only; the simulator (``sim.des``) owns the clock and moves them. Ids are injected by the
simulator's id factory, never drawn from globals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

from fleetgate.core.types import HealthState, ReplicaSnapshot, RequestInfo
from fleetgate.simengine.perfmodel import EngineRequest, StepResult


class EventKind(IntEnum):
    """What an event on the heap means; the int value breaks no ties (the sequence number does)."""

    ARRIVAL = 0
    ENGINE_STEP = 1
    REPLICA_READY = 2
    AUTOSCALE_TICK = 3
    SCRAPE_TICK = 4


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


@dataclass(slots=True)
class SimRequest:
    """A request in flight through the simulated gateway."""

    idx: int
    info: RequestInfo
    est_mu: float
    replica: int = -1
    dispatch_s: float = 0.0


@dataclass(slots=True)
class SimReplica:
    """One engine replica plus the gateway-side counters the router sees."""

    idx: int
    name: str
    engine: EngineModel
    capacity_mu_per_min: float
    state: ReplicaState = ReplicaState.STARTING
    provisioned_s: float = 0.0
    ready_s: float = 0.0
    stopped_s: float | None = None
    inflight_requests: int = 0
    inflight_mu: float = 0.0
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

    def health(self) -> HealthState:
        if self.state == ReplicaState.STARTING:
            return HealthState.STARTING
        return HealthState.HEALTHY

    def mark_dirty(self) -> None:
        """A counter the router sees changed: rebuild the snapshot before the next pick."""
        if not self.dirty:
            self.dirty = True
            if self.sink is not None:
                self.sink.append(self)

    def make_snapshot(self) -> ReplicaSnapshot:
        """The snapshot the gateway would hand the router now (cached until a counter changes)."""
        if self.dirty or self.snapshot is None:
            self.snapshot = ReplicaSnapshot(
                name=self.name,
                health=self.health(),
                draining=self.state == ReplicaState.DRAINING,
                inflight_requests=self.inflight_requests,
                inflight_mu=self.inflight_mu,
                capacity_mu_per_min=self.capacity_mu_per_min,
                engine_waiting=self.scraped_waiting,
                engine_running=self.scraped_running,
                engine_kv_usage=self.scraped_kv,
                engine_prefix_hit_rate=self.scraped_hit_rate,
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
