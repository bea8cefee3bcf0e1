"""Learning prefill rates on busy replicas (``core.engine_rates.BusyRateLearner``, ``rate_learning: busy``).

Synthetic replicas that are never idle: requests arrive faster than the engine prefills them, so none of them
ever runs alone and the default learner learns nothing, while the busy learner recovers the engine's rate
from the queue's recursion (first token = the later of dispatch and the previous first token + service).
"""

from __future__ import annotations

import random

import pytest

from fleetgate.config import DeploymentConfig, ReplicaConfig
from fleetgate.core.engine_rates import BusyRateLearner, EngineRateLearner, engine_rate_learner
from fleetgate.core.routing.registry import build_policy
from fleetgate.core.types import RequestInfo, Usage
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
