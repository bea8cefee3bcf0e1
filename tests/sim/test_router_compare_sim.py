"""``bench/router_compare_sim.py`` predicts a live replay from what the gateway sees of it: each request's
length and prefix-block hashes are the gateway's parse of the body the live replay sends (the chat template
and the synthesised words included), not the trace's scaled lengths, which are 6% short on Mooncake."""

from __future__ import annotations

import sys
from itertools import pairwise
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from router_compare_sim import live_prompt_slice, scaled_slice, send_jitter

from fleetgate.bench.prompts import PromptSynth
from fleetgate.bench.replay import ReplayOptions, plan_requests, request_body
from fleetgate.core.openai import parse_request
from fleetgate.sim.traces import Trace, default_traces_dir, load_trace

TRACE = default_traces_dir() / "mooncake" / "conversation_trace.jsonl"


@pytest.mark.skipif(not TRACE.exists(), reason="needs ../shared/traces")
def test_live_prompts_are_what_the_gateway_parses_from_the_replay() -> None:
    reqs = load_trace(TRACE, max_requests=40).requests
    live = live_prompt_slice(reqs, 8.0, 1 / 32).requests
    planned = plan_requests(Trace("t", reqs, "mooncake"), PromptSynth(tokens_scale=1 / 32))
    opts = ReplayOptions(base_url="", model="m")
    for sim_req, p in zip(live, planned, strict=True):
        parsed = parse_request(request_body(p, opts), "chat")
        assert sim_req.input_tokens == parsed.input_tokens
        assert sim_req.hash_ids == parsed.prefix_hashes
        assert sim_req.output_tokens == p.max_tokens
        assert sim_req.arrival_s == p.at_s / 8.0
    scaled = scaled_slice(reqs, 8.0, 1 / 32).requests
    assert sum(r.input_tokens for r in live) > 1.02 * sum(r.input_tokens for r in scaled)


@pytest.mark.skipif(not TRACE.exists(), reason="needs ../shared/traces")
def test_send_jitter_delays_each_arrival_a_little_and_keeps_every_request() -> None:
    trace = scaled_slice(load_trace(TRACE, max_requests=200).requests, 8.0, 1 / 32)
    moved = send_jitter(trace, 0.01, seed=3)
    arrivals = [r.arrival_s for r in moved.requests]
    assert arrivals == sorted(arrivals)

    def shape(t: Trace) -> list[tuple[int, int, tuple[int, ...]]]:
        return sorted((r.input_tokens, r.output_tokens, r.hash_ids) for r in t.requests)

    assert shape(moved) == shape(trace)  # the same requests
    # each arrival moved by 0-10 ms, so every order statistic did too (and some moved)
    shifts = [a - b for a, b in zip(arrivals, [r.arrival_s for r in trace.requests], strict=True)]
    assert all(-1e-12 <= d <= 0.01 + 1e-12 for d in shifts) and max(shifts) > 0.001
    assert send_jitter(trace, 0.01, seed=3).requests == moved.requests  # seeded


@pytest.mark.skipif(not TRACE.exists(), reason="needs ../shared/traces")
def test_llama_live_prompts_count_the_tiny_models_tokens_and_keep_the_gateways_hashes() -> None:
    from router_compare_sim import llama_prompt_slice

    from fleetgate.core.tokenize import render_chat_prompt
    from fleetgate.engines.llama import default_hf_model
    from fleetgate.hf_tokenizer import load_tokenizer
    from real_engines import need_llama

    need_llama()
    reqs = load_trace(TRACE, max_requests=40).requests
    tokenizer = load_tokenizer(default_hf_model())
    live = llama_prompt_slice(reqs, 1.5, 1 / 128, default_hf_model() / "tokenizer.json").requests
    planned = plan_requests(Trace("t", reqs, "mooncake"), PromptSynth(tokens_scale=1 / 128))
    opts = ReplayOptions(base_url="", model="m")
    for sim_req, p in zip(live, planned, strict=True):
        body = request_body(p, opts)
        engine_tokens = len(tokenizer.encode(render_chat_prompt(body["messages"])))
        assert sim_req.input_tokens == engine_tokens  # what llama-server counts (test_llama_engine.py)
        parsed = parse_request(body, "chat")
        assert sim_req.hash_ids == parsed.prefix_hashes  # where the live gateway places the request
        assert sim_req.block_tokens == max(1, round(16 * engine_tokens / parsed.input_tokens))
        assert sim_req.arrival_s == p.at_s / 1.5


