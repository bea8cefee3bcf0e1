"""Parity: the gateway and the simulator drive the same request lifecycle and produce the same call trace.

One workload (chat requests with shared system prompts, parsed by the gateway's own parser so both sides
see the same token counts and prefix hashes) runs twice:

1. through the simulator (``sim.des.Simulator``: simulated clock, engine performance models), and
2. through the live gateway (``gateway.proxy.Proxy`` behind its aiohttp app on 127.0.0.1), whose clock and
   dispatch-gate timer are virtual and whose upstream client is a scripted engine: each request's first
   SSE event is released at the time the simulator's engine produced its first token, the rest (with the
   engine's usage) at the time it finished. Arrivals, first tokens, completions and gate timers are applied
   one at a time in time order, each once the gateway has settled from the previous one.

Both runs record every call the lifecycle makes into the routing policy (pick with the snapshots it saw,
dispatch, first token, complete), into the dispatch gate (hold, release) and into a lifecycle observer;
the two traces must be equal, call by call. The gateway's replicas are given the engine signals the
simulator's one scrape (t = 0) saw; scraping and HTTP framing are not what this test is about.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from fleetgate.config import DeploymentConfig, GatewayConfig, ReplicaConfig
from fleetgate.core.lifecycle import ObserverBase, SortedOutputHistory
from fleetgate.core.openai import parse_request
from fleetgate.core.routing.base import PolicyBase
from fleetgate.core.routing.registry import POLICY_NAMES, build_policy
from fleetgate.core.types import ReplicaSnapshot, RequestInfo, RouteDecision, Usage
from fleetgate.engines.metrics import EngineSignals
from fleetgate.gateway.admission import OpenAdmission
from fleetgate.gateway.app import create_app
from fleetgate.gateway.fleet import Deployment, Fleet
from fleetgate.gateway.gate import GateShell
from fleetgate.gateway.metrics import GatewayMetrics
from fleetgate.gateway.proxy import Proxy
from fleetgate.profiles import load_profile
from fleetgate.sim.des import SimConfig, Simulator
from fleetgate.sim.engine import engine_factory
from fleetgate.sim.traces import Trace, TraceRequest

PROFILE = load_profile("llama2-70b-h100-tp4")
MODEL = "sim-model"
REPLICAS = 4
SEED = 11
#: The fleetgate policy with its dispatch gate on and first-token feedback (on with the gate).
GATED = {"gate": "on", "prefill_tokens_per_s": 6000.0}
CASES = [(name, {}) for name in POLICY_NAMES] + [("fleetgate", GATED)]

Trace_ = list[tuple[Any, ...]]


# ------------------------------------------------------------------------------------------ recording


def _info(r: RequestInfo, hashed: bool) -> tuple[Any, ...]:
    """The fields of a request both drivers fill in (the gateway skips hashing for hash-free policies)."""
    hashes = r.prefix_hashes if hashed else ()
    return (r.request_id, r.tenant, r.input_tokens, r.estimated_output_tokens, r.cost_mu, r.arrival_s, hashes)


def _snap(s: ReplicaSnapshot) -> ReplicaSnapshot:
    return replace(s, url="", inflight_mu=round(s.inflight_mu, 9))


class RecordingGate:
    """The policy's ``DispatchGate``, with every hold and release logged."""

    def __init__(self, inner: Any, log: Trace_) -> None:
        self.inner = inner
        self.log = log

    def __len__(self) -> int:
        return len(self.inner)

    def should_hold(self, backlog_s: float) -> bool:
        return bool(self.inner.should_hold(backlog_s))

    def push(self, item: Any, prefill_s: float, now: float) -> None:
        self.log.append(("hold", now, prefill_s))
        self.inner.push(item, prefill_s, now)

    def pop(self, backlog_s: float, now: float) -> Any:
        item = self.inner.pop(backlog_s, now)
        if item is not None:
            self.log.append(("release", now))
        return item

    def next_wake(self, backlog_s: float, now: float) -> float | None:
        wake: float | None = self.inner.next_wake(backlog_s, now)
        return wake

    def remove(self, item: Any) -> bool:
        return bool(self.inner.remove(item))


