"""The online engine-rate learner (core.engine_rates), fed explicit events with explicit times."""

from __future__ import annotations

import copy
import random

import pytest

from fleetgate.core.calibrate import Measurement, fit_cost_profile
from fleetgate.core.engine_rates import EngineCounters, EngineRateLearner
from fleetgate.core.types import RequestInfo, Usage
from fleetgate.core.units import CostProfile


def _req(i: int) -> RequestInfo:
    return RequestInfo(request_id=f"r{i}", model="m", stream=True)


def _solo_stream(
    learner: EngineRateLearner,
    i: int,
    t: float,
    *,
    prompt: int,
    out: int,
    tps: float,
    overhead: float = 0.01,
    itl: float = 0.02,
    cached: int = 0,
    replica: str = "a",
) -> float:
    req = _req(i)
    learner.on_dispatch(req, replica, t)
    first = t + overhead + (prompt - cached) / tps
    learner.on_first_token(req, replica, first)
    end = first + itl * (out - 1)
    learner.on_complete(req, replica, end, Usage(prompt, out, cached_tokens=cached), 0.0, True)
    return end + 0.5


def test_learns_prefill_slope_and_decode_from_solo_streams() -> None:
    learner = EngineRateLearner()
    assert learner.rates("a").prefill_tokens_per_s is None
    t = 0.0
    for i, prompt in enumerate([100, 400, 800, 1600, 200, 1200]):
        t = _solo_stream(learner, i, t, prompt=prompt, out=17, tps=1000.0, overhead=0.03)
    rates = learner.rates("a")
    assert rates.prefill_source == "timing"
    # the intercept takes the overhead: the slope is the engine's rate, exactly
    assert rates.prefill_tokens_per_s == pytest.approx(1000.0, rel=1e-6)
    assert rates.decode_s_per_token == pytest.approx(0.02, rel=1e-6)


