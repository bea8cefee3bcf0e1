"""Learned engine rates under overload in the simulator (``rate_learning: busy``, core.engine_rates).

Batch traffic at twice what 8 replicas of different speeds (``sim.speed``, a fixed spread) can prefill: no
request ever runs alone, so the default learner (solo requests only) gives no replica a rate and the
automatic dispatch gate never engages; with ``rate_learning: busy`` every replica gets a rate close to its
own true one (the profile's engine rate times the replica's speed factor), and the gate engages.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from workloads.batch import batch_trace

from fleetgate.core.routing.fleetgate import FleetgatePolicy
from fleetgate.core.routing.registry import build_policy
from fleetgate.profiles import load_profile
from fleetgate.sim.des import SimConfig, Simulator
from fleetgate.sim.engine import engine_factory, perf_params_from_profile
from fleetgate.sim.speed import SpeedVariation, SpeedVaryingEngine

PROFILE = load_profile("llama2-70b-h100-tp4")


def _run(params: dict[str, str]) -> tuple[Simulator, FleetgatePolicy]:
    trace = batch_trace(requests=480, rate=8.0, seed=0)
    block = trace.requests[0].block_tokens
    policy = build_policy("fleetgate", params, profile=PROFILE)
    assert isinstance(policy, FleetgatePolicy)
    sim = Simulator(
        trace,
        policy,
        PROFILE,
        engine_factory(PROFILE, hash_block_tokens=block, speed=SpeedVariation(spread=0.3, seed=0)),
        SimConfig(replicas=8, seed=0),
    )
    assert sim.run().summary["completed"] == 480
    return sim, policy


def test_overloaded_replicas_learn_nothing_by_default() -> None:
    sim, policy = _run({})
    assert not any(r.prefill_tokens_per_s for r in sim.rates.current.values())
    assert not policy.estimate.rate_known  # so `gate: auto` stayed off


def test_busy_learning_gives_every_overloaded_replica_its_own_rate() -> None:
    sim, policy = _run({"rate_learning": "busy"})
    true = 1.0 / perf_params_from_profile(PROFILE, hash_block_tokens=16).prefill_s_per_token
    assert len(sim.replicas) == 8
    speeds = []
    for rep in sim.replicas:
        engine = rep.engine
        assert isinstance(engine, SpeedVaryingEngine)
        speed = engine.speed_at(0.0)
        speeds.append(speed)
        learned = sim.rates.rates(rep.name).prefill_tokens_per_s
        assert learned is not None, rep.name
        assert 0.8 < learned / (true * speed) < 1.25, (rep.name, learned, true * speed)
    assert max(speeds) / min(speeds) > 1.5  # the replicas really differ, and each got its own rate
    assert policy.estimate.rate_known  # `gate: auto` engaged
