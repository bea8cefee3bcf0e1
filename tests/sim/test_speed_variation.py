"""Replica speed variation in the simulator (``sim.speed``): a wrapped engine runs the same model on its own
clock, and with wandering speeds the rates the gateway learns online scatter across identical replicas as
they do on real machines (1.5-2.4x in docs/benchmarks.md, session 6), where without it they agree to ~1%."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from workloads.batch import batch_trace

from fleetgate.core.routing.registry import build_policy
from fleetgate.profiles import load_profile
from fleetgate.sim.des import SimConfig, Simulator
from fleetgate.sim.engine import engine_factory
from fleetgate.sim.speed import SpeedVariation, SpeedVaryingEngine
from fleetgate.simengine.perfmodel import EngineModel, EngineRequest, PerfParams

PROFILE = load_profile("llama2-70b-h100-tp4")


def _solo(engine: EngineModel | SpeedVaryingEngine, at: float) -> tuple[float, float]:
    engine.submit(EngineRequest("a", 4000, 8), at)
    first = done = None
    while done is None:
        t = engine.next_event_time()
        assert t is not None
        res = engine.advance(t)
        first = res.first_token.get("a", first)
        done = res.finished.get("a")
    assert first is not None
    return first - at, done - at


def test_a_fixed_speed_scales_every_duration() -> None:
    variation = SpeedVariation(spread=0.5, period_s=1e6, seed=3)
    wrapped = SpeedVaryingEngine(EngineModel(PerfParams()), variation, "r0")
    speed = wrapped.speed_at(5.0)
    assert speed != pytest.approx(1.0, abs=0.05)
    plain = _solo(EngineModel(PerfParams()), 5.0)
    got = _solo(wrapped, 5.0)
    assert got[0] == pytest.approx(plain[0] / speed, rel=1e-9)
    assert got[1] == pytest.approx(plain[1] / speed, rel=1e-9)


def test_no_variation_is_the_plain_engine() -> None:
    make = engine_factory(PROFILE, speed=SpeedVariation())
    assert isinstance(make("r0"), EngineModel)
    assert isinstance(engine_factory(PROFILE, speed=SpeedVariation(noise=0.2))("r0"), SpeedVaryingEngine)


def _learned_spread(variation: SpeedVariation) -> tuple[float, dict[str, float]]:
    trace = batch_trace(requests=480, rate=4.0, seed=0)
    sim = Simulator(
        trace,
        build_policy("fleetgate", {}, profile=PROFILE),
        PROFILE,
        engine_factory(PROFILE, hash_block_tokens=trace.requests[0].block_tokens, speed=variation),
        SimConfig(replicas=8, seed=0),
    )
    summary = sim.run().summary
    assert summary["completed"] == 480
    rates = {n: r.prefill_tokens_per_s for n, r in sim.rates.current.items() if r.prefill_tokens_per_s}
    assert len(rates) >= 6
    return max(rates.values()) / min(rates.values()), rates


def test_wandering_speeds_make_the_learned_rates_scatter() -> None:
    still, _ = _learned_spread(SpeedVariation())
    assert still < 1.05  # identical deterministic engines: one rate
    noisy, _ = _learned_spread(SpeedVariation(noise=0.3, period_s=30.0))
    assert noisy > 1.3  # as on a shared machine
    again, _ = _learned_spread(SpeedVariation(noise=0.3, period_s=30.0))
    assert again == noisy  # seeded


def test_the_schedule_is_the_speeds_the_wrapped_engine_runs_at() -> None:
    variation = SpeedVariation(noise=0.3, period_s=10.0, seed=9)
    wrapped = SpeedVaryingEngine(EngineModel(PerfParams()), variation, "replica-2")
    schedule = variation.schedule("replica-2", 6)
    assert [wrapped.speed_at(10.0 * k + 5.0) for k in range(6)] == schedule
    assert variation.schedule("replica-2", 3) == schedule[:3]  # a prefix of the same draws
    assert variation.schedule("replica-1", 6) != schedule  # seeded per replica
    assert SpeedVariation(noise=0.3, period_s=10.0, seed=10).schedule("replica-2", 6) != schedule


def test_the_live_wander_applies_the_simulators_schedule() -> None:
    """``bench/router_compare.py --speed-noise`` sets each live engine's speed to what the simulator's
    replica of the same index runs at, so ``router_compare_sim.py --from-live`` replays the same speeds."""
    from router_compare import SpeedWander

    variation = SpeedVariation(noise=0.3, period_s=10.0, seed=9)
    names = [SimConfig().replica_ids(i) for i in range(4)]
    wander = SpeedWander(["http://127.0.0.1:9"] * 4, variation, names)
    engines = [SpeedVaryingEngine(EngineModel(PerfParams()), variation, n) for n in names]
    for k in range(5):
        assert wander.speeds(k) == [e.speed_at(10.0 * k + 1.0) for e in engines]
