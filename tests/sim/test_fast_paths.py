"""The simulator's fast paths give exactly what the plain code gives (speed work must not move results).

- ``SortedOutputHistory`` answers like ``core.units.OutputHistory`` (window, minimum, tenant eviction);
- ``frozen_builder`` objects equal the dataclass's own (classes it cannot build fall back to ``__init__``);
- the engine model's macro *rebase* (a partly applied decode run continues without replanning) gives
  bit-identical times to replanning, and the KV block bookkeeping that the fast paths rely on holds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from fleetgate.core.lifecycle import SortedOutputHistory
from fleetgate.core.types import HealthState, ReplicaSnapshot, RequestInfo, Usage
from fleetgate.core.units import OutputHistory
from fleetgate.sim.entities import engine_request, frozen_builder, request_info
from fleetgate.simengine.perfmodel import EngineModel, EngineRequest, PerfParams, StepResult


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sorted_history_matches_output_history(seed: int) -> None:
    rng = random.Random(seed)
    ref = OutputHistory(window=16, min_samples=4, max_tenants=3)
    fast = SortedOutputHistory(window=16, min_samples=4, max_tenants=3)
    tenants = [f"t{i}" for i in range(5)]  # more tenants than kept: eviction is exercised
    for _ in range(3000):
        tenant = rng.choice(tenants)
        if rng.random() < 0.5:
            value = rng.choice([0, 1, 7, 7, 50, rng.randint(-3, 3000)])
            ref.observe(tenant, value)
            fast.observe(tenant, value)
        for t in tenants:
            assert fast.p90(t) == ref.p90(t)
            assert fast.quantile(t, 0.5) == ref.quantile(t, 0.5)
            assert fast.count(t) == ref.count(t)
        assert len(fast) == len(ref)


def test_frozen_builder_objects_equal_the_dataclass_own() -> None:
    a = request_info("r1", "m", "t", 100, 30, 1.5, (1, 2), 512, None, 3.0)
    b = RequestInfo(
        request_id="r1",
        model="m",
        tenant="t",
        input_tokens=100,
        estimated_output_tokens=30,
        cost_mu=1.5,
        prefix_hashes=(1, 2),
        prefix_block_tokens=512,
        session_key=None,
        arrival_s=3.0,
    )
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b) and type(a) is RequestInfo
    with pytest.raises(AttributeError):
        a.cost_mu = 2.0  # type: ignore[misc]  # still frozen
    e = engine_request("r1", 100, 30, (1, 2), 0, 512)
    assert e == EngineRequest("r1", 100, 30, (1, 2), 0, 512)
    snap = frozen_builder(ReplicaSnapshot, ("name", "health", "inflight_requests"))
    assert snap("a", HealthState.STARTING, 3) == ReplicaSnapshot(
        name="a", health=HealthState.STARTING, inflight_requests=3
    )
    usage = frozen_builder(Usage, ("prompt_tokens", "completion_tokens", "cached_tokens"))
    assert usage(10, 5, 2) == Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=2)


def test_frozen_builder_falls_back_to_init_when_it_cannot_bypass_it() -> None:
    @dataclass(frozen=True, slots=True)
    class Checked:
        x: int
        y: int = 0

        def __post_init__(self) -> None:
            if self.x < 0:
                raise ValueError("x must be >= 0")

    build = frozen_builder(Checked, ("x",))
    assert build(3) == Checked(3)
    with pytest.raises(ValueError):
        build(-1)  # the validation still runs


class _Replanning(EngineModel):
    """The engine without the rebase: every partly applied macro segment is replanned (the old path)."""

    def _apply_macro(self, seg, j, res):  # type: ignore[no-untyped-def]
        end = super()._apply_macro(seg, j, res)
        seg.changed = True  # disables the rebase in ``advance``
        return end


def _check_blocks(m: EngineModel) -> None:
    bt = m.params.block_tokens
    running = m._running
    assert m._used_blocks == sum(r.blocks for r in running)
    for r in running:
        assert r.blocks == -(-r.kv // bt)


def _drive(
    cls: type[EngineModel], seed: int, kv: int
) -> tuple[list[tuple[str, str, float]], tuple[int, ...]]:
    params = PerfParams(
        kv_capacity_tokens=kv,
        max_num_batched_tokens=256,
        max_num_seqs=12,
        prefix_cache_blocks=64,
        step_overhead_s=0.01,
        decode_s_per_kv_token=3e-6,
        prefill_s_per_token_sq=1e-8,
    )
    m = cls(params)
    rng = random.Random(seed)
    log: list[tuple[str, str, float]] = []

    def take(r: StepResult) -> None:
        log.extend(("first", k, v) for k, v in sorted(r.first_token.items()))
        log.extend(("done", k, v) for k, v in sorted(r.finished.items()))
        _check_blocks(m)

    t = 0.0
    for i in range(150):
        t += rng.expovariate(4.0)
        # Advance in small uneven steps so that macro segments are often applied part-way.
        for _ in range(rng.randint(0, 4)):
            take(m.advance(t - rng.random() * 0.2))
        take(m.advance(t))
        n_in, n_out = rng.randint(1, 400), rng.randint(1, 300)
        if m.fits(n_in, n_out):
            hashes = tuple(rng.randint(0, 3) * 100 + b for b in range(n_in // 16))
            m.submit(EngineRequest(f"r{i}", n_in, n_out, hashes), t)
        if rng.random() < 0.05 and i > 3:
            m.cancel(f"r{i - 3}", t)
            take(m.advance(t))
    while (nxt := m.next_event_time()) is not None:
        take(m.advance(nxt - 0.003))
        take(m.advance(nxt))
    s = m.stats()
    return log, (s.generation_tokens, s.preemptions, s.requests_finished, s.prefix_cache_hits)


@pytest.mark.parametrize(("seed", "kv"), [(1, 4096), (2, 4096), (3, 1024), (4, 1024), (5, 700)])
def test_macro_rebase_is_bit_identical_to_replanning(seed: int, kv: int) -> None:
    fast, fast_counts = _drive(EngineModel, seed, kv)
    slow, slow_counts = _drive(_Replanning, seed, kv)
    assert fast == slow  # exact float equality, not approx
    assert fast_counts == slow_counts
    assert fast_counts[2] > 50
    if kv <= 1024:
        assert fast_counts[1] > 0  # small KV caches preempt: those paths are covered too
