"""The prober: one asyncio task drives a ``core.health.ReplicaHealth`` per replica, sends probes, scrapes
progress, remediates through a provider, logs an event line per transition and exports metrics.

Wiring (done by the composition root, ``runtime.py``)::

    monitor = HealthMonitor(model="m", registry=registry, remediator=provider)   # provider.restart(name)
    monitor.set_replicas({"r0": "http://127.0.0.1:8001", ...})
    monitor.add_listener(lambda t: router.update_health(t.replica, t.new))       # optional
    await monitor.start()
    ...  # gateway: monitor.observe_request(name, ok); scraper: monitor.observe_progress(name, counter)
    await monitor.stop()

Probes go straight to the engine (so they never wait in the gateway's admission queue). Their body comes from
the deployment's engine dialect (``engines.dialects``): they carry the engine's priority field, ahead of all
traffic, where the engine takes one (the simulated engine always; vLLM and SGLang when the deployment sets
``engine_priority``, i.e. the engine runs with priority scheduling; llama.cpp never).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleetgate.core.errors import is_local_resource_error
from fleetgate.core.health import (
    HealthEvent,
    HealthPolicy,
    ProbeNow,
    Remediate,
    RemediationDeclined,
    ReplicaHealth,
    Transition,
)
from fleetgate.core.types import HealthState
from fleetgate.engines.dialects import EngineDialect
from fleetgate.engines.dialects.base import PROBE_PRIORITY_LOW_FIRST
from fleetgate.engines.dialects.openai import OPENAI
from fleetgate.engines.metrics import engine_signals, parse_prometheus_text
from fleetgate.tasks import cancel_and_wait

log = logging.getLogger("fleetgate.health")

#: vLLM's priority scheduling serves the lowest value first; probes go ahead of everything.
PROBE_PRIORITY = PROBE_PRIORITY_LOW_FIRST

_PROBE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class Remediator(Protocol):
    """What the prober needs from a replica provider (``providers.base.ReplicaProvider`` fits)."""

    async def restart(self, name: str) -> Any:
        """Kill and restart the replica (local: same address; Kubernetes: delete the pod)."""
        ...


@dataclass(frozen=True, slots=True)
class ProbeResult:
    ok: bool
    latency_s: float
    error: str = ""
    local: bool = False  # the gateway could not send it (out of descriptors ...): says nothing of the replica


class Series(Protocol):
    """A labelled metric family as the monitor uses it (a prometheus_client family, or a view of one)."""

    def labels(self, *values: str, **labels: str) -> Any: ...

    def remove(self, *values: str) -> None: ...


@dataclass(frozen=True, slots=True)
class HealthSeriesSet:
    """The four health series, labelled ``replica`` first (after any label a view has already set)."""

    probe_latency: Series
    transitions: Series
    remediations: Series
    state: Series


class HealthMetrics:
    """Prometheus series for health, registered on the registry passed in (no global registry), or the
    given ``series`` (views of families shared by several deployments, ``health.families``)."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, series: HealthSeriesSet | None = None
    ) -> None:
        if series is not None:
            self.probe_latency: Series = series.probe_latency
            self.transitions: Series = series.transitions
            self.remediations: Series = series.remediations
            self.state: Series = series.state
            return
        registry = registry if registry is not None else CollectorRegistry()
        self.probe_latency = Histogram(
            "fleetgate_health_probe_latency_seconds",
            "Latency of health probes (a 1-token request), by outcome.",
            ["replica", "outcome"],
            buckets=_PROBE_BUCKETS,
            registry=registry,
        )
        self.transitions = Counter(
            "fleetgate_health_transitions_total",
            "Replica health state transitions, by reason kind.",
            ["replica", "from_state", "to_state", "reason"],
            registry=registry,
        )
        self.remediations = Counter(
            "fleetgate_health_remediations_total",
            "Remediations (restarts / pod deletions) started, by reason kind and result.",
            ["replica", "action", "reason", "result"],
            registry=registry,
        )
        self.state = Gauge(
            "fleetgate_health_state",
            "1 for the replica's current health state, 0 for the others.",
            ["replica", "state"],
            registry=registry,
        )

    def set_state(self, replica: str, state: HealthState) -> None:
        for s in HealthState:
            self.state.labels(replica=replica, state=s.value).set(1.0 if s == state else 0.0)

    def forget(self, replica: str) -> None:
        for s in HealthState:
            with contextlib.suppress(KeyError):
                self.state.remove(replica, s.value)