class Recorder(PolicyBase):
    """Passes every call to the real policy (built by name) and logs it with its inputs and outputs."""

    def __init__(self, name: str, params: dict[str, Any], log: Trace_, hashed: bool) -> None:
        self.inner = build_policy(name, params)
        self.name = self.inner.name
        self.log = log
        self.hashed = hashed
        self.gate = None if self.inner.gate is None else RecordingGate(self.inner.gate, log)  # type: ignore[assignment]

    def pick(self, request, replicas, now, rng, exclude=frozenset()) -> RouteDecision:  # type: ignore[no-untyped-def]
        d = self.inner.pick(request, replicas, now, rng, exclude)
        snaps = [_snap(s) for s in replicas]
        self.log.append(("pick", _info(request, self.hashed), now, snaps, sorted(exclude), d.replica))
        return d

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        self.log.append(("dispatch", request.request_id, replica, now))
        self.inner.on_dispatch(request, replica, now)

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        self.log.append(("first_token", request.request_id, replica, now))
        self.inner.on_first_token(request, replica, now)

    def on_complete(self, request: RequestInfo, replica: str, now: float, cost_mu: float, ok: bool) -> None:
        self.log.append(("complete", request.request_id, replica, now, round(cost_mu, 9), ok))
        self.inner.on_complete(request, replica, now, cost_mu, ok)

    def backlog_s(self, replicas: Any, now: float) -> float:
        return float(self.inner.backlog_s(replicas, now))

    def gate_prefill_s(self, request: RequestInfo) -> float:
        return float(self.inner.gate_prefill_s(request))


class Observer(ObserverBase):
    """A lifecycle observer: what it is told goes into the same trace."""

    def __init__(self, log: Trace_) -> None:
        self.log = log

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        self.log.append(("obs_first_token", request.request_id, replica, now))

    def on_complete(
        self, request: RequestInfo, replica: str, now: float, usage: Usage | None, cost_mu: float, ok: bool
    ) -> None:
        self.log.append(("obs_complete", request.request_id, replica, now, usage, round(cost_mu, 9), ok))


# ------------------------------------------------------------------------------------------ workload


def _bodies(n: int, seed: int) -> tuple[list[dict[str, Any]], list[float], list[int]]:
    """Chat bodies (4 shared system prompts, unique questions), bursty arrival times, output lengths."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(500)]
    systems = [" ".join(rng.choice(words) for _ in range(rng.randint(300, 900))) for _ in range(4)]
    bodies, arrivals, outputs = [], [], []
    t = 0.0
    for i in range(n):
        question = " ".join(rng.choice(words) for _ in range(rng.randint(20, 400)))
        bodies.append(
            {
                "model": MODEL,
                "stream": True,
                "messages": [
                    {"role": "system", "content": systems[rng.randrange(4)]},
                    {"role": "user", "content": f"q{i} {question}"},
                ],
            }
        )
        t += rng.expovariate(40.0) if (i // 20) % 2 == 0 else rng.expovariate(4.0)  # bursts and lulls
        arrivals.append(round(t, 6))
        outputs.append(rng.randint(8, 160))
    return bodies, arrivals, outputs


def _trace(bodies: list[dict[str, Any]], arrivals: list[float], outputs: list[int]) -> Trace:
    """The simulator's trace of the same requests: token counts and prefix hashes as the gateway parses."""
    reqs = []
    for body, t, out in zip(bodies, arrivals, outputs, strict=True):
        p = parse_request(body, "chat")
        reqs.append(TraceRequest(t, p.input_tokens, out, "anonymous", p.prefix_hashes, p.block_tokens))
    return Trace("parity", reqs, "synthetic")


# ------------------------------------------------------------------------------------------ simulator


@dataclass
class SimRun:
    log: Trace_
    first: dict[str, float]
    done: dict[str, float]
    cached: dict[str, int]
    signals: dict[str, ReplicaSnapshot]


def _simulate(trace: Trace, name: str, params: dict[str, Any], hashed: bool) -> SimRun:
    log: Trace_ = []
    policy = Recorder(name, params, log, hashed)
    cfg = SimConfig(replicas=REPLICAS, seed=SEED, model=MODEL, scrape_interval_s=1e9)  # one scrape, t = 0
    block = trace.requests[0].block_tokens
    sim = Simulator(trace, policy, PROFILE, engine_factory(PROFILE, hash_block_tokens=block), cfg,
                    observers=[Observer(log)])  # fmt: skip
    summary = sim.run().summary
    assert summary["completed"] == len(trace.requests) and summary["rejected"] == 0
    first = {e[1]: e[3] for e in log if e[0] == "obs_first_token"}
    done = {e[1]: e[3] for e in log if e[0] == "obs_complete"}
    cached = {e[1]: e[4].cached_tokens for e in log if e[0] == "obs_complete"}
    first_pick = next(e for e in log if e[0] == "pick")
    signals = {s.name: s for s in first_pick[3]}  # what the one scrape (t = 0) saw
    return SimRun(log, first, done, cached, signals)