def test_a_live_workload_replay_is_session_affinitys_trace_and_the_prediction_rebuilds_it() -> None:
    """``router_compare.py --workload agentic`` replays the first ``--requests`` of the trace
    ``session_affinity.build`` gives the simulator's matrix, and ``--from-live`` rebuilds it from ``meta``."""
    import argparse

    from router_compare import load_workload, workload_meta
    from router_compare_sim import workload_args
    from session_affinity import build

    args = argparse.Namespace(
        workload="agentic", workload_load=0.08, workload_per_replica=5.0, workload_seed=3, replicas=4,
        requests=50,
    )  # fmt: skip
    trace = load_workload(args)
    full = build("agentic", 4, 0.08, 5.0, 3, Path("/"))
    assert 0 < len(trace.requests) == 50 < len(full.requests)
    assert trace.requests == full.requests[:50]
    # the prompts share what the generator's sessions share: a later turn extends an earlier one's blocks
    by_session: dict[str, list[tuple[int, ...]]] = {}
    for r in trace.requests:
        by_session.setdefault(r.session or "", []).append(r.hash_ids)
    turns = [(a, b) for hs in by_session.values() for a, b in pairwise(hs)]
    assert turns and all(b[: len(a)] == a for a, b in turns)
    meta = {"workload": workload_meta(args), "replicas": 4, "requests": 50}
    assert load_workload(workload_args(meta)).requests == trace.requests
    live = live_prompt_slice(trace.requests, 14.0, 1 / 32).requests
    assert len(live) == 50 and all(r.input_tokens > 0 and r.hash_ids for r in live)


def test_a_smaller_live_engine_cache_reaches_the_engines_the_policy_and_the_prediction() -> None:
    """``router_compare.py --engine-cache-blocks N`` writes N into the engines' profile and the facts
    fleetgate gets, records it in ``meta.engine_profile``, and ``--from-live`` simulates that size."""
    import argparse

    from router_compare import ENGINE_PROFILE, engine_facts, engine_profile
    from router_compare_sim import apply_live, live_engine

    assert engine_profile() == ENGINE_PROFILE["perf"]
    small = engine_profile(512)
    assert small["prefix_cache_blocks"] == 512 and ENGINE_PROFILE["perf"]["prefix_cache_blocks"] == 4096
    assert engine_facts(0.25, small)["cache_tokens_per_replica"] == 512 * 16
    assert engine_facts(0.25)["cache_tokens_per_replica"] == 4096 * 16
    assert live_engine(0.25, 512).prefix_cache_blocks == 512
    assert live_engine(0.25).prefix_cache_blocks == 4096
    meta = {"trace": "t.jsonl", "requests": 10, "rate_scale": 8.0, "replicas": 4, "tokens_scale": 1 / 32,
            "engine_time_scale": 0.125, "engine_profile": small, "seed": 1}  # fmt: skip
    args = argparse.Namespace(variants="", params="{}", from_live=Path("x.json"))
    apply_live(args, {"meta": meta, "results": {"fleetgate:fleetgate": {}}})
    assert args.engine_cache_blocks == 512 and args.time_scale == 0.125
    apply_live(args, {"meta": {**meta, "engine_profile": None}, "results": {}})
    assert args.engine_cache_blocks is None  # runs before the option: the profile's own 4,096