def test_cached_tokens_are_not_prefill_work() -> None:
    learner = EngineRateLearner()
    t = 0.0
    for i, prompt in enumerate([500, 1000, 1500, 2000]):
        t = _solo_stream(learner, i, t, prompt=prompt, out=4, tps=800.0, cached=prompt // 2, overhead=0.0)
    assert learner.rates("a").prefill_tokens_per_s == pytest.approx(800.0, rel=1e-6)


def test_equal_prompts_fall_back_to_the_ratio() -> None:
    learner = EngineRateLearner()
    t = 0.0
    for i in range(5):
        t = _solo_stream(learner, i, t, prompt=500, out=4, tps=1000.0, overhead=0.0)
    assert learner.rates("a").prefill_tokens_per_s == pytest.approx(1000.0, rel=1e-6)


def test_overlapping_requests_do_not_count_as_prefill_samples() -> None:
    learner = EngineRateLearner(min_samples=1)
    a, b = _req(1), _req(2)
    learner.on_dispatch(a, "a", 0.0)
    learner.on_dispatch(b, "a", 0.1)  # b queued behind a: its TTFT is not its own prefill
    learner.on_first_token(a, "a", 1.0)
    learner.on_first_token(b, "a", 2.0)
    learner.on_complete(a, "a", 1.5, Usage(1000, 10), 0.0, True)
    learner.on_complete(b, "a", 2.5, Usage(1000, 10), 0.0, True)
    rates = learner.rates("a")
    assert rates.prefill_tokens_per_s is None  # a saw b dispatched before its first token, b was not alone
    assert rates.decode_s_per_token is not None  # decode time per token is still evidence


def test_failed_requests_and_other_replicas_are_ignored() -> None:
    learner = EngineRateLearner(min_samples=1)
    req = _req(1)
    learner.on_dispatch(req, "a", 0.0)
    learner.on_first_token(req, "a", 1.0)
    learner.on_complete(req, "a", 2.0, Usage(1000, 10), 0.0, False)
    assert learner.rates("a").prefill_tokens_per_s is None
    _solo_stream(learner, 2, 5.0, prompt=1000, out=3, tps=500.0, overhead=0.0, replica="b")
    assert learner.rates("b").prefill_tokens_per_s == pytest.approx(500.0)
    assert learner.rates("a").prefill_tokens_per_s is None


def test_non_streamed_solo_request_counts_once_decode_is_known() -> None:
    learner = EngineRateLearner(min_samples=2)
    t = 0.0
    for i in range(2):
        t = _solo_stream(learner, i, t, prompt=100, out=11, tps=1000.0, overhead=0.0, itl=0.05)
    learner = EngineRateLearner(min_samples=2)
    for i in range(2):
        t = _solo_stream(learner, i, t, prompt=100 * (i + 1), out=11, tps=1000.0, overhead=0.0, itl=0.05)
    req = RequestInfo(request_id="plain", model="m")
    learner.on_dispatch(req, "a", t)
    learner.on_complete(req, "a", t + 0.9 + 0.05 * 9, Usage(900, 10), 0.0, True)  # 900 tokens in 0.9 s
    assert learner.rates("a").prefill_samples == 3
    assert learner.rates("a").prefill_tokens_per_s == pytest.approx(1000.0, rel=1e-6)


def test_engine_counters_win_and_busy_intervals_are_skipped() -> None:
    learner = EngineRateLearner()
    t = 0.0
    for i in range(3):
        t = _solo_stream(learner, i, t, prompt=500 * (i + 1), out=5, tps=1000.0, overhead=0.0)
    assert learner.rates("a").prefill_source == "timing"
    tokens = seconds = dtok = dsec = 0.0
    learner.on_counters("a", 10.0, EngineCounters(tokens, seconds, dtok, dsec))
    for k in range(4):  # quiet intervals: at most one request in flight
        tokens += 1200
        seconds += 1.0  # the engine says 1200 tokens/s
        dtok += 50
        dsec += 1.5
        learner.on_counters("a", 11.0 + k, EngineCounters(tokens, seconds, dtok, dsec))
    rates = learner.rates("a")
    assert rates.prefill_source == "counters"
    assert rates.prefill_tokens_per_s == pytest.approx(1200.0)
    assert rates.counter_prefill_tokens_per_s == pytest.approx(1200.0)
    assert rates.timing_prefill_tokens_per_s == pytest.approx(1000.0)
    assert rates.decode_s_per_token == pytest.approx(0.03)
    # a busy interval (two requests in flight): the engine sums per-request times, so it is not used
    learner.on_dispatch(_req(100), "a", 20.0)
    learner.on_dispatch(_req(101), "a", 20.1)
    tokens += 1000
    seconds += 3.0
    learner.on_counters("a", 21.0, EngineCounters(tokens, seconds, dtok, dsec))
    assert learner.rates("a").prefill_tokens_per_s == pytest.approx(1200.0)
    # a counter that went backwards (engine restart) resets the baseline, no negative sample
    learner.on_complete(_req(100), "a", 21.5, Usage(10, 1), 0.0, True)
    learner.on_complete(_req(101), "a", 21.6, Usage(10, 1), 0.0, True)
    learner.on_counters("a", 22.0, EngineCounters(0.0, 0.0, 0.0, 0.0))
    learner.on_counters("a", 23.0, EngineCounters(600.0, 0.5, 0.0, 0.0))
    assert learner.rates("a").prefill_tokens_per_s == pytest.approx(1200.0)


def test_forgetting_follows_a_changed_engine() -> None:
    learner = EngineRateLearner(forget=0.8)
    t = 0.0
    for i in range(10):
        t = _solo_stream(learner, i, t, prompt=400 + 100 * (i % 4), out=3, tps=1000.0, overhead=0.0)
    for i in range(10, 60):  # the replica got twice as slow (noisy neighbour, throttled CPU)
        t = _solo_stream(learner, i, t, prompt=400 + 100 * (i % 4), out=3, tps=500.0, overhead=0.0)
    assert learner.rates("a").prefill_tokens_per_s == pytest.approx(500.0, rel=0.01)


def test_drift_against_the_profile_and_one_alert_per_excursion() -> None:
    # alpha 0.05 MU per token at 100 MU/min = 0.03 s per token: the profile says 33.3 tokens/s
    profile = CostProfile(alpha=0.05, beta=0.1, gamma=0.0, capacity_mu_per_min=100.0)
    learner = EngineRateLearner(profile)
    t = 0.0
    for i in range(4):
        t = _solo_stream(learner, i, t, prompt=100 * (i + 1), out=3, tps=1000.0 / 30.0, overhead=0.0)
    rates = learner.rates("a")
    assert rates.drift == pytest.approx(1.0, rel=1e-6)
    assert learner.take_alerts() == []
    for i in range(4, 60):  # now twice as slow: seconds per token doubled
        t = _solo_stream(learner, i, t, prompt=100 * (i % 4 + 1), out=3, tps=1000.0 / 60.0, overhead=0.0)
    assert learner.rates("a").drift == pytest.approx(2.0, rel=0.02)
    alerts = learner.take_alerts()
    assert len(alerts) == 1 and alerts[0].replica == "a" and alerts[0].drift > 1.2
    assert alerts[0].profile_tokens_per_s == pytest.approx(1000.0 / 30.0)
    assert learner.take_alerts() == []


def test_no_drift_from_times_that_are_mostly_fixed_overhead() -> None:
    """Equal-sized prompts give only the ratio of time to first token over tokens, which holds the fixed
    per-request overhead (a slowed simulated engine's whole first step): it estimates TTFT, not the prefill
    rate, so it gives no drift and no alert (it read "+9714%" against a profile that was right). Once the
    prompt sizes spread, the regression's intercept takes the overhead and the drift is the true one."""
    profile = CostProfile(alpha=0.05, beta=0.1, gamma=0.0, capacity_mu_per_min=100.0)  # 0.03 s per token
    learner = EngineRateLearner(profile)
    t = 0.0
    for i in range(20):  # prefill exactly as the profile says, plus a 2 s first step
        t = _solo_stream(learner, i, t, prompt=40, out=3, tps=1000.0 / 30.0, overhead=2.0)
    rates = learner.rates("a")
    assert rates.prefill_tokens_per_s == pytest.approx(40 / (2.0 + 40 * 0.03))  # the TTFT estimate stays
    assert rates.drift is None and learner.take_alerts() == []
    for i in range(20, 40):
        t = _solo_stream(learner, i, t, prompt=40 * (i % 4 + 1), out=3, tps=1000.0 / 30.0, overhead=2.0)
    assert learner.rates("a").drift == pytest.approx(1.0, rel=1e-6)
    assert learner.take_alerts() == []


def test_lost_completions_are_bounded_and_a_removed_replica_is_forgotten() -> None:
    learner = EngineRateLearner(max_pending=10)
    for i in range(50):
        learner.on_dispatch(_req(i), "a", float(i))
    assert len(learner._pending) == 10
    learner.forget_replica("a")
    assert learner._pending == {} and learner.replicas() == []


def test_calibration_states_the_prefill_rate_the_learner_is_checked_against() -> None:
    ms = [Measurement(i, o, 0.01 + i / 2000.0 + o * 0.004) for i in (32, 256, 1024) for o in (4, 32, 96)]
    cal = fit_cost_profile(ms, random.Random(0), terms=())
    assert cal.prefill_tokens_per_s([100, 1000]) == pytest.approx(2000.0, rel=0.02)
    quad = fit_cost_profile(
        [Measurement(i, o, i / 2000.0 + 0.3 * i * i / 1e6 + o * 0.004) for i in (32, 256, 1024, 2048)
         for o in (4, 32, 96)],
        random.Random(0),
        terms=("delta",),
    )  # fmt: skip
    # per-token prefill cost grows with the prompt: the rate is lower for longer prompts
    assert quad.prefill_tokens_per_s([2048]) < quad.prefill_tokens_per_s([128])  # type: ignore[operator]


def test_prefix_cache_discount_from_cold_and_cached_runs() -> None:
    from fleetgate.core.calibrate import prefix_cache_discount

    ms = [Measurement(i, o, 0.01 + i / 2000.0 + o * 0.004) for i in (32, 256, 1024) for o in (4, 32, 96)]
    cal = fit_cost_profile(ms, random.Random(0), terms=())
    full = 768 / 2000.0  # 768 cached tokens at full price
    # the cache saved 90% of their price: a cached token costs 10% of alpha
    assert prefix_cache_discount(1.0, 1.0 - 0.9 * full, 1024, 768, cal) == pytest.approx(0.1, abs=0.02)
    assert prefix_cache_discount(1.0, 1.0 - 2 * full, 1024, 768, cal) == 0.0  # noise: clamped
    assert prefix_cache_discount(1.0, 1.1, 1024, 768, cal) == 1.0  # no saving at all


def test_kept_prefill_half_equals_a_fresh_computation() -> None:
    """The prefill fields kept between completions without a prefill sample are what recomputing them
    from the fits gives, through solo and overlapping streams, non-streamed requests and counter scrapes."""
    rng = random.Random(5)
    learner = EngineRateLearner(CostProfile(alpha=0.001, beta=0.01, capacity_mu_per_min=60.0), min_samples=3)
    t = 0.0
    open_: list[tuple[RequestInfo, str, float]] = []
    counters = {"a": [0.0, 0.0, 0.0, 0.0], "b": [0.0, 0.0, 0.0, 0.0]}
    for i in range(1500):
        t += rng.random() * 0.2
        replica = rng.choice("ab")
        event = rng.random()
        if event < 0.4 or not open_:
            req = RequestInfo(request_id=f"r{i}", model="m", stream=rng.random() < 0.8)
            learner.on_dispatch(req, replica, t)
            open_.append((req, replica, t))
        elif event < 0.6:
            req, rep, _ = rng.choice(open_)
            learner.on_first_token(req, rep, t)
        elif event < 0.9:
            req, rep, _ = open_.pop(rng.randrange(len(open_)))
            prompt = rng.randint(10, 4000)
            usage = Usage(prompt, rng.randint(1, 300), cached_tokens=rng.randint(0, prompt // 2))
            learner.on_complete(req, rep, t, usage, 0.0, rng.random() < 0.95)
        else:
            c = counters[replica]
            c[0] += rng.randint(0, 5000)
            c[1] += rng.random()
            c[2] += rng.randint(0, 500)
            c[3] += rng.random()
            learner.on_counters(replica, t, EngineCounters(*c))
        probe = copy.deepcopy(learner)
        for name, rep_state in probe._replicas.items():
            if name in probe.current:
                rep_state.prefill_held = (-1, -1, None, rep_state.prefill_held[3])  # nothing kept: recompute
                probe._updated(name, rep_state)
                assert probe.current[name] == learner.current[name]
