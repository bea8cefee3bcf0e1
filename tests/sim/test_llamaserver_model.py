"""The llama-server engine model (``simengine.llamaserver``) follows llama-server's semantics: a prompt
reuses its common *token* prefix with the slot's cached tokens (not whole hash blocks), at least one token is
evaluated, slots are chosen by prompt similarity or else least recently used, the host-memory prompt cache
restores a prompt that another one pushed out of its slot, requests wait first in first out for a slot, and
an iteration's time is the calibrated cost of its one batch."""

from __future__ import annotations

import pytest

from fleetgate.core.routing.registry import build_policy
from fleetgate.core.units import DEFAULT_PROFILE
from fleetgate.sim.des import SimConfig, Simulator
from fleetgate.sim.traces import Trace, TraceRequest
from fleetgate.simengine.llamaserver import LlamaServerModel, LlamaServerParams, common_prefix
from fleetgate.simengine.perfmodel import EngineModel, EngineRequest, PerfParams

COST = dict(step_s=1e-3, token_s=1e-4, attn_s=1e-7, sample_s=5e-4)


def toks(*parts: range | tuple[int, ...]) -> tuple[int, ...]:
    return tuple(t for p in parts for t in p)


def run(model: LlamaServerModel, rid: str, prompt: tuple[int, ...], now: float, n_out: int = 1) -> int:
    """Submit one request at ``now``, run to idle; its cached tokens."""
    model.submit(EngineRequest(rid, len(prompt), n_out, prompt_tokens=prompt), now)
    res = model.run_until_idle()
    assert rid in res.finished
    return res.cached_tokens[rid]


def test_common_prefix_of_token_sequences() -> None:
    a = tuple(range(100))
    assert common_prefix(a, a) == 100
    assert common_prefix(a, (*a[:37], -1, *a[38:])) == 37
    assert common_prefix(a, a[:10]) == 10
    assert common_prefix((), a) == 0
    assert common_prefix((5,), (6,)) == 0


def test_any_common_token_prefix_is_reused_not_whole_blocks() -> None:
    model = LlamaServerModel(LlamaServerParams(parallel=1, cache_ram_mib=0, **COST))
    first = toks(range(37), range(1000, 1050))
    assert run(model, "a", first, 0.0) == 0
    # shares 37 tokens with the slot's prompt: all 37 are reused (a 16-token block cache would keep 32)
    second = toks(range(37), range(2000, 2030))
    assert run(model, "b", second, 1.0) == 37
    assert model.prefix_cache_hits == 37
    assert model.prefix_cache_queries == len(first) + len(second)

    # the same two prompts as 16-token block hashes in the block model: only 2 whole blocks match
    blocks = EngineModel(PerfParams(max_num_seqs=1, block_tokens=16))
    h1, h2 = (1, 2, 3, 4, 5), (1, 2, 30, 40)
    blocks.submit(EngineRequest("a", len(first), 1, h1), 0.0)
    blocks.run_until_idle()
    blocks.submit(EngineRequest("b", len(second), 1, h2), 1.0)
    assert blocks.run_until_idle().cached_tokens["b"] == 32


def test_a_repeated_prompt_still_evaluates_one_token() -> None:
    model = LlamaServerModel(LlamaServerParams(parallel=1, cache_ram_mib=0, **COST))
    p = tuple(range(80))
    run(model, "a", p, 0.0)
    assert run(model, "b", p, 1.0) == 79


def test_similar_prompt_takes_its_slot_others_the_least_recently_used() -> None:
    model = LlamaServerModel(LlamaServerParams(parallel=2, cache_ram_mib=0, **COST))
    a, b = tuple(range(100)), tuple(range(5000, 5100))
    run(model, "a", a, 0.0)
    run(model, "b", b, 1.0)
    slot_of = {s.state.tokens[:1]: s.id for s in model.slots}
    assert set(slot_of) == {(0,), (5000,)}  # one slot each
    # each extension goes to the slot holding its prefix, whichever slot is least recently used
    assert run(model, "a2", (*a, 7, 8, 9), 2.0) == 100
    assert run(model, "b2", (*b, 7, 8), 3.0) == 100
    # 5 shared tokens of 100 is a similarity of 0.05 < 0.1: the least recently used slot (a2's) is taken
    lru = min(model.slots, key=lambda s: s.last_used)
    assert lru.state.tokens[:1] == (0,)
    cached = run(model, "c", tuple(range(5000, 5005)) + tuple(range(9000, 9095)), 4.0)
    assert cached == 0  # on a's old slot, which shares nothing with it
    assert {s.state.tokens[:1] for s in model.slots} == {(5000,)}


