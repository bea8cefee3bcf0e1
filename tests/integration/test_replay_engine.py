"""``fleetgate bench replay`` against one real simulated engine (a real process on 127.0.0.1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from fleetgate.bench.prompts import PromptSynth
from fleetgate.bench.replay import PlannedRequest, ReplayOptions, plan_requests, run_replay
from fleetgate.sim.traces import load_trace


def _write_trace(path: Path) -> None:
    """Six conversations of two turns: each second turn repeats its first turn's 3 blocks (+1 new)."""
    lines = []
    for conv in range(6):
        base = conv * 10
        lines.append({"timestamp": conv * 100, "input_length": 3 * 512, "output_length": 96,
                      "hash_ids": [base, base + 1, base + 2]})  # fmt: skip
        lines.append({"timestamp": 1000 + conv * 100, "input_length": 4 * 512, "output_length": 64,
                      "hash_ids": [base, base + 1, base + 2, base + 3]})  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


async def test_replay_against_engine(tmp_path: Path, start_engine: Any) -> None:
    engine = start_engine("replay-model")
    trace_path = tmp_path / "trace.jsonl"
    _write_trace(trace_path)
    trace = load_trace(trace_path)
    planned = plan_requests(trace, PromptSynth(tokens_scale=1 / 32))
    opts = ReplayOptions(
        base_url=engine.url,
        model="replay-model",
        metrics_urls=[engine.url + "/metrics"],
        scrape_interval_s=0.5,
        keep_rows=True,
        request_id_prefix="replay-",
    )
    rep = await run_replay(planned, opts)
    assert rep["requests"] == 12 and rep["ok"] == 12 and rep["errors"] == 0
    assert rep["output_tokens"] == 6 * 3 + 6 * 2  # 96/32 and 64/32 forced with ignore_eos
    ttft = rep["ttft_s"]
    assert 0 < ttft["p50"] <= ttft["p95"] <= ttft["p99"] <= ttft["max"]
    assert rep["e2e_s"]["p50"] >= ttft["p50"]
    # Every second turn finds its first turn's three shared blocks cached (the cut ends inside block 4).
    # The engine's /metrics delta agrees exactly with the usage it reported per request.
    assert rep["usage_cached_token_share"] > 0.2
    assert rep["prefix_cache_hit_rate"] == rep["usage_cached_token_share"]
    assert rep["engines"][0]["requests"] == 12
    assert rep["load_max_over_mean_window"] == 1.0  # one replica
    # every request's own row, in plan order: the second turns are the ones with cached tokens
    rows = rep["request_rows"]
    assert [r["index"] for r in rows] == list(range(12)) and all(r["ok"] for r in rows)
    assert all(r["cached_tokens"] == 0 for r in rows[:6]) and all(r["cached_tokens"] > 0 for r in rows[6:])
    cached, prompt = sum(r["cached_tokens"] for r in rows), sum(r["prompt_tokens"] for r in rows)
    assert cached / prompt == rep["usage_cached_token_share"]


def test_cli_replay_writes_json(tmp_path: Path, start_engine: Any) -> None:
    engine = start_engine("cli-model")
    trace_path = tmp_path / "trace.jsonl"
    _write_trace(trace_path)
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "fleetgate.cli", "bench", "replay", "--trace", str(trace_path),
         "--gateway", engine.url, "--model", "cli-model", "--time-scale", "0.5", "--max-requests", "8",
         "--metrics-url", engine.url + "/metrics", "--json", str(out), "--quiet"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(out.read_text())
    assert rep["requests"] == 8 and rep["errors"] == 0
    assert rep["config"]["time_scale"] == 0.5
    assert "TTFT ms p50/p95/p99" in proc.stderr


async def test_replay_sends_each_request_with_its_plan_index_as_request_id() -> None:
    """With ``request_id_prefix`` every request carries ``x-request-id: <prefix><index>`` (what fleetgate's
    access log then shows beside the replica it chose); without it, none."""
    from aiohttp import web

    from aiohttp_site import serve_app

    seen: list[str | None] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("x-request-id"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    planned = [
        PlannedRequest(index=i, at_s=0.01 * i, prompt="hello", max_tokens=1, trace_input_tokens=1)
        for i in range(3)
    ]
    async with serve_app(app) as url:
        rep = await run_replay(planned, ReplayOptions(base_url=url, model="m", request_id_prefix="replay-"))
        assert rep["ok"] == 3
        assert sorted(seen) == ["replay-0", "replay-1", "replay-2"]
        seen.clear()
        await run_replay(planned, ReplayOptions(base_url=url, model="m"))
        assert seen == [None, None, None]
