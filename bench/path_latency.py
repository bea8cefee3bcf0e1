"""The live path's latency: what a request spends outside the simulator's model on its way to the first token.

``router_compare.py``'s live setup is a fleetgate gateway (plus the replay client) on CPU 0 in front of
``fleetgate engine sim`` replicas on CPU 1. The simulator (``router_compare_sim.py``) models the engines'
work and the routing, not the HTTP, JSON, tokenisation and SSE of the client, the gateway and the engines, nor
the wake-up lateness of their event loops. This script measures that remainder from outside, on ONE engine
replica, so it can be calibrated apart from the runs it is meant to correct:

- each *cell* (``T:RATE:N``) replays the first N requests of the Mooncake trace (``PromptSynth``'s prompts,
  the live replay's chat body and client, ``bench.replay``) to one fresh engine at time scale T, either
  sequentially (RATE 0: one request at a time, latency from its send) or open-loop at Poisson RATE req/s;
- ``direct`` sends to the engine, ``gateway`` through a fleetgate gateway (``--policy``, with the engine facts
  ``router_compare.py`` gives it), both pinned as ``router_compare.py`` pins them;
- every request is also run through the discrete-event simulator (one replica, the same engine model,
  the same prompts' gateway token counts and block hashes, arrivals at the live send times): its *path* is
  live TTFT minus simulated TTFT. The engines' own mean TTFT (``/metrics``) splits it into what happens
  inside the engine process (parse, tokenisation, driver lateness) and what happens before it.

Per cell it prints the path's mean / p50 / p95 and a least-squares fit ``path = a + b * prompt tokens``.
Every live cell should run under ``flock /tmp/fleetgate-live.lock`` (timing matters)::

    flock /tmp/fleetgate-live.lock .venv/bin/python bench/path_latency.py --modes direct,gateway \\
        --cells 0.125:0:100,0.125:4:240,0.03:15:450 --out /tmp/path.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml
from live_procs import Proc, spawn, stop_all, wait_http, wait_ready_line
from router_compare import MODEL, engine_facts, engine_profile
from router_compare_sim import live_engine, live_prompt_slice
from router_repeats import cpu_shares, cpu_times

from fleetgate.bench.prompts import PromptSynth
from fleetgate.bench.replay import PlannedRequest, ReplayOptions, RequestResult, _send, plan_requests
from fleetgate.core.routing.registry import build_policy
from fleetgate.core.units import DEFAULT_PROFILE
from fleetgate.engines.metrics import parse_prometheus_text
from fleetgate.sim.des import SimConfig, Simulator, default_ids
from fleetgate.sim.traces import Trace, TraceRequest, default_traces_dir, load_trace
from fleetgate.simengine.perfmodel import EngineModel

PY = sys.executable


def cell_requests(trace: Sequence[TraceRequest], n: int, rate: float, seed: int) -> list[TraceRequest]:
    """The trace's first ``n`` requests, re-timed: Poisson arrivals at ``rate`` req/s (0: all at 0)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for r in trace[:n]:
        out.append(replace(r, arrival_s=t))
        if rate > 0:
            t += rng.expovariate(rate)
    return out


async def replay(planned: Sequence[PlannedRequest], base: str, sequential: bool) -> list[RequestResult]:
    """``bench.replay``'s client (the same request body, SSE parsing and timing), keeping every request's
    result: open loop from each scheduled time, or one at a time (latency from the send)."""
    import aiohttp

    opts = ReplayOptions(base_url=base, model=MODEL, measure_from_send=sequential, request_timeout_s=120.0)
    url = base + "/v1/chat/completions"
    headers = {"Content-Type": "application/json"}
    sem = asyncio.Semaphore(1) if sequential else None
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter() + 0.3
        tasks = []
        for req in planned:
            scheduled = start + req.at_s
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_send(session, url, headers, req, opts, scheduled, sem)))
        return list(await asyncio.gather(*tasks))