def test_the_prompt_cache_restores_a_prompt_pushed_out_of_its_slot() -> None:
    p, q = tuple(range(200)), tuple(range(7000, 7150))
    ext = p + tuple(range(300, 340))
    with_cache = LlamaServerModel(LlamaServerParams(parallel=1, cache_ram_mib=1, **COST))
    without = LlamaServerModel(LlamaServerParams(parallel=1, cache_ram_mib=0, **COST))
    for model in (with_cache, without):
        run(model, "p", p, 0.0)
        assert run(model, "q", q, 1.0) == 0  # q overwrites p in the only slot
    assert [e.tokens for e in with_cache.cache] == [p]  # p was saved when q took its slot
    assert run(with_cache, "ext", ext, 2.0) == 200  # restored from host memory
    assert run(without, "ext", ext, 2.0) == 0
    # loading moved p out of the cache, and saving q (pushed out by ext) put q in
    assert [e.tokens for e in with_cache.cache] == [q]


def test_prompt_cache_evicts_the_oldest_beyond_its_size() -> None:
    # 1 MiB at 4 KiB a token: 256 tokens; three 100-token prompts do not fit
    params = LlamaServerParams(parallel=1, cache_ram_mib=1, kv_bytes_per_token=4096, **COST)
    model = LlamaServerModel(params)
    prompts = [tuple(range(k * 1000, k * 1000 + 100)) for k in range(4)]
    for k, pr in enumerate(prompts):
        run(model, f"r{k}", pr, float(k))
    assert [e.tokens[0] for e in model.cache] == [1000, 2000]  # r0 went first
    assert model.cache_tokens() * 4096 <= 2**20


def test_generated_tokens_stay_in_the_slot_and_match_no_prompt() -> None:
    model = LlamaServerModel(LlamaServerParams(parallel=1, cache_ram_mib=0, **COST))
    p = tuple(range(50))
    run(model, "a", p, 0.0, n_out=6)
    assert len(model.slots[0].state) == 55  # the prompt and the 5 sampled tokens fed back
    assert run(model, "b", (*p, 1, 2, 3), 1.0) == 50


def test_iteration_time_and_ttft_follow_the_batch() -> None:
    params = LlamaServerParams(parallel=2, batch_size=64, cache_ram_mib=0, **COST)
    model = LlamaServerModel(params)
    model.submit(EngineRequest("a", 100, 3, prompt_tokens=tuple(range(100))), 0.0)
    res = model.run_until_idle()
    # 64 prompt tokens, then 36 with the first token sampled, then two decode iterations at 100 and 101
    t1 = COST["step_s"] + 64 * COST["token_s"] + 64 * 64 * COST["attn_s"]
    t2 = t1 + COST["step_s"] + 36 * COST["token_s"] + 36 * (2 * 64 + 36) * COST["attn_s"] + COST["sample_s"]
    assert res.first_token["a"] == pytest.approx(t2)
    dec = [
        COST["step_s"] + COST["token_s"] + (2 * k + 1) * COST["attn_s"] + COST["sample_s"] for k in (100, 101)
    ]
    assert res.finished["a"] == pytest.approx(t2 + sum(dec))
    assert res.iterations == 4


def test_decode_tokens_go_first_and_prompts_fill_the_batch_in_slot_order() -> None:
    params = LlamaServerParams(parallel=3, batch_size=64, cache_ram_mib=0, **COST)
    model = LlamaServerModel(params)
    model.submit(EngineRequest("long", 10, 50, prompt_tokens=tuple(range(10))), 0.0)
    model.step()  # long's prompt: it decodes from now on
    model.submit(EngineRequest("x", 60, 1, prompt_tokens=tuple(range(100, 160))), 0.0)
    model.submit(EngineRequest("y", 60, 1, prompt_tokens=tuple(range(200, 260))), 0.0)
    res = model.step()
    # the LRU ties go to the last idle slot: long on slot 2, x on slot 1, y on slot 0; one decode token
    # first, then prompts in slot order: y (arrived last) all 60 (its first token), x the 3 left
    assert "y" in res.first_token and "x" not in res.first_token
    x_slot = model.slots[1]
    assert x_slot.req is not None and x_slot.req.rid == "x" and x_slot.req.done == 3
    assert model.slots[2].req is not None and model.slots[2].req.rid == "long"
    assert model.slots[2].req.generated == 2


