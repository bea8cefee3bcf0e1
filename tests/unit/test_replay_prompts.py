"""Prompt synthesis for trace replay and the replay report's statistics (pure functions, no servers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgate.bench.prompts import PromptSynth
from fleetgate.bench.replay import (
    EngineCounters,
    ReplayOptions,
    RequestResult,
    Sample,
    _has_token,
    _histogram_quantile,
    load_windows,
    plan_requests,
    request_body,
    summarize,
)
from fleetgate.core.tokenize import block_hashes, count_tokens, render_chat_prompt
from fleetgate.core.units import DEFAULT_PROFILE
from fleetgate.engines.metrics import parse_prometheus_text
from fleetgate.sim.traces import load_trace


def _chat(text: str) -> str:
    return render_chat_prompt([{"role": "user", "content": text}])


def _shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_block_is_scaled_and_every_word_is_one_token() -> None:
    synth = PromptSynth(tokens_scale=1 / 32)
    assert synth.block_len == 16
    words = synth.block_words(7)
    assert len(words) == 16
    assert all(count_tokens(w) == 1 for w in words)
    assert count_tokens("".join(words)) == 16


def test_length_follows_the_trace_scaled() -> None:
    synth = PromptSynth(tokens_scale=1 / 32)
    text = synth.text([1, 2, 3], 1400)  # 3 blocks of 512, last one partial
    assert count_tokens(text) == round(1400 / 32) == 44
    # the partial last block is a prefix of that block's words
    assert text.endswith("".join(synth.block_words(3)[: 44 - 32]))


def test_shared_hash_ids_share_text_and_engine_block_hashes() -> None:
    synth = PromptSynth(tokens_scale=1 / 32)
    a = synth.text([10, 11, 12, 13], 4 * 512)
    b = synth.text([10, 11, 12, 99], 4 * 512)
    c = synth.text([50, 51, 52, 53], 4 * 512)
    shared_text = "".join(synth.block_words(10) + synth.block_words(11) + synth.block_words(12))
    assert a.startswith(shared_text) and b.startswith(shared_text)
    assert a[len(shared_text) :] != b[len(shared_text) :]
    ha, hb, hc = (block_hashes(_chat(t), 16) for t in (a, b, c))
    template = count_tokens(_chat("")[: _chat("").index("<|im_end|>")])  # tokens before the content
    # the rendered prompts share exactly the 16-token blocks that lie inside the shared text
    assert _shared(ha, hb) == (template + 3 * 16) // 16
    assert _shared(ha, hc) == 0


@settings(max_examples=40, deadline=None)
@given(
    common=st.lists(st.integers(0, 10**6), min_size=0, max_size=6, unique=True),
    tail_a=st.lists(st.integers(10**6 + 1, 2 * 10**6), min_size=1, max_size=4, unique=True),
    tail_b=st.lists(st.integers(2 * 10**6 + 1, 3 * 10**6), min_size=1, max_size=4, unique=True),
    scale=st.sampled_from([1 / 32, 1 / 16, 1 / 64]),
)
def test_property_shared_prefix_blocks(
    common: list[int], tail_a: list[int], tail_b: list[int], scale: float
) -> None:
    synth = PromptSynth(tokens_scale=scale)
    ids_a, ids_b = common + tail_a, common + tail_b
    a = synth.text(ids_a, len(ids_a) * 512)
    b = synth.text(ids_b, len(ids_b) * 512)
    n = synth.block_len
    prefix = len(common) * n
    assert count_tokens(a) == len(ids_a) * n
    pa, pb = a.split(" "), b.split(" ")
    assert pa[: prefix + 1] == pb[: prefix + 1]  # leading "" then the shared words
    assert pa[prefix + 1 : prefix + 1 + n] != pb[prefix + 1 : prefix + 1 + n]  # the next blocks differ
    ha, hb = block_hashes(a, 16), block_hashes(b, 16)
    assert _shared(ha, hb) >= prefix // 16


def test_deterministic_across_instances_and_seeded() -> None:
    assert PromptSynth(seed=3).text([1, 2], 1024) == PromptSynth(seed=3).text([1, 2], 1024)
    assert PromptSynth(seed=3).text([1, 2], 1024) != PromptSynth(seed=4).text([1, 2], 1024)


def test_requests_without_ids_get_unique_text() -> None:
    synth = PromptSynth(tokens_scale=1 / 32)
    with pytest.raises(ValueError):
        synth.text([], 1000)
    a = synth.text([], 1000, unique_key="req1")
    b = synth.text([], 1000, unique_key="req2")
    assert count_tokens(a) == count_tokens(b) == 31
    assert _shared(block_hashes(a), block_hashes(b)) == 0


def test_plan_requests_scales_outputs_and_times(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 3000, "input_length": 1024, "output_length": 320, "hash_ids": [0, 1]}\n'
        '{"timestamp": 6000, "input_length": 1536, "output_length": 10, "hash_ids": [0, 1, 2]}\n'
    )
    trace = load_trace(path)
    planned = plan_requests(trace, PromptSynth(tokens_scale=1 / 32))
    assert [p.at_s for p in planned] == [0.0, 3.0]
    assert [p.max_tokens for p in planned] == [10, 1]
    assert planned[1].prompt.startswith(planned[0].prompt)
    capped = plan_requests(trace, PromptSynth(tokens_scale=1 / 32), output_scale=1.0, max_output_tokens=50)
    assert [p.max_tokens for p in capped] == [50, 10]
    body = request_body(planned[0], ReplayOptions(base_url="http://x", model="m"))
    assert body["stream"] and body["ignore_eos"] and body["stream_options"] == {"include_usage": True}
    assert body["messages"][0]["content"] == planned[0].prompt
    assert "prompt" in request_body(planned[0], ReplayOptions(base_url="x", model="m", api="completions"))


def test_summarize_hit_rate_load_and_percentiles() -> None:
    results = [
        RequestResult(i, 0.1 * i, ok=True, status=200, ttft_s=0.1 * (i + 1), e2e_s=0.2 * (i + 1),
                      prompt_tokens=100, completion_tokens=10, cached_tokens=50 * (i % 2), finished_s=5.0)
        for i in range(10)
    ]  # fmt: skip
    results.append(RequestResult(10, 1.0, ok=False, status=500, error="http_500: boom"))
    e0 = EngineCounters()
    a1 = EngineCounters(
        prefix_queries=600, prefix_hits=150, prompt_tokens=600, generation_tokens=60, requests=6
    )
    b1 = EngineCounters(
        prefix_queries=400, prefix_hits=100, prompt_tokens=400, generation_tokens=40, requests=4
    )
    samples = [Sample(0.0, [e0, e0]), Sample(5.0, [a1, b1])]
    opts = ReplayOptions(base_url="x", model="m", metrics_urls=["u1", "u2"], window_s=60.0)
    rep = summarize(results, samples, opts, wall_s=5.0)
    assert rep["requests"] == 11 and rep["ok"] == 10 and rep["errors"] == 1
    assert rep["error_kinds"] == {"http_500": 1}
    assert rep["ttft_s"]["p50"] == pytest.approx(0.55)
    assert rep["ttft_s"]["max"] == pytest.approx(1.0)
    assert rep["prefix_cache_hit_rate"] == pytest.approx(250 / 1000)
    assert rep["output_tokens"] == 100 and rep["output_tokens_per_s"] == pytest.approx(20.0)
    mu1 = DEFAULT_PROFILE.cost(600, 60, cached_tokens=150) + 5 * DEFAULT_PROFILE.gamma
    mu2 = DEFAULT_PROFILE.cost(400, 40, cached_tokens=100) + 3 * DEFAULT_PROFILE.gamma
    assert rep["load_max_over_mean_total"] == pytest.approx(mu1 / ((mu1 + mu2) / 2), rel=1e-3)
    assert rep["load_max_over_mean_window"] == pytest.approx(rep["load_max_over_mean_total"], rel=1e-3)


def test_load_windows_split_by_time() -> None:
    def c(n: float) -> EngineCounters:
        return EngineCounters(prompt_tokens=100 * n, generation_tokens=10 * n, requests=n)

    samples = [Sample(float(t), [c(t), c(2 * t if t <= 60 else 120 + (t - 60))]) for t in range(0, 121, 10)]
    wins = load_windows(samples, DEFAULT_PROFILE, 60.0)
    assert len(wins) == 2
    assert wins[0]["max_over_mean"] == pytest.approx(4 / 3, rel=1e-2)  # 2:1 split in the first minute
    assert wins[1]["max_over_mean"] == pytest.approx(1.0)  # even in the second


def test_histogram_quantile() -> None:
    parsed = parse_prometheus_text(
        'x_bucket{le="0.001"} 0\nx_bucket{le="0.002"} 50\nx_bucket{le="0.004"} 100\nx_bucket{le="+Inf"} 100\n'
    )
    assert _histogram_quantile(parsed, "x", 0.5) == pytest.approx(0.002)
    assert _histogram_quantile(parsed, "x", 0.75) == pytest.approx(0.003)
    assert _histogram_quantile({}, "x", 0.5) is None


def test_a_finishing_chunk_shows_the_first_token_even_with_an_empty_delta() -> None:
    # vLLM ends a one-token answer whose text it holds back (a byte-level token) with an empty delta and
    # finish_reason "length": that token was generated, so the replay's TTFT is that chunk's arrival
    assert _has_token({"index": 0, "delta": {"content": ""}, "finish_reason": "length"})
    assert not _has_token({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
    assert _has_token({"index": 0, "delta": {"content": " ran"}, "finish_reason": None})
    assert _has_token({"index": 0, "text": "x"})
