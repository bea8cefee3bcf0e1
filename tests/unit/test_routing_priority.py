"""Size-aware engine priority (core.routing.priority) and the simulator's hook for it."""

from __future__ import annotations

import pytest

from fleetgate.core.routing.priority import (
    CLASS_STRIDE,
    SizePriorityParams,
    engine_priority,
    size_bucket,
    uncached_prefill_tokens,
)
from fleetgate.core.routing.registry import build_policy
from fleetgate.core.types import Priority, RequestInfo, RouteDecision
from fleetgate.core.units import DEFAULT_PROFILE
from fleetgate.sim.des import SimConfig, Simulator
from fleetgate.sim.traces import Trace, TraceRequest
from fleetgate.simengine.perfmodel import EngineModel, PerfParams

STATIC = SizePriorityParams(bucket_tokens=64, max_bucket=3, age_s=0.0)


def test_buckets_double_and_cap() -> None:
    assert [size_bucket(n, STATIC) for n in (1, 64, 65, 128, 129, 256, 257, 10_000)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        3,
    ]


def test_class_first_size_second() -> None:
    short_batch = engine_priority(Priority.BATCH, 10, 0.0, STATIC)
    long_interactive = engine_priority(Priority.INTERACTIVE, 100_000, 0.0, STATIC)
    short_interactive = engine_priority(Priority.INTERACTIVE, 10, 0.0, STATIC)
    assert short_interactive < long_interactive < short_batch
    assert short_batch - short_interactive == CLASS_STRIDE
    assert engine_priority(Priority.BEST_EFFORT, 10**9, 10**6, SizePriorityParams()) >= 0


def test_aging_is_a_deadline() -> None:
    p = SizePriorityParams(bucket_tokens=64, max_bucket=4, age_s=1.0, quantum_s=0.05)
    long_first = engine_priority(Priority.INTERACTIVE, 1024, 10.0, p)  # bucket 4: as if it came at 14 s
    assert engine_priority(Priority.INTERACTIVE, 10, 13.9, p) < long_first
    assert engine_priority(Priority.INTERACTIVE, 10, 14.1, p) > long_first


def test_params_checked() -> None:
    assert SizePriorityParams.from_mapping({"bucket_tokens": "32"}).bucket_tokens == 32
    with pytest.raises(ValueError, match="unknown"):
        SizePriorityParams.from_mapping({"buckets": 3})
    with pytest.raises(ValueError):
        SizePriorityParams.from_mapping({"quantum_s": 0})


def test_uncached_tokens() -> None:
    assert uncached_prefill_tokens(100, 2, 16) == 68
    assert uncached_prefill_tokens(32, 5, 16) == 1


def _run(prio: SizePriorityParams | None) -> tuple[list[float], list[int]]:
    """One replica with one sequence slot: a long and two short prompts queue behind a running request."""
    reqs = [TraceRequest(arrival_s=0.0, input_tokens=200, output_tokens=50, tenant="t")]
    reqs += [TraceRequest(arrival_s=0.01, input_tokens=2000, output_tokens=5, tenant="t")]
    reqs += [
        TraceRequest(arrival_s=0.02 + i * 0.001, input_tokens=40, output_tokens=5, tenant="t")
        for i in range(2)
    ]
    seen: list[int] = []

    def hook(info: RequestInfo, decision: RouteDecision) -> int:
        assert prio is not None and decision.replica
        unc = uncached_prefill_tokens(info.input_tokens, decision.scores.get("cached_blocks", 0.0), 16)
        seen.append(engine_priority(info.priority, unc, info.arrival_s, prio))
        return seen[-1]

    perf = PerfParams.from_mapping({"max_num_batched_tokens": 256, "max_num_seqs": 1})
    sim = Simulator(
        Trace("t", reqs, "synthetic"),
        build_policy("round_robin", {}),
        DEFAULT_PROFILE,
        lambda _n: EngineModel(perf),
        SimConfig(replicas=1, seed=0, engine_priority=hook if prio else None),
    )
    return [float(x) for x in sim.run().ttft_s], seen


def test_simulator_sends_the_priority_and_short_prompts_overtake() -> None:
    fcfs, none_seen = _run(None)
    sized, seen = _run(STATIC)
    assert none_seen == [] and len(seen) == 4 and seen[2] == seen[3] < seen[1]
    # FCFS: the short prompts wait for the long one's prefill; by size they go first, the long one later.
    assert sized[2] < fcfs[2] and sized[3] < fcfs[3]
    assert sized[1] > fcfs[1]
    assert sized[0] == fcfs[0]