def test_requests_wait_first_in_first_out_for_a_slot() -> None:
    model = LlamaServerModel(LlamaServerParams(parallel=1, cache_ram_mib=0, **COST))
    for k in range(3):
        model.submit(EngineRequest(f"r{k}", 20, 4, prompt_tokens=tuple(range(k * 100, k * 100 + 20))), 0.0)
    assert model.num_waiting == 3
    first = model.step()
    assert model.num_waiting == 2 and model.num_running == 1
    res = model.run_until_idle()
    res.first_token.update(first.first_token)
    assert res.admitted["r1"] == pytest.approx(res.finished["r0"])
    assert res.admitted["r2"] == pytest.approx(res.finished["r1"])
    assert res.first_token["r0"] < res.first_token["r1"] < res.first_token["r2"]


def test_the_simulator_hands_the_trace_token_ids_to_the_engine() -> None:
    """Through ``sim.des``: conversation turns that share 40 tokens (not a multiple of any block) hit 40."""
    shared = tuple(range(40))
    reqs = [
        TraceRequest(float(k), 60, 2, hash_ids=(1, 2), block_tokens=16, session="s",
                     token_ids=shared + tuple(range(1000 * (k + 1), 1000 * (k + 1) + 20)))
        for k in range(4)
    ]  # fmt: skip
    sim = Simulator(
        Trace("t", reqs, "test"),
        build_policy("round_robin", {}),
        DEFAULT_PROFILE,
        lambda name: LlamaServerModel(LlamaServerParams(parallel=1, cache_ram_mib=0, **COST)),
        SimConfig(replicas=1, seed=1),
    )
    res = sim.run()
    assert res.summary["cache_hit_rate"] == pytest.approx(3 * 40 / (4 * 60))


def test_the_probe_fit_recovers_the_model_cost_from_its_own_timings() -> None:
    """``llama_fleet.fit_engine_model`` (the live probe's fit) read on timings this model produces gives back
    the model's own step, token, attention and sampling costs: the probe measures what the model means."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from llama_fleet import fit_engine_model

    params = LlamaServerParams(parallel=4, cache_ram_mib=0, **COST)
    prefill: list[tuple[float, int, int]] = []
    for k, (n, c) in enumerate([(60, 0), (250, 0), (700, 0), (1400, 0), (60, 300), (250, 600), (90, 1200)]):
        model = LlamaServerModel(params)
        base = tuple(range(10_000 * k, 10_000 * k + c))
        if c:
            run(model, "warm", (*base, -1), 0.0)
        t0 = 10.0
        prompt = (*base, *range(10_000 * k + 5000, 10_000 * k + 5000 + n))
        model.submit(EngineRequest("p", len(prompt), 1, prompt_tokens=prompt), t0)
        prefill.append((model.run_until_idle().first_token["p"] - t0, n, c))
    decode: list[tuple[float, int, float]] = []
    out = 65
    for d in range(1, 5):
        model = LlamaServerModel(params)
        for i in range(d):
            model.submit(
                EngineRequest(f"d{i}", 12, out, prompt_tokens=tuple(range(100 * i, 100 * i + 12))), 0.0
            )
        res = model.run_until_idle()
        for i in range(d):
            per_token = (res.finished[f"d{i}"] - res.first_token[f"d{i}"]) / (out - 1)
            decode.append((per_token, d, d * (2 * (12 + out / 2) + 1)))
    fit = fit_engine_model(prefill, decode)
    assert fit["decode_step_s"] == pytest.approx(COST["step_s"], rel=0.05)
    assert 1 / fit["prefill_tokens_per_s"] == pytest.approx(COST["token_s"], rel=0.02)
    assert fit["prefill_s_per_token_sq"] == pytest.approx(COST["attn_s"], rel=0.02)
    assert fit["sample_s"] == pytest.approx(COST["sample_s"], rel=0.05)
    assert fit["prefill_mape"] < 0.01 and fit["decode_mape"] < 0.01