# ------------------------------------------------------------------------------------------ gateway


class VirtualTimers:
    """``call_later`` on the test's virtual clock: the gate shell's timer fires when the test says."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(self.clock() + delay, callback)
        heapq.heappush(self._heap, (timer.due, next(self._seq), timer))
        return timer

    def next_due(self) -> float | None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def fire_next(self) -> None:
        heapq.heappop(self._heap)[2].callback()


@dataclass
class _Timer:
    due: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class _Content:
    """An upstream body the test feeds chunk by chunk (``readany`` / ``at_eof`` like aiohttp's)."""

    chunks: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)
    eof: bool = False
    blocked: bool = False  # the gateway waits here and nothing was fed since

    async def readany(self) -> bytes:
        if self.chunks.empty() and self.eof:
            return b""
        self.blocked = self.chunks.empty()
        chunk = await self.chunks.get()
        return chunk

    def at_eof(self) -> bool:
        return self.eof and self.chunks.empty()

    def feed(self, chunk: bytes, eof: bool = False) -> None:
        self.blocked = False  # at once: the gateway has work to do before it blocks again
        self.eof = eof
        self.chunks.put_nowait(chunk)


class _Upstream:
    status = 200
    content_type = "text/event-stream"
    headers: dict[str, str] = {"Content-Type": "text/event-stream"}

    def __init__(self) -> None:
        self.content = _Content()

    async def read(self) -> bytes:
        raise AssertionError("streamed requests only")

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class ScriptedEngines:
    """The gateway's upstream client: one scripted stream per request, fed by the test."""

    def __init__(self) -> None:
        self.streams: dict[str, _Upstream] = {}

    async def post(self, url: str, body: bytes, headers: Any) -> _Upstream:
        rid = headers["x-request-id"]
        assert rid not in self.streams, f"{rid} dispatched twice"
        upstream = self.streams[rid] = _Upstream()
        return upstream

    def blocked(self) -> int:
        return sum(1 for u in self.streams.values() if u.content.blocked)

    def first_token(self, rid: str) -> None:
        self.streams[rid].content.feed(_event({"choices": [{"index": 0, "delta": {"content": "a"}}]}))

    def finish(self, rid: str, usage: Usage) -> None:
        done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        counts = {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        }
        token = _event({"choices": [{"index": 0, "delta": {"content": "a"}}]})
        rest = token * (usage.completion_tokens - 1)  # one event per output token, as engines stream
        tail = rest + _event(done) + _event({"choices": [], "usage": counts}) + b"data: [DONE]\n\n"
        self.streams[rid].content.feed(tail, eof=True)


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", **payload}) + b"\n\n"