def engine_ttft(url: str) -> tuple[float, float]:
    """The engine's own TTFT histogram (sum, count): arrival in its handler to the first token published."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        parsed = parse_prometheus_text(resp.read().decode())

    def total(name: str) -> float:
        return float(sum(v for _, v in parsed.get(name, [])))

    return total("vllm:time_to_first_token_seconds_sum"), total("vllm:time_to_first_token_seconds_count")


def simulate(
    reqs: list[TraceRequest], sends: Sequence[float], time_scale: float, blocks: int | None, policy: str
) -> np.ndarray:
    """Per-request simulated TTFT of ``reqs`` (live prompts) on one replica, arriving at ``sends``."""
    trace = live_prompt_slice(reqs, 1.0, 1 / 32)
    moved = [replace(r, arrival_s=s) for r, s in zip(trace.requests, sends, strict=True)]
    order = sorted(range(len(moved)), key=lambda i: moved[i].arrival_s)
    trace = replace(trace, requests=[moved[i] for i in order])
    perf = live_engine(time_scale, blocks)
    params = engine_facts(time_scale, engine_profile(blocks)) if policy == "fleetgate" else {}
    sim = Simulator(
        trace,
        build_policy(policy, params),
        DEFAULT_PROFILE,
        lambda _name: EngineModel(perf),
        SimConfig(replicas=1, seed=1, replica_ids=default_ids("r")),
    )
    res = sim.run()
    ttft = np.full(len(moved), np.nan)
    ttft[order] = res.ttft_s
    return ttft


def start_gateway(engine: Proc, policy: str, time_scale: float, blocks: int | None, logdir: Path) -> Proc:
    params = engine_facts(time_scale, engine_profile(blocks)) if policy == "fleetgate" else {}
    cfg = {
        "gateway": {"host": "127.0.0.1", "port": 0},
        "deployments": [
            {
                "model": MODEL,
                "routing": {"policy": policy, "params": params},
                "replicas": [{"name": "r0", "url": engine.url}],
            }
        ],
    }
    path = logdir / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = spawn("gateway", [PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], logdir, {0})
    wait_ready_line([proc])
    assert proc.url is not None
    wait_http(proc.url + "/readyz", proc)
    return proc


def run_cell(
    mode: str, time_scale: float, rate: float, n: int, args: argparse.Namespace, trace: list[TraceRequest]
) -> dict[str, Any]:
    logdir = Path(tempfile.mkdtemp(prefix="path-latency-"))
    profile = logdir / "engine-profile.yaml"
    profile.write_text(yaml.safe_dump({"perf": engine_profile(args.engine_cache_blocks)}))
    reqs = cell_requests(trace, n, rate, args.seed)
    planned = plan_requests(Trace("cell", reqs, "mooncake"), PromptSynth(tokens_scale=1 / 32))
    engine = spawn(
        "engine",
        [PY, "-m", "fleetgate.cli", "engine", "sim", "--port", "0", "--model", MODEL,
         "--time-scale", str(time_scale), "--profile", str(profile), "--seed", "0"],
        logdir,
        {1},
    )  # fmt: skip
    procs = [engine]
    # busy loops at nice 19 on every CPU: the other sessions' niced simulator jobs the kept runs shared the
    # machine with (their blocks' CPU shares: idle 0, nice 0.4-0.5)
    for k in range(args.niced_burners):
        procs.append(spawn(f"burn{k}", ["nice", "-n", "19", PY, "-c", "while 1: pass"], logdir, None))
    load_before, cpu_before = os.getloadavg()[0], cpu_times()
    try:
        wait_ready_line([engine])
        assert engine.url is not None
        base = engine.url
        if mode == "gateway":
            gw = start_gateway(engine, args.policy, time_scale, args.engine_cache_blocks, logdir)
            procs.append(gw)
            assert gw.url is not None
            base = gw.url
        s0, c0 = engine_ttft(engine.url)
        t0 = time.monotonic()
        results = asyncio.run(replay(planned, base, sequential=rate == 0))
        wall = time.monotonic() - t0
        s1, c1 = engine_ttft(engine.url)
        cpu = cpu_shares(cpu_before, cpu_times())
    finally:
        stop_all(procs)
    ok = [r for r in results if r.ok and r.ttft_s is not None]
    # the simulated request arrives when the live one was sent (sequential: after the previous one finished)
    sends = [r.at_s + (r.queued_s if rate == 0 else 0.0) for r in results]
    sim = simulate(reqs, sends, time_scale, args.engine_cache_blocks, args.policy)
    sim_trace = live_prompt_slice(reqs, 1.0, 1 / 32)
    tokens = np.array([r.input_tokens for r in sim_trace.requests], dtype=float)
    live = np.array([r.ttft_s if r.ok and r.ttft_s is not None else np.nan for r in results])
    path = live - sim
    good = ~np.isnan(path)
    fit = np.polyfit(tokens[good], path[good], 1) if good.sum() > 2 else [np.nan, np.nan]
    eng_mean = (s1 - s0) / (c1 - c0) if c1 > c0 else None
    rec = {
        "mode": mode,
        "policy": args.policy if mode == "gateway" else None,
        "time_scale": time_scale,
        "rate": rate,
        "requests": n,
        "niced_burners": args.niced_burners,
        "ok": len(ok),
        "wall_s": round(wall, 1),
        "load_avg_1min": [load_before, os.getloadavg()[0]],
        "cpu_shares": cpu,
        "live_ttft_mean_s": float(np.nanmean(live)),
        "sim_ttft_mean_s": float(np.nanmean(sim)),
        "engine_ttft_mean_s": eng_mean,
        "path_ms": {
            "mean": float(np.nanmean(path) * 1e3),
            "p50": float(np.nanpercentile(path, 50) * 1e3),
            "p95": float(np.nanpercentile(path, 95) * 1e3),
        },
        "path_fit_ms": {"a": float(fit[1] * 1e3), "b_per_1k_tokens": float(fit[0] * 1e6)},
        "mean_prompt_tokens": float(tokens.mean()),
        "rows": [
            {
                "tokens": int(t),
                "out": p.max_tokens,
                "live": None if np.isnan(lv) else float(lv),
                "sim": None if np.isnan(sv) else float(sv),
                "send": s,
            }
            for t, p, lv, sv, s in zip(tokens, planned, live, sim, sends, strict=True)
        ],
    }
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--trace", type=Path, default=default_traces_dir() / "mooncake" / "conversation_trace.jsonl"
    )
    ap.add_argument("--modes", default="direct,gateway")
    ap.add_argument("--cells", default="0.125:0:100,0.125:4:240,0.03:15:450", help="T:RATE:N,...")
    ap.add_argument("--policy", default="fleetgate", help="The gateway's routing policy (and the DES's).")
    ap.add_argument("--engine-cache-blocks", type=int, default=None)
    ap.add_argument("--skip", type=int, default=0, help="Start at trace request K.")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument(
        "--niced-burners",
        type=int,
        default=0,
        help="Busy loops at nice 19 beside each cell (a loaded machine).",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {0})  # the client beside the gateway, as router_compare.py pins it
    cells = [(float(a), float(b), int(c)) for a, b, c in (x.split(":") for x in args.cells.split(","))]
    trace = load_trace(args.trace, max_requests=args.skip + max(c[2] for c in cells)).requests[args.skip :]
    out: list[dict[str, Any]] = []
    print("| mode | T | rate | n | ok | live / sim / engine mean TTFT ms | path mean / p50 / p95 ms "
          "| fit a ms + b ms per 1k tokens | load | CPU user / nice / idle |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for ts, rate, n in cells:
        for mode in args.modes.split(","):
            rec = run_cell(mode, ts, rate, n, args, trace)
            out.append(rec)
            p, f = rec["path_ms"], rec["path_fit_ms"]
            eng = rec["engine_ttft_mean_s"]
            cpu = rec["cpu_shares"] or {}
            print(
                f"| {mode} | {ts} | {rate:g} | {n} | {rec['ok']} | {rec['live_ttft_mean_s'] * 1e3:.1f} / "
                f"{rec['sim_ttft_mean_s'] * 1e3:.1f} / {'-' if eng is None else f'{eng * 1e3:.1f}'} "
                f"| {p['mean']:.1f} / {p['p50']:.1f} / {p['p95']:.1f} "
                f"| {f['a']:.2f} + {f['b_per_1k_tokens']:.2f} "
                f"| {rec['load_avg_1min'][0]:.2f}->{rec['load_avg_1min'][1]:.2f} "
                f"| {cpu.get('user', 0):.2f} / {cpu.get('nice', 0):.2f} / {cpu.get('idle', 0):.2f} |",
                flush=True,
            )
            if args.out:
                args.out.write_text(json.dumps({"argv": sys.argv, "cells": out}, indent=1))


if __name__ == "__main__":
    main()
