"""CPU contention between llama-server replicas on shared cores (``simengine.contention``, opt-in): an
iteration takes the slowdown for the replicas computing when it starts times its own time; two replicas
busy at once then take longer than one alone, and without a ``SharedCpu`` (or with factors of 1) the
simulator's output is what it was."""

from __future__ import annotations

import numpy as np
import pytest

from fleetgate.core.routing.registry import build_policy
from fleetgate.core.units import DEFAULT_PROFILE
from fleetgate.sim.des import SimConfig, Simulator
from fleetgate.sim.traces import Trace, TraceRequest
from fleetgate.simengine.contention import SharedCpu, parse_slowdown
from fleetgate.simengine.llamaserver import LlamaServerModel, LlamaServerParams
from fleetgate.simengine.perfmodel import EngineRequest

PARAMS = LlamaServerParams(parallel=1, cache_ram_mib=0, step_s=1e-3, token_s=1e-4, attn_s=0.0, sample_s=0.0)
ALONE = 1e-3 + 1e-4 * 200  # one 200-token prompt, one iteration


def prompt(k: int) -> tuple[int, ...]:
    return tuple(range(1000 * k, 1000 * k + 200))


def first_token(model: LlamaServerModel, rid: str) -> float:
    res = model.run_until_idle()
    return res.first_token[rid]


def test_two_replicas_busy_at_once_take_longer_than_one() -> None:
    cpu = SharedCpu((1.0, 1.5, 2.0))
    a, b = LlamaServerModel(PARAMS, cpu), LlamaServerModel(PARAMS, cpu)
    a.submit(EngineRequest("a", 200, 1, prompt_tokens=prompt(1)), 0.0)
    assert a.next_event_time() == pytest.approx(ALONE)  # alone on the machine: its own speed
    b.submit(EngineRequest("b", 200, 1, prompt_tokens=prompt(2)), 0.001)
    assert b.next_event_time() == pytest.approx(0.001 + 1.5 * ALONE)  # a still computing: 2 busy
    assert cpu.computing(0.002) == 2
    assert first_token(a, "a") == pytest.approx(ALONE)
    assert first_token(b, "b") == pytest.approx(0.001 + 1.5 * ALONE)
    # once a is done, b's next request runs alone again
    b.submit(EngineRequest("c", 200, 1, prompt_tokens=prompt(3)), 1.0)
    assert b.next_event_time() == pytest.approx(1.0 + ALONE)
    assert cpu.stretched == 1


def test_factors_beyond_the_table_keep_the_last_and_are_checked() -> None:
    cpu = SharedCpu((1.0, 1.2))
    assert [cpu.factor(k) for k in (0, 1, 2, 3, 5)] == [1.0, 1.0, 1.2, 1.2, 1.2]
    with pytest.raises(ValueError):
        parse_slowdown([0.9])
    with pytest.raises(ValueError):
        SharedCpu(())


def _sim(cpu_for_run: SharedCpu | None) -> np.ndarray:
    reqs = [
        TraceRequest(0.01 * i, 200, 3, hash_ids=(i,), block_tokens=16, token_ids=prompt(i)) for i in range(40)
    ]
    sim = Simulator(
        Trace("t", reqs, "test"),
        build_policy("round_robin", {}),
        DEFAULT_PROFILE,
        lambda name: LlamaServerModel(PARAMS, cpu_for_run),
        SimConfig(replicas=3, seed=1),
    )
    return sim.run().ttft_s


def test_off_or_all_ones_changes_nothing_and_contention_slows_the_fleet() -> None:
    plain = _sim(None)
    assert np.array_equal(plain, _sim(SharedCpu((1.0, 1.0, 1.0))))
    slowed = _sim(SharedCpu((1.0, 1.5, 2.0)))
    assert np.all(slowed >= plain - 1e-12)
    assert np.percentile(slowed, 95) > 1.2 * np.percentile(plain, 95)