async def _gateway(
    bodies: list[dict[str, Any]], trace: Trace, sim: SimRun, name: str, params: dict[str, Any], hashed: bool
) -> Trace_:
    log: Trace_ = []
    now = [0.0]

    def clock() -> float:
        return now[0]

    policy = Recorder(name, params, log, hashed)
    replicas = [
        ReplicaConfig(name=f"replica-{i}", url=f"http://127.0.0.1:{9000 + i}") for i in range(REPLICAS)
    ]
    dcfg = DeploymentConfig(
        model=MODEL,
        replicas=replicas,
        routing={"policy": name},  # type: ignore[arg-type]
        capacity_mu_per_min=PROFILE.capacity_mu_per_min,
    )
    deployment = Deployment(dcfg, policy, PROFILE, history=SortedOutputHistory(), observers=[Observer(log)])
    for rep in deployment.replicas.values():  # the scraper's first reading, as the simulator's at t = 0
        s = sim.signals[rep.name]
        rep.engine = EngineSignals(
            waiting=s.engine_waiting, running=s.engine_running, kv_usage=s.engine_kv_usage
        )
        rep.engine_prefix_hit_rate = s.engine_prefix_hit_rate
    timers = VirtualTimers(clock)
    if deployment.lifecycle.gated:
        deployment.gate_shell = GateShell(deployment.lifecycle, clock, call_later=timers.call_later)
    fleet = Fleet([deployment])
    metrics = GatewayMetrics(fleet)
    engines = ScriptedEngines()
    config = GatewayConfig(first_byte_timeout_s=3600.0, stream_idle_timeout_s=3600.0)
    proxy = Proxy(
        config=config,
        fleet=fleet,
        client=engines,  # type: ignore[arg-type]
        metrics=metrics,
        admission=OpenAdmission(),
        rng=random.Random(SEED),  # seeded like the simulator's
        clock=clock,
    )
    app = create_app(proxy=proxy, fleet=fleet, metrics=metrics, max_body_bytes=1 << 24, created=0)
    sent = 0

    async def settled() -> None:
        """Until every request sent is held by the gate, waits on its engine, or is done, for three loop
        turns in a row (so callbacks already queued, such as the gate shell's next drain, have run)."""
        calm = 0
        for i in range(100_000):
            held = deployment.lifecycle.held()
            decided = len(engines.streams) + held
            calm = calm + 1 if decided == sent and proxy.active == engines.blocked() + held else 0
            if calm == 3:
                return
            await asyncio.sleep(0 if i < 1000 else 0.001)
        raise AssertionError(f"the gateway did not settle at t={now[0]}")

    # Stimuli in simulated time: arrivals, first tokens, completions; engine events of one instant (one batch
    # step) in the order the simulator handled them.
    at = {(e[0], e[1]): k for k, e in enumerate(sim.log) if e[0] in ("first_token", "complete")}
    stimuli: list[tuple[float, int, int, int]] = []
    for i, req in enumerate(trace.requests):
        rid = f"r{i}"
        stimuli.append((req.arrival_s, 0, 0, i))
        stimuli.append((sim.first[rid], 1, at[("first_token", rid)], i))
        stimuli.append((sim.done[rid], 1, at[("complete", rid)], i))
    stimuli.sort()
    arrivals = {s[0] for s in stimuli if s[1] == 0}
    assert len(arrivals) == len(bodies) and not arrivals & {s[0] for s in stimuli if s[1] == 1}
    responses: list[asyncio.Task[bytes]] = []
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:

        async def call(i: int, body: dict[str, Any]) -> bytes:
            resp = await client.post("/v1/chat/completions", json=body, headers={"x-request-id": f"r{i}"})
            assert resp.status == 200, await resp.text()
            return await resp.read()

        for t, engine_event, pos, i in stimuli:
            rid = f"r{i}"
            due = timers.next_due()
            while due is not None and due <= t:  # the gate's wake-ups come first
                now[0] = due
                timers.fire_next()
                await settled()
                due = timers.next_due()
            now[0] = t
            if not engine_event:
                sent += 1
                responses.append(asyncio.create_task(call(i, bodies[i])))
            elif sim.log[pos][0] == "first_token":
                engines.first_token(rid)
            else:
                req = trace.requests[i]
                usage = Usage(req.input_tokens, req.output_tokens, sim.cached[rid])
                engines.finish(rid, usage)
            await settled()
        assert timers.next_due() is None and deployment.lifecycle.held() == 0
        for body in await asyncio.gather(*responses):
            assert body.endswith(b"data: [DONE]\n\n")
    return log


# ------------------------------------------------------------------------------------------ the test


@pytest.mark.parametrize(("policy", "params"), CASES, ids=[n if not p else f"{n}-gated" for n, p in CASES])
async def test_gateway_and_simulator_make_the_same_lifecycle_calls(
    policy: str, params: dict[str, Any]
) -> None:
    n = 160
    bodies, arrivals, outputs = _bodies(n, seed=3)
    trace = _trace(bodies, arrivals, outputs)
    hashed = policy not in ("random", "round_robin", "least_requests", "p2c")
    sim = _simulate(trace, policy, params, hashed)
    gw = await _gateway(bodies, trace, sim, policy, params, hashed)
    kinds = {e[0] for e in sim.log}
    assert {"pick", "dispatch", "first_token", "complete", "obs_first_token", "obs_complete"} <= kinds
    if params:  # the gate really held requests, and first-token feedback is on
        assert sum(1 for e in sim.log if e[0] == "hold") > 10
        assert policy == "fleetgate" and build_policy(policy, params).estimate.feedback  # type: ignore[attr-defined]
    for k, (a, b) in enumerate(zip(sim.log, gw, strict=False)):
        assert a == b, f"call {k} differs:\n  simulator: {a}\n  gateway:   {b}"
    assert len(sim.log) == len(gw)