def reason_kind(reason: str) -> str:
    """A bounded label value from a free-text reason (``error_rate 0.66 over 20`` -> ``error_rate``)."""
    head = reason.split(":", 1)[0].split(" ", 1)[0].strip()
    return head or "unknown"


class HealthMonitor:
    """Health of a set of replicas: probes, progress, remediation, events and metrics."""

    def __init__(
        self,
        *,
        model: str,
        policy: HealthPolicy | None = None,
        registry: CollectorRegistry | None = None,
        remediator: Remediator | None = None,
        session: aiohttp.ClientSession | None = None,
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = 0.1,
        probe_path: str | None = None,
        dialect: EngineDialect = OPENAI,
        engine_priority: bool = False,
        initial_state: HealthState = HealthState.STARTING,
        scrape_interval_s: float | None = None,
        action: str = "restart",
        metrics: HealthMetrics | None = None,
        listeners: Iterable[Callable[[Transition], Any]] = (),
    ) -> None:
        self.model = model
        self.policy = policy or HealthPolicy()
        # One HealthMetrics may be shared by the monitors of several deployments (series are labelled by
        # replica name only: keep replica names unique across deployments).
        self.metrics = metrics or HealthMetrics(registry if registry is not None else CollectorRegistry())
        self.remediator = remediator
        self._session = session
        self._own_session = session is None
        self.clock = clock
        self.tick_s = tick_s
        self.dialect = dialect
        self.engine_priority = engine_priority
        self.probe_path = probe_path if probe_path is not None else dialect.probe_path
        self.initial_state = initial_state
        self.scrape_interval_s = scrape_interval_s
        self.action = action
        self._urls: dict[str, str] = {}
        self._health: dict[str, ReplicaHealth] = {}
        self._last_scrape: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._per_replica: dict[str, set[asyncio.Task[None]]] = {}
        self._listeners: list[Callable[[Transition], Any]] = list(listeners)
        self._loop_task: asyncio.Task[None] | None = None
        self.events: list[Transition] = []
        self.probe_latencies: deque[tuple[str, bool, float]] = deque(maxlen=10_000)  # (replica, ok, seconds)

    # -- wiring --------------------------------------------------------------------------------------------

    def add_listener(self, fn: Callable[[Transition], Any]) -> None:
        """Called with every transition (e.g. to update the router's view at once)."""
        self._listeners.append(fn)

    def set_replicas(self, replicas: Mapping[str, str] | Iterable[tuple[str, str]]) -> None:
        """The current replicas (name -> base URL); new ones start in ``initial_state``, gone ones go."""
        items = dict(replicas.items() if isinstance(replicas, Mapping) else replicas)
        now = self.clock()
        for name in list(self._health):
            if name not in items:
                self._drop(name)
        for name, url in items.items():
            self._urls[name] = url.rstrip("/")
            if name not in self._health:
                self._health[name] = ReplicaHealth(name, self.policy, now=now, initial=self.initial_state)
                self.metrics.set_state(name, self.initial_state)

    def _drop(self, name: str) -> None:
        self._health.pop(name, None)
        self._urls.pop(name, None)
        for task in self._per_replica.pop(name, set()):
            task.cancel()
        self.metrics.forget(name)

    # -- queries -------------------------------------------------------------------------------------------

    def state(self, name: str) -> HealthState:
        rh = self._health.get(name)
        return rh.state if rh else HealthState.UNHEALTHY

    def states(self) -> dict[str, HealthState]:
        return {n: rh.state for n, rh in self._health.items()}

    def routable(self, name: str) -> bool:
        rh = self._health.get(name)
        return rh is not None and rh.routable

    def tracker(self, name: str) -> ReplicaHealth | None:
        return self._health.get(name)

    def livez(self, name: str | None = None) -> tuple[int, dict[str, Any]]:
        """Status and body for a ``/livez`` endpoint: 503 once a replica (or any, when ``name`` is None)
        is unhealthy, so a Kubernetes liveness probe pointed here restarts the engine container."""
        names = [name] if name is not None else list(self._health)
        body: dict[str, Any] = {}
        status = 200
        for n in names:
            rh = self._health.get(n)
            if rh is None:
                return 404, {"error": f"unknown replica {n!r}"}
            ok, reason = rh.livez()
            body[n] = {"alive": ok, "state": rh.state.value, "reason": rh.reason if not ok else reason}
            if not ok:
                status = 503
        return status, body

    # -- evidence from the gateway and the scraper ---------------------------------------------------------

    def observe_request(self, name: str, ok: bool) -> None:
        """A real request finished on ``name``; ``ok=False`` only for engine faults (5xx, reset, timeout)."""
        rh = self._health.get(name)
        if rh is not None:
            self._handle(name, rh.on_request(self.clock(), ok))

    def observe_progress(self, name: str, counter: float) -> None:
        """A cumulative generated-token counter for ``name`` (from scraped /metrics)."""
        rh = self._health.get(name)
        if rh is not None:
            self._handle(name, rh.on_progress(self.clock(), counter))

    # -- lifecycle -----------------------------------------------------------------------------------------

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
                skip_auto_headers=("User-Agent",),
            )
            self._own_session = True
        return self._session

    async def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run(), name="fleetgate-health")

    async def stop(self) -> None:
        task, self._loop_task = self._loop_task, None
        await cancel_and_wait(task)
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        while True:
            try:
                self.step()
            except Exception:  # a bug here must not silently stop health checking
                log.exception("health loop step failed")
            await asyncio.sleep(self.tick_s)

    def step(self) -> None:
        """One pass: poll every replica's state machine and start what is due."""
        now = self.clock()
        for name, rh in list(self._health.items()):
            self._handle(name, rh.poll(now))
            if self.scrape_interval_s is not None and rh.routable:
                last = self._last_scrape.get(name, -1e18)
                if now - last >= self.scrape_interval_s:
                    self._last_scrape[name] = now
                    self._spawn(name, self._scrape(name))

    # -- events --------------------------------------------------------------------------------------------

    def _handle(self, name: str, events: list[HealthEvent]) -> None:
        for ev in events:
            if isinstance(ev, Transition):
                self._on_transition(ev)
            elif isinstance(ev, ProbeNow):
                rh = self._health.get(name)
                if rh is not None:
                    rh.on_probe_started(self.clock())
                    self._spawn(name, self._probe_and_report(name))
            elif isinstance(ev, Remediate):
                self._spawn(name, self._remediate(name, ev))

    def _on_transition(self, t: Transition) -> None:
        self.events.append(t)
        if len(self.events) > 1000:
            del self.events[:500]
        self.metrics.transitions.labels(
            replica=t.replica, from_state=t.old.value, to_state=t.new.value, reason=reason_kind(t.reason)
        ).inc()
        self.metrics.set_state(t.replica, t.new)
        level = logging.WARNING if t.new in (HealthState.UNHEALTHY, HealthState.RESTARTING) else logging.INFO
        log.log(
            level,
            "health transition replica=%s from=%s to=%s reason=%r",
            t.replica,
            t.old.value,
            t.new.value,
            t.reason,
        )
        for fn in self._listeners:
            try:
                fn(t)
            except Exception:
                log.exception("health listener failed")

    def _spawn(self, name: str, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        bucket = self._per_replica.setdefault(name, set())
        bucket.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            bucket.discard(t)

        task.add_done_callback(done)

    # -- probes, scrapes, remediation ----------------------------------------------------------------------

    async def probe(self, name: str) -> ProbeResult:
        """One minimal end-to-end request: 1 output token, highest priority where the engine takes one,
        bounded by the probe timeout."""
        url = self._urls[name] + self.probe_path
        body = self.dialect.probe_body(self.model, self.engine_priority, self.probe_path)
        start = self.clock()
        try:
            async with asyncio.timeout(self.policy.probe_timeout_s):
                status, text = await self._post(url, body)
        except TimeoutError:
            return ProbeResult(False, self.clock() - start, "timeout")
        except OSError as exc:  # aiohttp's connection errors are OSErrors too
            if is_local_resource_error(exc):
                return ProbeResult(False, self.clock() - start, f"local_{exc.__class__.__name__}", local=True)
            if isinstance(exc, aiohttp.ClientConnectorError):
                return ProbeResult(False, self.clock() - start, "refused")
            return ProbeResult(False, self.clock() - start, f"io_{exc.__class__.__name__}")
        except aiohttp.ClientError as exc:
            return ProbeResult(False, self.clock() - start, f"io_{exc.__class__.__name__}")
        latency = self.clock() - start
        if status != 200:
            return ProbeResult(False, latency, f"http_{status}")
        try:
            data = orjson.loads(text)
            ok = bool(data.get("choices"))
        except (orjson.JSONDecodeError, AttributeError):
            ok = False
        return ProbeResult(ok, latency, "" if ok else "bad_body")

    async def _post(self, url: str, body: Mapping[str, Any]) -> tuple[int, str]:
        async with self.session.post(
            url,
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json", "X-Fleetgate-Probe": "1"},
        ) as resp:
            return resp.status, await resp.text()

    async def _probe_and_report(self, name: str) -> None:
        try:
            res = await self.probe(name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never leave the state machine waiting for a probe that died
            local = is_local_resource_error(exc)
            res = ProbeResult(False, 0.0, f"error_{exc.__class__.__name__}", local=local)
        outcome = "ok" if res.ok else (res.error or "failed")
        self.metrics.probe_latency.labels(replica=name, outcome=outcome).observe(res.latency_s)
        rh = self._health.get(name)
        if res.local:  # the gateway is sick (out of descriptors or memory), not the replica
            log.error(
                "health probe replica=%s not sent: the gateway is out of resources (%s)", name, res.error
            )
            if rh is not None:
                self._handle(name, rh.on_probe_inconclusive(self.clock()))
            return
        self.probe_latencies.append((name, res.ok, res.latency_s))
        if rh is not None:
            self._handle(name, rh.on_probe(self.clock(), res.ok, res.latency_s, res.error))

    async def _scrape(self, name: str) -> None:
        url = self._urls.get(name)
        if url is None:
            return
        try:
            async with asyncio.timeout(2.0), self.session.get(url + "/metrics") as resp:
                if resp.status != 200:
                    return
                text = await resp.text()
        except (TimeoutError, aiohttp.ClientError, OSError):
            return  # a failed scrape is no evidence either way; probes decide
        sig = engine_signals(parse_prometheus_text(text), self.dialect)
        counter = (sig.generation_tokens or 0.0) + (sig.prefix_queries or 0.0)
        if sig.generation_tokens is not None or sig.prefix_queries is not None:
            self.observe_progress(name, counter)

    async def _remediate(self, name: str, ev: Remediate) -> None:
        reason = reason_kind(ev.reason)
        rh = self._health.get(name)
        if self.remediator is None:
            log.warning(
                "health remediation replica=%s reason=%r: no provider, leaving it out", name, ev.reason
            )
            self.metrics.remediations.labels(
                replica=name, action="none", reason=reason, result="skipped"
            ).inc()
            if rh is not None:
                self._handle(name, rh.on_remediation_done(self.clock(), True))
            return
        log.warning(
            "health remediation replica=%s action=%s attempt=%d reason=%r",
            name,
            self.action,
            ev.attempt,
            ev.reason,
        )
        try:
            await self.remediator.restart(name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, RemediationDeclined):  # expected (a follower): not an error
                log.info("health remediation replica=%s declined: %s", name, exc)
            else:
                log.error("health remediation replica=%s failed: %s", name, exc)
            self.metrics.remediations.labels(
                replica=name, action=self.action, reason=reason, result="error"
            ).inc()
            if rh is not None:
                self._handle(name, rh.on_remediation_done(self.clock(), False, str(exc)))
            return
        self.metrics.remediations.labels(replica=name, action=self.action, reason=reason, result="ok").inc()
        if rh is not None:
            self._handle(name, rh.on_remediation_done(self.clock(), True))
