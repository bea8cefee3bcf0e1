"""The tail bound in the simulator (``filters.tail_bound``, issue 20 item 3).

Mooncake at the recorded load per replica, 8 replicas whose speed wanders (``sim.speed``, noise 0.3): the
default policy piles the slowest 1% onto one replica whose engine is short of KV memory with a long prompt
at the head of its queue. The estimate there believes seconds (a stale learned rate, the fluid queue) and
the load guard keeps sending it requests because it serves little, so its recent MU looks light
(docs/benchmarks.md, "Session 9: the tail at high load"). With ``tail_bound_s`` that replica gets no new
requests while its oldest one is overdue, and the p99 falls to the other policies' range.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from session_affinity import PER_REPLICA, SESSION9_DEFAULTS, build

from fleetgate.core.routing.fleetgate import FleetgatePolicy
from fleetgate.core.routing.registry import build_policy
from fleetgate.profiles import load_profile
from fleetgate.sim.des import RunResult, SimConfig, Simulator
from fleetgate.sim.engine import engine_factory
from fleetgate.sim.speed import SpeedVariation

PROFILE = load_profile("llama2-70b-h100-tp4")


def _run(traces: Path, params: dict[str, object]) -> tuple[RunResult, FleetgatePolicy]:
    trace = build("mooncake", 8, 1.0, PER_REPLICA["mooncake"], 0, traces)
    policy = build_policy("fleetgate", params, profile=PROFILE)
    assert isinstance(policy, FleetgatePolicy)
    factory = engine_factory(
        PROFILE, hash_block_tokens=trace.requests[0].block_tokens, speed=SpeedVariation(noise=0.3, seed=0)
    )
    res = Simulator(trace, policy, PROFILE, factory, SimConfig(replicas=8, seed=0)).run()
    assert res.summary["completed"] == len(trace.requests)
    return res, policy


def test_tail_bound_keeps_the_p99_off_a_stuck_replica(traces_dir: Path) -> None:
    # on the policy of the collapse: the defaults before session 10 (today's include the bound, below)
    base, _ = _run(traces_dir, SESSION9_DEFAULTS)
    bound, policy = _run(traces_dir, {**SESSION9_DEFAULTS, "tail_bound_s": 5.0})
    assert policy.tail is not None and policy.tail.dropped > 0
    p99 = float(np.percentile(bound.ttft_s, 99))
    assert p99 < 30.0  # cache_aware reads 10 s here
    assert p99 < float(np.percentile(base.ttft_s, 99))
    # the median is not paid for it
    assert float(np.percentile(bound.ttft_s, 50)) <= 1.2 * float(np.percentile(base.ttft_s, 50))
    # the tail is not one replica's any more
    tail = bound.ttft_s >= np.percentile(bound.ttft_s, 99)
    assert max(Counter(bound.replica_of[tail].tolist()).values()) < tail.sum()


def test_the_default_policy_has_no_collapse_there(traces_dir: Path) -> None:
    """Today's default (the bound at 2 s keeping a holder of half the prompt, pooled rates, session keys)
    on the same replay: the p99 in the other policies' range."""
    res, policy = _run(traces_dir, {})
    assert policy.tail is not None
    assert float(np.percentile(res.ttft_s, 99)) < 30.0  # cache_aware reads 10 s here
