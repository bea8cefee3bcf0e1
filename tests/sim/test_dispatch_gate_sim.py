"""The dispatch gate in the discrete-event simulator: the same core object as the gateway, driven by
GATE_WAKE events. On a bursty slice of the Mooncake trace (the live router comparison's setup,
bench/router_compare_sim.py) every request still completes, the gate really holds requests, runs are
deterministic, and shortest-first release lowers p95 TTFT against the same policy without the gate."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from router_compare import engine_facts
from router_compare_sim import live_engine, scaled_slice

from fleetgate.core.routing.registry import build_policy
from fleetgate.core.units import DEFAULT_PROFILE
from fleetgate.sim.des import SimConfig, Simulator
from fleetgate.sim.traces import default_traces_dir, load_trace
from fleetgate.simengine.perfmodel import EngineModel

TRACE = default_traces_dir() / "mooncake" / "conversation_trace.jsonl"


def _run(gate: str) -> tuple[Simulator, dict[str, float], np.ndarray]:
    trace = scaled_slice(load_trace(TRACE, max_requests=1000).requests, 7.0, 1 / 32)
    perf = live_engine(0.25)
    policy = build_policy("fleetgate", {**engine_facts(0.25), "gate": gate})
    sim = Simulator(
        trace, policy, DEFAULT_PROFILE, lambda _n: EngineModel(perf), SimConfig(replicas=4, seed=1)
    )
    res = sim.run()
    return sim, res.summary, res.ttft_s


@pytest.mark.skipif(not TRACE.exists(), reason="needs ../shared/traces")
def test_gate_holds_completes_everything_and_lowers_p95() -> None:
    sim, summary, ttft = _run("on")
    gate = sim.policy.gate  # type: ignore[attr-defined]
    assert summary["completed"] == summary["requests"] == 1000
    assert summary["rejected"] == 0
    assert gate.held_total > 100  # the slice is bursty: many requests wait for a replica
    assert gate.released_total == gate.held_total and len(gate) == 0
    assert not np.isnan(ttft).any()
    ttft2 = _run("on")[2]
    assert np.array_equal(ttft, ttft2)  # deterministic
    _, off, _ = _run("off")
    assert off["completed"] == 1000
    assert summary["ttft_p95_s"] < 0.95 * off["ttft_p95_s"]
    assert summary["cache_hit_rate"] >= 0.97 * off["cache_hit_rate"]


@pytest.mark.skipif(not TRACE.exists(), reason="needs ../shared/traces")
def test_run_result_dispatch_times_show_the_time_held_at_the_gateway() -> None:
    """``RunResult.dispatch_s`` (bench/tail_diagnosis.py splits TTFT with it): without the gate every request
    goes to its replica on arrival; with it, the held ones leave later, and never after their first token."""
    trace = scaled_slice(load_trace(TRACE, max_requests=1000).requests, 7.0, 1 / 32)
    perf = live_engine(0.25)
    for gate in ("off", "on"):
        policy = build_policy("fleetgate", {**engine_facts(0.25), "gate": gate})
        sim = Simulator(
            trace, policy, DEFAULT_PROFILE, lambda _n: EngineModel(perf), SimConfig(replicas=4, seed=1)
        )
        res = sim.run()
        held = res.dispatch_s - res.arrival_s
        assert res.dispatch_s.shape == res.arrival_s.shape and not np.isnan(held).any()
        assert (held >= 0).all() and (held <= res.ttft_s + 1e-9).all()
        later = int((held > 0).sum())
        if gate == "off":
            assert later == 0
        else:
            assert 100 < later <= policy.gate.held_total  # type: ignore[attr-defined]
