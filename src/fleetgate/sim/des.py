"""Discrete-event fleet simulator: the live gateway's routing, cost and autoscaling objects, simulated clock.

Vidur's vocabulary: *entities* (``SimRequest``, ``SimReplica``; ``sim.entities``), *events* on one heap
ordered by ``(time, sequence number)`` (the number is per run, so ties resolve in insertion order and runs are
reproducible; arrivals are read from the sorted trace, each holding the number its push would have had, so
they keep that order without heap traffic), a *global scheduler* (the router: a ``RoutingPolicy`` from
``core.routing.registry``, called exactly as the gateway calls it) and *replica schedulers* (each replica's
engine performance model, advanced one **batch change** at a time through its macro step instead of one
token at a time).

The request lifecycle is the gateway's own object, ``core.lifecycle.Lifecycle``: the estimate (the tenant's
observed output p90), the in-flight counters the router reads (updated at dispatch and settle), the
dispatch gate, the policy's hooks, settlement, the output history and the autoscaler's demand meter change
exactly as in ``gateway/proxy.py``; this module owns only the simulated clock, the events and the engines.
What the router sees is what the live gateway sees: ``ReplicaSnapshot`` built from those counters plus
engine metrics "scraped" every ``scrape_interval_s``.

Nothing global: randomness is a ``random.Random(seed)`` owned by the run, ids come from an injected factory.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fleetgate.core.autoscale import AutoscaleContext, Autoscaler, DemandMeter
from fleetgate.core.engine_rates import engine_rate_learner
from fleetgate.core.errors import ServiceUnavailableError
from fleetgate.core.lifecycle import Lifecycle, LifecycleObserver, SortedOutputHistory
from fleetgate.core.routing.base import RoutingPolicy
from fleetgate.core.types import ReplicaSnapshot, RequestInfo, Usage, frozen_builder
from fleetgate.core.units import CostProfile
from fleetgate.sim import metrics as M
from fleetgate.sim.entities import (
    EngineModel,
    EventKind,
    ReplicaState,
    SimReplica,
    SimRequest,
    engine_request,
    new_sim_request,
    request_info,
)
from fleetgate.sim.traces import Trace
from fleetgate.simengine.perfmodel import StepResult

usage = frozen_builder(Usage, ("prompt_tokens", "completion_tokens", "cached_tokens"))


def _second(kv: tuple[str, float]) -> float:
    return kv[1]


ARRIVAL = int(EventKind.ARRIVAL)
ENGINE_STEP = int(EventKind.ENGINE_STEP)
REPLICA_READY = int(EventKind.REPLICA_READY)
AUTOSCALE_TICK = int(EventKind.AUTOSCALE_TICK)
SCRAPE_TICK = int(EventKind.SCRAPE_TICK)
GATE_WAKE = int(EventKind.GATE_WAKE)
DRAINING = ReplicaState.DRAINING


class Admission(Protocol):
    """Optional admission control in front of the router (rate limits, queue caps). ``True`` admits."""

    def admit(self, request: RequestInfo, now: float) -> bool: ...

    def settle(self, request: RequestInfo, cost_mu: float, now: float) -> None: ...


def default_ids(prefix: str) -> Callable[[int], str]:
    """Deterministic ids: ``r0, r1, ...`` / ``replica-0, ...``."""
    return lambda i: f"{prefix}{i}"


@dataclass(slots=True)
class SimConfig:
    """Knobs of one discrete-event run (defaults are what ``fleetgate simulate`` uses)."""

    replicas: int = 4
    seed: int = 0
    model: str = "sim-model"
    cold_start_s: float = 180.0
    scrape_interval_s: float = 1.0
    autoscale_interval_s: float = 10.0
    min_replicas: int = 0
    max_replicas: int = 1024
    slo_ttft_p95_s: float | None = None
    progress: Callable[[int, int], None] | None = None
    progress_every: int = 2000
    request_ids: Callable[[int], str] = field(default_factory=lambda: default_ids("r"))
    replica_ids: Callable[[int], str] = field(default_factory=lambda: default_ids("replica-"))


@dataclass(slots=True)
class RunResult:
    """Per-request arrays plus fleet time series; ``summary()`` turns them into the JSON report."""

    summary: dict[str, Any]
    arrival_s: np.ndarray
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    replica_of: np.ndarray
    window_load: np.ndarray
    replica_names: list[str]
    replicas_over_time: list[tuple[float, int, int]]
    #: When each request was handed to its replica (after any dispatch-gate hold); ``nan`` if never.
    dispatch_s: np.ndarray = field(default_factory=lambda: np.zeros(0))


class Simulator:
    """One discrete-event run of a trace through gateway -> router -> replicas (-> autoscaler)."""

    def __init__(
        self,
        trace: Trace,
        policy: RoutingPolicy,
        profile: CostProfile,
        engine_factory: Callable[[str], EngineModel],
        config: SimConfig,
        *,
        autoscaler: Autoscaler | None = None,
        admission: Admission | None = None,
        observers: Sequence[LifecycleObserver] = (),
    ) -> None:
        self.trace = trace
        self.policy = policy
        self.profile = profile
        self.engine_factory = engine_factory
        self.cfg = config
        self.autoscaler = autoscaler
        self.admission = admission
        self.rng = random.Random(config.seed)
        self.history = SortedOutputHistory()
        #: the same online engine-rate learner as the gateway's deployments (a lifecycle observer)
        self.rates = engine_rate_learner(profile, busy=policy.learns_rates_busy)
        # The gateway's lifecycle; the demand meter only feeds the autoscaler, so it runs only with one.
        self.lifecycle: Lifecycle[tuple[int, RequestInfo]] = Lifecycle(
            policy,
            profile,
            snapshots=self.snapshots,
            history=self.history,
            demand=DemandMeter() if autoscaler is not None else None,
            observers=(*observers, self.rates),
        )
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.now = 0.0
        self.replicas: list[SimReplica] = []
        self._snapshots: list[ReplicaSnapshot] = []
        self._snap_stale = True
        self._scale_state: Any = None
        self._active: dict[str, SimRequest] = {}
        self._too_large = 0
        self._fits: Callable[[int, int], bool] | None = None
        # Per-request results: pre-sized Python lists while running (a list store is several times cheaper
        # than a numpy scalar store), numpy arrays from ``_result`` on.
        n = len(trace.requests)
        nan = math.nan
        self._first: Any = [nan] * n
        self._done: Any = [nan] * n
        self._replica_of: Any = [-1] * n
        self._cached: Any = [0] * n
        self._cost: Any = [0.0] * n
        self._dispatch: Any = [nan] * n
        self._rejected = 0
        self._replica_series: list[tuple[float, int, int]] = []
        self._name_index: dict[str, SimReplica] = {}
        self._visible: list[SimReplica] = []
        self._dirty: list[SimReplica] = []
        # The dispatch gate (core.routing.gate), when the policy has one: held requests are released by
        # GATE_WAKE events at the time the policy expects a replica to be free.
        self._gated = self.lifecycle.gated
        self._gate_wake: float | None = None

    # ----------------------------------------------------------------------------------------- heap

    def _push(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))

    # ----------------------------------------------------------------------------------------- replicas

    def _add_replica(self, now: float, ready: bool) -> SimReplica:
        idx = len(self.replicas)
        name = self.cfg.replica_ids(idx)
        rep = SimReplica(
            idx, name, self.engine_factory(name), self.profile.capacity_mu_per_min, learned=self.rates.current
        )
        rep.provisioned_s = now
        if ready:
            rep.state = ReplicaState.READY
            rep.ready_s = now
        else:
            self._push(now + self.cfg.cold_start_s, REPLICA_READY, rep)
        self.replicas.append(rep)
        self._snap_stale = True
        return rep

    def _live(self) -> list[SimReplica]:
        return [r for r in self.replicas if r.state in (ReplicaState.STARTING, ReplicaState.READY)]

    def _record_replicas(self, now: float) -> None:
        ready = sum(1 for r in self.replicas if r.state == ReplicaState.READY)
        total = sum(1 for r in self.replicas if r.state != ReplicaState.STOPPED)
        if self._replica_series and self._replica_series[-1][0] == now:
            self._replica_series[-1] = (now, ready, total)
        else:
            self._replica_series.append((now, ready, total))

    def _scale_to(self, desired: int, now: float) -> None:
        live = self._live()
        if desired > len(live):
            for _ in range(desired - len(live)):
                self._add_replica(now, ready=False)
        elif desired < len(live):
            # Drop starting replicas first (newest first), then drain the least loaded ready ones.
            victims = sorted(
                live, key=lambda r: (r.state != ReplicaState.STARTING, r.inflight_requests, -r.idx)
            )[: len(live) - desired]
            for rep in victims:
                rep.state = ReplicaState.DRAINING
                rep.mark_dirty()
                self._maybe_stop(rep, now)
            self._snap_stale = True
        self._record_replicas(now)

    def _maybe_stop(self, rep: SimReplica, now: float) -> None:
        if rep.state == ReplicaState.DRAINING and rep.inflight_requests == 0:
            rep.state = ReplicaState.STOPPED
            rep.stopped_s = now
            self._snap_stale = True

    # ----------------------------------------------------------------------------------------- routing

    def snapshots(self) -> list[ReplicaSnapshot]:
        """Snapshots of every non-stopped replica, rebuilding only the ones whose counters changed."""
        dirty = self._dirty
        if self._snap_stale:
            self._visible = [r for r in self.replicas if r.state != ReplicaState.STOPPED]
            for i, r in enumerate(self._visible):
                r.pos = i
                r.sink = dirty
            self._snap_stale = False
            self._snapshots = [r.make_snapshot() for r in self._visible]
            dirty.clear()
            return self._snapshots
        snaps = self._snapshots
        if dirty:
            for r in dirty:
                if r.dirty and r.state != ReplicaState.STOPPED:
                    snaps[r.pos] = r.make_snapshot()
            dirty.clear()
        return snaps

    def _request_info(self, idx: int) -> RequestInfo:
        """What the gateway knows before routing: the estimate from the tenant's observed p90 output."""
        tr = self.trace.requests[idx]
        est_out, cost = self.lifecycle.estimate(tr.tenant, tr.input_tokens)
        return request_info(
            self.cfg.request_ids(idx),
            self.cfg.model,
            tr.tenant,
            tr.input_tokens,
            int(est_out),
            cost,
            tr.hash_ids,
            tr.block_tokens,
            tr.session,
            tr.arrival_s,
            True,
        )

    def _on_arrival(self, idx: int, now: float) -> None:
        info = self._request_info(idx)
        tr = self.trace.requests[idx]
        out_tokens = max(1, tr.output_tokens)
        if self._fits is not None and not self._fits(tr.input_tokens, out_tokens):
            self._too_large += 1  # the gateway answers 400 (context length exceeded) before routing
            self._rejected += 1
            return
        if self.admission is not None and not self.admission.admit(info, now):
            self._rejected += 1
            return
        self.lifecycle.start(info)
        if self._gated and self.lifecycle.hold((idx, info), info, now):
            self._drain_gate(now)
            return
        self._route(idx, info, now)

    def _drain_gate(self, now: float) -> None:
        """Release held requests while a replica is (nearly) free; else wake up when one will be."""
        lifecycle = self.lifecycle
        while True:
            backlog = lifecycle.backlog_s(now)
            item = lifecycle.release(backlog, now)
            if item is None:
                break
            self._route(item[0], item[1], now)
        wake = lifecycle.next_wake(backlog, now)
        if wake is not None and wake != self._gate_wake:
            self._gate_wake = wake
            self._push(max(wake, now), GATE_WAKE, wake)

    def _route(self, idx: int, info: RequestInfo, now: float) -> None:
        """Pick a replica for an admitted request and hand it to that replica's engine."""
        tr = self.trace.requests[idx]
        out_tokens = max(1, tr.output_tokens)
        lifecycle = self.lifecycle
        try:
            decision = lifecycle.route(info, now, self.rng)
        except ServiceUnavailableError:
            self._rejected += 1
            lifecycle.release_demand(info, now)
            return
        rep = self._name_index.get(decision.replica) or self._by_name(decision.replica)
        rid = info.request_id
        self._active[rid] = new_sim_request(idx, info)
        lifecycle.dispatch(info, rep.name, rep, now)
        self._dispatch[idx] = now
        self._replica_of[idx] = rep.idx
        eng = rep.engine
        res = eng.advance(now)
        if res.finished or res.first_token or res.cached_tokens:
            self._handle_outputs(rep, res)
        eng.submit(
            engine_request(rid, tr.input_tokens, out_tokens, tr.hash_ids, 0, tr.block_tokens, tr.token_ids),
            now,
        )
        self._reschedule(rep)

    def _by_name(self, name: str) -> SimReplica:
        rep = self._name_index.get(name)
        if rep is None:
            self._name_index = {r.name: r for r in self.replicas}
            rep = self._name_index[name]
        return rep

    # ----------------------------------------------------------------------------------------- engines

    def _reschedule(self, rep: SimReplica) -> None:
        t = rep.engine.next_event_time()
        if t is None:
            rep.scheduled_s = None
            return
        if rep.scheduled_s == t:
            return  # the pending event is still right
        rep.version += 1
        rep.scheduled_s = t
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, ENGINE_STEP, (rep, rep.version)))

    def _handle_outputs(self, rep: SimReplica, res: StepResult) -> None:
        active = self._active
        if res.cached_tokens:
            cached_of = self._cached
            for rid, cached in res.cached_tokens.items():
                cached_of[active[rid][0]] = cached
        if res.first_token:
            first = self._first
            first_token = self.lifecycle.first_token
            name = rep.name
            for rid, t in res.first_token.items():
                i, info = active[rid]
                first[i] = t
                first_token(info, name, t)
        if res.finished:
            fin = res.finished
            if len(fin) == 1:
                for rid, t in fin.items():
                    self._finish(rep, rid, t)
            else:
                for rid, t in sorted(fin.items(), key=_second):
                    self._finish(rep, rid, t)

    def _finish(self, rep: SimReplica, rid: str, t: float) -> None:
        i, info = self._active.pop(rid)
        tr = self.trace.requests[i]
        first = self._first
        if first[i] != first[i]:  # (``math.isnan``: no first token was seen)
            first[i] = t
        self._done[i] = t
        u = usage(tr.input_tokens, tr.output_tokens, self._cached[i])
        cost = self._cost[i] = self.lifecycle.complete(info, rep.name, rep, t, u)
        if self.admission is not None:
            self.admission.settle(info, cost, t)
        if rep.state == DRAINING:
            self._maybe_stop(rep, t)

    # ----------------------------------------------------------------------------------------- autoscaling

    def _autoscale(self, now: float) -> None:
        assert self.autoscaler is not None
        demand = self.lifecycle.demand
        assert demand is not None
        ready = sum(1 for r in self.replicas if r.state == ReplicaState.READY)
        starting = sum(1 for r in self.replicas if r.state == ReplicaState.STARTING)
        ctx = AutoscaleContext(
            now_s=now,
            current_replicas=ready + starting,
            ready_replicas=ready,
            starting_replicas=starting,
            capacity_mu_per_min=self.profile.capacity_mu_per_min,
            settled_mu_per_min=demand.settled_mu_per_min(now),
            inflight_mu=demand.inflight_mu,
            inflight_requests=float(demand.inflight_requests),
            policy_state=self._scale_state,
        )
        desired, self._scale_state = self.autoscaler.decide(ctx)
        desired = max(self.cfg.min_replicas, min(self.cfg.max_replicas, int(desired)))
        if desired != ready + starting:
            self._scale_to(desired, now)

    # ----------------------------------------------------------------------------------------- main loop

    def run(self) -> RunResult:
        """Simulate every request of the trace to completion and return the results."""
        wall0 = time.perf_counter()
        reqs = self.trace.requests
        n = len(reqs)
        for _ in range(self.cfg.replicas):
            self._add_replica(0.0, ready=True)
        probe = self.replicas[0].engine if self.replicas else self.engine_factory("probe")
        self._fits = probe.fits
        self._record_replicas(0.0)
        # Arrivals are read from the sorted trace instead of going through the heap: the next one carries the
        # sequence number its push would have had, so events keep exactly their (time, sequence) order.
        nxt = 0
        arr_t = 0.0
        arr_seq = 0
        if n:
            self._seq += 1
            arr_t, arr_seq = reqs[0].arrival_s, self._seq
        if self.cfg.scrape_interval_s > 0:
            self._push(0.0, SCRAPE_TICK, None)
        if self.autoscaler is not None:
            self._push(0.0, AUTOSCALE_TICK, None)
        heap = self._heap
        pop = heapq.heappop
        progress = self.cfg.progress
        every = max(1, self.cfg.progress_every)
        arrived = 0
        scrape_iv = self.cfg.scrape_interval_s
        on_arrival = self._on_arrival
        handle = self._handle_outputs
        reschedule = self._reschedule
        # the scraped queue gauges to the rate learner, as the gateway's scrape listener passes them (the
        # simulated engine is vLLM-like: its waiting requests may wait for KV memory, not only for a slot)
        engine_load = self.rates.on_engine_load
        while True:
            if nxt < n:
                if heap:
                    top = heap[0]
                    ht = top[0]
                    is_arrival = arr_t < ht or (arr_t == ht and arr_seq < top[1])
                else:
                    is_arrival = True
                if is_arrival:
                    t = arr_t
                    idx = nxt
                    nxt += 1
                    self.now = t
                    if nxt < n:
                        self._seq += 1
                        arr_t, arr_seq = reqs[nxt].arrival_s, self._seq
                    if scrape_iv <= 0:
                        for r in self.replicas:
                            r.scrape()
                            engine_load(r.name, t, r.scraped_waiting, r.scraped_running, False)
                    on_arrival(idx, t)
                    arrived += 1
                    if progress is not None and arrived % every == 0:
                        progress(arrived, n)
                    continue
            elif not heap:
                break
            t, _, kind, payload = pop(heap)
            self.now = t
            if kind == ENGINE_STEP:
                rep, version = payload
                if version != rep.version:
                    continue  # superseded by a later reschedule of the same replica
                rep.scheduled_s = None
                res = rep.engine.advance(t)
                if res.finished or res.first_token or res.cached_tokens:
                    handle(rep, res)
                reschedule(rep)
            elif kind == SCRAPE_TICK:
                for r in self.replicas:
                    if r.state != ReplicaState.STOPPED:
                        r.scrape()
                        engine_load(r.name, t, r.scraped_waiting, r.scraped_running, False)
                if arrived < n:
                    self._push(t + scrape_iv, SCRAPE_TICK, None)
            elif kind == REPLICA_READY:
                rep = payload
                if rep.state == ReplicaState.STARTING:
                    rep.state = ReplicaState.READY
                    rep.ready_s = t
                    rep.mark_dirty()
                    self._record_replicas(t)
            elif kind == GATE_WAKE:
                if payload == self._gate_wake:  # else superseded by a later one
                    self._gate_wake = None
                    self._drain_gate(t)
            elif kind == AUTOSCALE_TICK:
                self._autoscale(t)
                if arrived < n or self._active:
                    self._push(t + self.cfg.autoscale_interval_s, AUTOSCALE_TICK, None)
        if progress is not None:
            progress(arrived, n)
        wall = time.perf_counter() - wall0
        return self._result(wall)

    # ----------------------------------------------------------------------------------------- results

    def _result(self, wall_s: float) -> RunResult:
        reqs = self.trace.requests
        self._first = np.array(self._first, dtype=np.float64)
        self._done = np.array(self._done, dtype=np.float64)
        self._replica_of = np.array(self._replica_of, dtype=np.int64)
        self._cached = np.array(self._cached, dtype=np.int64)
        self._cost = np.array(self._cost, dtype=np.float64)
        self._dispatch = np.array(self._dispatch, dtype=np.float64)
        arrival = np.array([r.arrival_s for r in reqs]) if reqs else np.zeros(0)
        inputs = np.array([r.input_tokens for r in reqs], dtype=np.int64) if reqs else np.zeros(0, np.int64)
        outputs = np.array([r.output_tokens for r in reqs], dtype=np.int64) if reqs else np.zeros(0, np.int64)
        done_mask = ~np.isnan(self._done)
        ttft = (self._first - arrival)[done_mask]
        e2e = (self._done - arrival)[done_mask]
        end = float(np.nanmax(self._done)) if done_mask.any() else 0.0
        end = max(end, float(arrival[-1]) if arrival.size else 0.0)
        # Billing stops at the trace horizon (the last arrival, or the rate table's end): draining the last
        # requests after it is not billed, so both modes and any horizon compare like for like.
        last = float(arrival[-1]) if arrival.size else 0.0
        horizon = float(self.trace.meta.get("horizon_s", last) or last)  # type: ignore[arg-type]
        rep_seconds = 0.0
        for r in self.replicas:
            stop = min(r.stopped_s if r.stopped_s is not None else end, horizon)
            rep_seconds += max(0.0, stop - r.provisioned_s)
        window_load = self._window_load(end)
        mx, med = M.load_imbalance(window_load)
        minute_p95 = M.per_minute_p95(arrival[done_mask], ttft, end)
        out_tokens = float(outputs[done_mask].sum())
        span = end - (float(arrival[0]) if arrival.size else 0.0)
        completed = int(done_mask.sum())
        summary: dict[str, Any] = {
            "mode": "des",
            "policy": self.policy.name,
            "trace": self.trace.name,
            "seed": self.cfg.seed,
            "replicas": self.cfg.replicas,
            "requests": len(reqs),
            "completed": completed,
            "rejected": self._rejected,
            "rejected_too_large": self._too_large,
            "ttft_p50_s": M.percentile(ttft, 50),
            "ttft_p95_s": M.percentile(ttft, 95),
            "ttft_p99_s": M.percentile(ttft, 99),
            "ttft_mean_s": float(ttft.mean()) if ttft.size else math.nan,
            "e2e_p50_s": M.percentile(e2e, 50),
            "e2e_p95_s": M.percentile(e2e, 95),
            "e2e_mean_s": float(e2e.mean()) if e2e.size else math.nan,
            "output_tokens_per_s": out_tokens / span if span > 0 else math.nan,
            "cache_hit_rate": float(self._cached[done_mask].sum() / max(1, inputs[done_mask].sum())),
            "replica_seconds": rep_seconds,
            "replica_hours": rep_seconds / 3600.0,
            "max_over_mean_load": mx,
            "max_over_mean_load_p50": med,
            "slo_ttft_p95_s": self.cfg.slo_ttft_p95_s,
            "slo_attainment": M.slo_attainment(minute_p95, self.cfg.slo_ttft_p95_s),
            "sim_duration_s": end,
            "settled_mu": float(self._cost.sum()),
            "profile": self.profile.name,
            "autoscaler": self.autoscaler.name if self.autoscaler else "none",
            "peak_replicas": max((tot for _, _, tot in self._replica_series), default=self.cfg.replicas),
            "wall_s": wall_s,
            "requests_per_wall_s": len(reqs) / wall_s if wall_s > 0 else math.nan,
        }
        return RunResult(
            summary=M.ordered(summary),
            arrival_s=arrival,
            ttft_s=self._first - arrival,
            e2e_s=self._done - arrival,
            replica_of=self._replica_of,
            window_load=window_load,
            replica_names=[r.name for r in self.replicas],
            replicas_over_time=list(self._replica_series),
            dispatch_s=self._dispatch,
        )

    def _window_load(self, end: float) -> np.ndarray:
        """MU dispatched to each replica per minute (``nan`` where the replica was not ready all minute)."""
        n_win = max(1, math.ceil(end / 60.0))
        load = np.zeros((n_win, len(self.replicas)))
        mask = self._replica_of >= 0
        if mask.any():
            w = np.minimum((self._dispatch[mask] // 60.0).astype(np.int64), n_win - 1)
            np.add.at(load, (w, self._replica_of[mask]), self._cost[mask])
        starts = np.arange(n_win) * 60.0
        for j, r in enumerate(self.replicas):
            stop = r.stopped_s if r.stopped_s is not None else math.inf
            ready_from = r.ready_s if r.state != ReplicaState.STARTING else math.inf
            bad = (starts < ready_from) | (starts + 60.0 > stop)
            load[bad, j] = np.nan
        # The last, partial window says little about balance: drop it when there is more than one.
        return load[:-1] if n_win > 1 else load
