"""The engine performance model: hand-computed timings, prefix cache, KV limits, priority, macro steps."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgate.simengine.perfmodel import (
    EngineModel,
    EngineRequest,
    PerfParams,
    PrefixCache,
    StepResult,
)

# Round numbers so that timings can be computed by hand.
SIMPLE = PerfParams(
    step_overhead_s=0.01,
    prefill_s_per_token=0.001,
    decode_s_per_seq=0.001,
    decode_s_per_kv_token=0.0,
    max_num_batched_tokens=None,
)


def collect(model: EngineModel) -> StepResult:
    return model.run_until_idle()


def test_single_request_hand_computed() -> None:
    m = EngineModel(SIMPLE)
    m.submit(EngineRequest("a", input_tokens=100, max_output_tokens=5), now=0.0)
    assert (m.num_waiting, m.num_running) == (1, 0)  # scheduled lazily: same-time arrivals can still join
    # Prefill iteration: 0.01 + 100 * 0.001 = 0.11 -> first token.
    assert m.next_event_time() == pytest.approx(0.11)
    assert (m.num_waiting, m.num_running) == (0, 1)
    first = m.step()
    assert first.first_token == {"a": pytest.approx(0.11)}
    assert first.emitted == {"a": 1}
    assert first.cached_tokens == {"a": 0}
    # Four decode iterations of 0.01 + 1 * 0.001, as one macro segment.
    rest = m.step()
    assert rest.iterations == 4
    assert rest.finished == {"a": pytest.approx(0.11 + 4 * 0.011)}
    assert rest.emitted == {"a": 4}
    s = m.stats()
    assert (s.generation_tokens, s.prompt_tokens, s.requests_finished) == (5, 100, 1)
    assert (s.num_running, s.num_waiting, s.kv_usage) == (0, 0, 0.0)
    assert m.next_event_time() is None


def test_decode_cost_grows_with_batch_and_kv() -> None:
    p = SIMPLE.with_overrides(decode_s_per_kv_token=1e-5)
    m = EngineModel(p)
    m.submit(EngineRequest("a", 10, 3), 0.0)
    m.submit(EngineRequest("b", 10, 3), 0.0)
    # Both admitted together: 0.01 + 20 * 0.001 = 0.03.
    r = m.step()
    assert r.first_token == {"a": pytest.approx(0.03), "b": pytest.approx(0.03)}
    # Decode: D=2, K = 11 + 11 = 22, then 24: dt = 0.01 + 0.002 + 1e-5 * K.
    r = m.step()
    expected = 0.03 + (0.012 + 22e-5) + (0.012 + 24e-5)
    assert r.finished == {"a": pytest.approx(expected), "b": pytest.approx(expected)}


def test_chunked_prefill_splits_prompt() -> None:
    m = EngineModel(SIMPLE.with_overrides(max_num_batched_tokens=8))
    m.submit(EngineRequest("a", 20, 1), 0.0)
    r = m.run_until_idle()
    # Chunks of 8, 8, 4: three iterations, the last one samples the only token.
    assert r.iterations == 3
    assert r.finished["a"] == pytest.approx(3 * 0.01 + 20 * 0.001)


def test_prefix_cache_hit_skips_prefill() -> None:
    m = EngineModel(SIMPLE)
    hashes = (11, 22, 33)  # three 16-token blocks
    m.submit(EngineRequest("a", 50, 1, block_hashes=hashes), 0.0)
    first = m.run_until_idle()
    assert first.cached_tokens["a"] == 0
    t0 = first.finished["a"]
    m.submit(EngineRequest("b", 50, 1, block_hashes=hashes), t0)
    second = m.run_until_idle()
    assert second.cached_tokens["b"] == 48
    assert second.first_token["b"] - t0 == pytest.approx(0.01 + 2 * 0.001)
    assert m.prefix_cache_queries == 100 and m.prefix_cache_hits == 48
    # A prompt sharing only the first block hits one block.
    m.submit(EngineRequest("c", 50, 1, block_hashes=(11, 99, 98)), 1.0)
    assert m.run_until_idle().cached_tokens["c"] == 16


def test_prefix_cache_fully_cached_prompt_recomputes_last_token() -> None:
    m = EngineModel(SIMPLE)
    m.submit(EngineRequest("a", 32, 1, block_hashes=(1, 2)), 0.0)
    m.run_until_idle()
    m.submit(EngineRequest("b", 32, 1, block_hashes=(1, 2)), 1.0)
    assert m.run_until_idle().cached_tokens["b"] == 31


def test_prefix_cache_lru_eviction() -> None:
    cache = PrefixCache(capacity_blocks=3)
    cache.insert([1, 2])
    cache.insert([3])
    cache.touch([1])  # 2 is now least recently used
    cache.insert([4])
    assert 2 not in cache and all(h in cache for h in (1, 3, 4))
    assert cache.match([1, 3, 4, 5]) == 3
    assert cache.match([2, 1]) == 0  # chained: a missing first block means no hit

    m = EngineModel(SIMPLE.with_overrides(prefix_cache_blocks=2))
    m.submit(EngineRequest("a", 40, 1, block_hashes=(1, 2)), 0.0)
    m.run_until_idle()
    m.submit(EngineRequest("b", 40, 1, block_hashes=(7, 8)), 1.0)
    m.run_until_idle()
    m.submit(EngineRequest("c", 40, 1, block_hashes=(1, 2)), 2.0)
    assert m.run_until_idle().cached_tokens["c"] == 0  # evicted by b


def test_prefix_cache_disabled() -> None:
    m = EngineModel(SIMPLE.with_overrides(prefix_cache_blocks=0))
    for i, t in enumerate((0.0, 1.0)):
        m.submit(EngineRequest(f"r{i}", 40, 1, block_hashes=(1, 2)), t)
        assert m.run_until_idle().cached_tokens[f"r{i}"] == 0


def test_kv_full_requests_wait() -> None:
    # 64 KV tokens = 4 blocks; each request needs 3 blocks (40 prompt + 1 sampled token).
    m = EngineModel(SIMPLE.with_overrides(kv_capacity_tokens=64))
    m.submit(EngineRequest("a", 40, 2), 0.0)
    m.submit(EngineRequest("b", 40, 2), 0.0)
    m.next_event_time()
    assert (m.num_running, m.num_waiting) == (1, 1)
    assert m.kv_usage == pytest.approx(3 / 4)
    r = m.run_until_idle()
    assert r.admitted["b"] == pytest.approx(r.finished["a"])
    assert m.preemptions == 0


def test_max_num_seqs_limits_batch() -> None:
    m = EngineModel(SIMPLE.with_overrides(max_num_seqs=2))
    for i in range(3):
        m.submit(EngineRequest(f"r{i}", 10, 5), 0.0)
    m.next_event_time()
    assert (m.num_running, m.num_waiting) == (2, 1)
    r = m.run_until_idle()
    assert r.admitted["r2"] == pytest.approx(r.finished["r0"])


def test_priority_lower_value_first() -> None:
    m = EngineModel(SIMPLE.with_overrides(max_num_seqs=1))
    m.submit(EngineRequest("long", 10, 50), 0.0)
    m.submit(EngineRequest("low", 10, 5, priority=10), 0.001)
    m.submit(EngineRequest("high", 10, 5, priority=-10), 0.002)
    m.submit(EngineRequest("mid", 10, 5), 0.003)
    r = m.run_until_idle()
    order = sorted(r.finished, key=r.finished.__getitem__)
    assert order == ["long", "high", "mid", "low"]


def test_fcfs_with_equal_priority() -> None:
    m = EngineModel(SIMPLE.with_overrides(max_num_seqs=1))
    for i in range(4):
        m.submit(EngineRequest(f"r{i}", 10, 3), i * 0.001)
    r = m.run_until_idle()
    assert sorted(r.finished, key=r.finished.__getitem__) == ["r0", "r1", "r2", "r3"]


def test_preemption_when_kv_runs_out() -> None:
    # 6 blocks of 16: two requests of 30 prompt tokens (2 blocks each) growing to 80 tokens cannot both fit.
    m = EngineModel(SIMPLE.with_overrides(kv_capacity_tokens=96))
    m.submit(EngineRequest("a", 30, 50), 0.0)
    m.submit(EngineRequest("b", 30, 50, priority=1), 0.0)
    r = m.run_until_idle()
    assert m.preemptions >= 1
    assert "b" in r.preempted
    assert set(r.finished) == {"a", "b"}
    assert r.emitted == {"a": 50, "b": 50}
    assert r.finished["a"] < r.finished["b"]
    assert m.kv_usage == 0.0


def test_impossible_request_rejected() -> None:
    m = EngineModel(SIMPLE.with_overrides(kv_capacity_tokens=64))
    assert not m.fits(60, 10)
    with pytest.raises(ValueError):
        m.submit(EngineRequest("big", 60, 10), 0.0)
    with pytest.raises(ValueError):
        m.submit(EngineRequest("empty", 0, 10), 0.0)
    m.submit(EngineRequest("ok", 10, 10), 0.0)
    with pytest.raises(ValueError):
        m.submit(EngineRequest("ok", 10, 10), 0.0)


def test_arrival_mid_macro_joins_at_next_boundary() -> None:
    m = EngineModel(SIMPLE)
    m.submit(EngineRequest("a", 10, 100), 0.0)
    m.step()  # prefill: ends at 0.02
    assert m.next_event_time() == pytest.approx(0.02 + 99 * 0.011)
    m.advance(0.05)  # two decode iterations done (0.031, 0.042); the third ends at 0.053
    m.submit(EngineRequest("b", 10, 1), 0.05)
    assert m.next_event_time() == pytest.approx(0.053)
    r = m.step()
    assert r.emitted == {"a": 1}
    r = m.step()  # a decodes, b prefills, in one iteration: 0.01 + 0.001 + 10 * 0.001
    assert r.first_token["b"] == pytest.approx(0.053 + 0.021)


def test_advance_reports_partial_macro() -> None:
    m = EngineModel(SIMPLE)
    m.submit(EngineRequest("a", 10, 11), 0.0)
    m.step()
    r = m.advance(0.02 + 3 * 0.011 + 0.001)
    assert r.emitted == {"a": 3}
    assert m.next_event_time() == pytest.approx(0.02 + 10 * 0.011)
    assert m.advance(10.0).finished == {"a": pytest.approx(0.02 + 10 * 0.011)}


def test_cancel_waiting_and_running() -> None:
    m = EngineModel(SIMPLE.with_overrides(max_num_seqs=1))
    m.submit(EngineRequest("a", 10, 100), 0.0)
    m.submit(EngineRequest("b", 10, 100), 0.0)
    assert m.cancel("b", 0.01)
    assert m.num_waiting == 0
    m.step()
    assert m.cancel("a", 0.5)
    assert not m.cancel("a")
    assert (m.num_running, m.kv_usage, m.requests_cancelled) == (0, 0.0, 2)
    r = m.run_until_idle()
    assert "a" not in r.finished
    assert m.next_event_time() is None


def _drive(
    macro: bool, seed: int, budget: int = 96
) -> tuple[dict[str, float], dict[str, float], dict[str, int], tuple[int, ...]]:
    rng = random.Random(seed)
    params = PerfParams(
        max_num_seqs=6,
        kv_capacity_tokens=1024,
        block_tokens=16,
        max_num_batched_tokens=budget,
        prefix_cache_blocks=20,
        step_overhead_s=0.003,
        prefill_s_per_token=2e-4,
        prefill_s_per_token_sq=1e-7,
        decode_s_per_seq=5e-4,
        decode_s_per_kv_token=2e-6,
    )
    m = EngineModel(params, macro=macro)
    events: list[tuple[float, str, EngineRequest | str]] = []
    t = 0.0
    for i in range(60):
        t += rng.expovariate(8.0)
        prefix = rng.randrange(4)
        n_in = rng.randrange(20, 300)
        hashes = tuple(prefix * 1000 + b for b in range(n_in // 16))
        req = EngineRequest(f"r{i}", n_in, rng.randrange(1, 120), hashes, priority=rng.choice((0, 0, 1, -1)))
        events.append((t, "submit", req))
        if rng.random() < 0.1:
            events.append((t + rng.uniform(0.01, 2.0), "cancel", req.request_id))
    events.sort(key=lambda e: e[0])
    first: dict[str, float] = {}
    finished: dict[str, float] = {}
    emitted: dict[str, int] = {}

    def take(r: StepResult) -> None:
        first.update(r.first_token)
        finished.update(r.finished)
        for k, v in r.emitted.items():
            emitted[k] = emitted.get(k, 0) + v

    for when, kind, what in events:
        take(m.advance(when))
        if kind == "submit":
            assert isinstance(what, EngineRequest)
            m.submit(what, when)
        else:
            assert isinstance(what, str)
            m.cancel(what, when)
    take(m.run_until_idle())
    s = m.stats()
    counters = (
        s.prefix_cache_queries,
        s.prefix_cache_hits,
        s.prompt_tokens,
        s.generation_tokens,
        s.preemptions,
        s.requests_finished,
        s.requests_cancelled,
    )
    return first, finished, emitted, counters


@pytest.mark.parametrize(
    ("seed", "budget"), [(1, 96), (2, 96), (3, 96), (4, 4), (70, 1000), (100, 96), (178, 1000)]
)
def test_macro_steps_equal_single_steps(seed: int, budget: int) -> None:
    f1, d1, e1, c1 = _drive(macro=True, seed=seed, budget=budget)
    f2, d2, e2, c2 = _drive(macro=False, seed=seed, budget=budget)
    assert c1 == c2
    assert e1 == e2
    assert f1.keys() == f2.keys() and d1.keys() == d2.keys()
    for k in f1:
        assert f1[k] == pytest.approx(f2[k], rel=1e-9, abs=1e-9)
    for k in d1:
        assert d1[k] == pytest.approx(d2[k], rel=1e-9, abs=1e-9)
    assert c1[4] > 0 or seed != 1  # the small KV cache makes seed 1 preempt


def test_params_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("perf:\n  max_num_seqs: 8\n  kv_capacity_tokens: 4096\n  max_num_batched_tokens: null\n")
    p = PerfParams.from_yaml(path)
    assert (p.max_num_seqs, p.kv_capacity_tokens, p.max_num_batched_tokens) == (8, 4096, None)
    assert p.kv_blocks == 256 and p.cache_blocks == 256
    path.write_text("max_num_seq: 8\n")
    with pytest.raises(ValueError, match="unknown"):
        PerfParams.from_yaml(path)
    with pytest.raises(ValueError):
        PerfParams(max_num_seqs=0)


def test_fault_parsing() -> None:
    from fleetgate.core.errors import InvalidRequestError
    from fleetgate.simengine.faults import Fault, fault_from_json, parse_fault

    assert parse_fault("hang") == Fault("hang", None)
    assert parse_fault("slow") == Fault("slow", 10.0)
    assert parse_fault("error_rate=0.25") == Fault("error_rate", 0.25)
    assert fault_from_json({"kind": "stall", "value": 3}) == Fault("stall", 3.0)
    for bad in ("melt", "slow=0", "error_rate=2", "stall=x"):
        with pytest.raises(InvalidRequestError):
            parse_fault(bad)
    with pytest.raises(InvalidRequestError):
        fault_from_json({"kind": "hang", "extra": 1})


def test_quadratic_prefill_term_independent_of_chunking() -> None:
    base = SIMPLE.with_overrides(prefill_s_per_token=0.0, prefill_s_per_token_sq=1e-6, step_overhead_s=1e-9)
    times = []
    for budget in (None, 7, 64):
        m = EngineModel(base if budget is None else base.with_overrides(max_num_batched_tokens=budget))
        m.submit(EngineRequest("a", 200, 1), 0.0)
        times.append(m.run_until_idle().finished["a"])
    # 200^2 * 1e-6 = 0.04 s of prefill, plus a negligible overhead per iteration.
    assert times == [pytest.approx(0.04, abs=1e-6)] * 3


@settings(max_examples=60, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(
            st.floats(0, 2, allow_nan=False),  # arrival
            st.integers(1, 200),  # input tokens
            st.integers(1, 80),  # output tokens
            st.integers(-2, 2),  # priority
            st.integers(0, 3),  # prefix family
            st.booleans(),  # cancel later
        ),
        min_size=1,
        max_size=25,
    ),
    kv=st.sampled_from([320, 640, 4096]),
    budget=st.sampled_from([None, 16, 64]),
    seqs=st.integers(1, 6),
    macro=st.booleans(),
)
def test_invariants_hold_for_any_workload(
    reqs: list[tuple[float, int, int, int, int, bool]], kv: int, budget: int | None, seqs: int, macro: bool
) -> None:
    params = PerfParams(
        max_num_seqs=seqs,
        kv_capacity_tokens=kv,
        max_num_batched_tokens=budget,
        prefix_cache_blocks=8,
        step_overhead_s=0.002,
        decode_s_per_kv_token=1e-6,
    )
    m = EngineModel(params, macro=macro)
    events: list[tuple[float, int, str]] = []
    for i, (t, _, _, _, _, cancel) in enumerate(reqs):
        events.append((t, 0, f"s{i}"))
        if cancel:
            events.append((t + 0.05, 1, f"c{i}"))
    events.sort()
    emitted: dict[str, int] = {}
    first: dict[str, float] = {}
    finished: dict[str, float] = {}
    cancelled: set[str] = set()

    def take(r: StepResult) -> None:
        for k, v in r.emitted.items():
            emitted[k] = emitted.get(k, 0) + v
        first.update(r.first_token)
        finished.update(r.finished)
        assert 0.0 <= m.kv_usage <= 1.0

    for t, kind, name in events:
        take(m.advance(t))
        i = int(name[1:])
        _, n_in, n_out, prio, fam, _ = reqs[i]
        if kind == 0:
            if not m.fits(n_in, n_out):
                continue
            hashes = tuple(fam * 100 + b for b in range(n_in // 16))
            m.submit(EngineRequest(f"r{i}", n_in, n_out, hashes, prio), t)
        elif m.cancel(f"r{i}", t):
            cancelled.add(f"r{i}")
    take(m.run_until_idle())
    assert m.num_running == 0 and m.num_waiting == 0 and m.kv_usage == 0.0
    for rid, t_end in finished.items():
        n_out = reqs[int(rid[1:])][2]
        assert emitted[rid] == n_out
        assert first[rid] <= t_end
    assert not (set(finished) & cancelled)
    submitted = {f"r{i}" for i, r in enumerate(reqs) if m.fits(r[1], r[2])}
    assert set(finished) | cancelled == submitted
    assert m.requests_finished == len(finished) and m.requests_cancelled == len(cancelled)
    assert m.generation_tokens >= sum(emitted[r] for r in finished)