def test_the_path_term_is_calibrated_on_the_nearest_gateway_cell_and_drawn_the_same_for_every_policy() -> (
    None
):
    """``--path-from`` (session 13): ``path_latency.py``'s open-loop gateway cell nearest the run's arrival
    rate gives the fit ``a + b * tokens`` of its per-request path (live minus simulated TTFT) and the fit's
    residuals; a draw's residuals depend on the draw only, so the paired ratios of one draw share them."""
    import numpy as np
    from router_compare_sim import PathTerm

    from fleetgate.sim.traces import TraceRequest

    def cell(mode: str, rate: float, a: float, b: float) -> dict[str, object]:
        noise = [0.001, -0.001, 0.0, 0.002, -0.002]
        rows = [
            {"tokens": t, "live": 0.05 + a + b * t + noise[i % 5], "sim": 0.05}
            for i, t in enumerate(range(100, 3100, 100))
        ]
        return {"mode": mode, "rate": rate, "time_scale": 0.03, "rows": rows}

    doc = {"cells": [cell("direct", 15, 0.5, 0.0), cell("gateway", 0, 0.3, 0.0),
                     cell("gateway", 15, 0.010, 2e-6), cell("gateway", 25, 0.020, 4e-6)]}  # fmt: skip
    term, note = PathTerm.from_calibration(doc, 17.0)
    assert term.fixed_s == pytest.approx(0.010, abs=5e-4) and term.per_token_s == pytest.approx(
        2e-6, rel=0.05
    )
    assert "15 req/s" in note and len(term.residuals_s) == 30
    assert PathTerm.from_calibration(doc, 24.0)[0].fixed_s == pytest.approx(0.020, abs=5e-4)
    assert PathTerm.from_calibration(doc, 17.0, residuals=False)[0].residuals_s == ()
    reqs = [TraceRequest(arrival_s=i * 0.1, input_tokens=100 * (i + 1), output_tokens=4) for i in range(20)]
    trace = Trace("t", reqs, "x")
    plain = PathTerm(0.010, 2e-6).delays(trace, 3)
    assert plain == pytest.approx([0.010 + 2e-6 * 100 * (i + 1) for i in range(20)])
    d3 = term.delays(trace, 3)
    assert np.array_equal(d3, term.delays(trace, 3)) and not np.array_equal(d3, term.delays(trace, 4))
    drawn = d3 - (term.fixed_s + term.per_token_s * np.array([r.input_tokens for r in reqs]))
    assert set(np.round(drawn, 12)) <= set(np.round(term.residuals_s, 12))  # each one a measured residual
    assert not PathTerm().active and PathTerm(0.001).active


@pytest.mark.skipif(not TRACE.exists(), reason="needs ../shared/traces")
def test_a_fixed_path_latency_shifts_every_ttft_percentile_and_nothing_else(tmp_path: Path) -> None:
    """``--path-ms 20`` adds 20 ms to every simulated TTFT: each percentile moves by exactly that, the hit
    rates and loads do not move, and without the option the figures are the ones the script printed before."""
    import json
    import os
    import subprocess

    bench, traces = Path(__file__).resolve().parents[2] / "bench", TRACE.parents[1]

    def run(*extra: str) -> dict[str, list[dict[str, float]]]:
        out = tmp_path / f"r{len(extra)}.json"
        subprocess.run(
            [sys.executable, str(bench / "router_compare_sim.py"), "--slices", "0", "--requests", "150",
             "--policies", "fleetgate,round_robin", "--rate", "6", "--json", str(out), *extra],
            check=True, capture_output=True, env={**os.environ, "FLEETGATE_TRACES_DIR": str(traces)},
        )  # fmt: skip
        return json.loads(out.read_text())["policies"]

    base, shifted = run(), run("--path-ms", "20")
    for pol in ("fleetgate", "round_robin"):
        a, b = base[pol][0], shifted[pol][0]
        for k in ("p50_s", "p95_s", "p99_s"):
            assert b[k] - a[k] == pytest.approx(0.020, abs=1e-9)
        assert b["hit_rate"] == a["hit_rate"] and b["max_over_mean_load"] == a["max_over_mean_load"]
