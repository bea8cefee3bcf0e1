"""Noisy neighbour on real llama.cpp replicas: a reserved tenant next to a best-effort flood at 10x capacity.

The live benchmark's phases and checks (``bench/noisy_neighbour.py``, driven through its ``_drive``) with two
``llama-server`` replicas (tiny model, 4 slots, 1 thread) instead of simulated engines. The cost profile is
measured on the engines first (replica seconds per prompt token and per output token with every slot busy), so
the gateway's idea of capacity is the replicas' real one on this machine as loaded.
``deployments[].tokenizer`` is the model's tokenizer, so estimates are the engine's counts.

llama.cpp takes no request priority: a gold request that arrives while free's requests hold every slot waits
for one, so gold's TTFT next to the flood is bounded by admission (free is held to the best-effort share of
capacity), not by the engine. The exact checks (nothing lost, gold admitted, free shed) are the benchmark's;
the TTFT ratio is printed and only checked against a bound that catches a flood reaching the engines
unchecked. Figures in docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from bench_module import load_bench
from fleetgate.core.tokenize import render_chat_prompt
from fleetgate.engines.llama import (
    EngineProcess,
    default_hf_model,
    start_llama_replicas,
)
from fleetgate.hf_tokenizer import load_tokenizer
from real_engines import need_llama

SLOTS = 4


def _measure(url: str, model: str) -> tuple[float, float]:
    """Replica seconds per prompt token and per output token at saturation (every slot busy, twice over):
    the wall time of a batch of requests over the tokens it processed, on this machine as it is now."""
    import concurrent.futures

    words = " ".join(["alpha", "bravo", "delta", "echo"] * 150)

    def run(max_tokens: int, text: str) -> tuple[float, int, int]:
        def one(i: int) -> tuple[int, int]:
            b = {
                "model": model,
                "messages": [{"role": "user", "content": f"m{i} {text}"}],
                "max_tokens": max_tokens,
            }
            usage = httpx.post(url + "/v1/chat/completions", json=b, timeout=60).json()["usage"]
            return int(usage["prompt_tokens"]), int(usage["completion_tokens"])

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(SLOTS) as pool:
            usages = list(pool.map(one, range(2 * SLOTS)))
        return time.perf_counter() - t0, sum(u[0] for u in usages), sum(u[1] for u in usages)

    wall, prompt, _ = run(1, words)
    prefill = wall / prompt
    wall, prompt, out = run(48, "d")
    return prefill, max(wall - prefill * prompt, 0.0) / out


@pytest.mark.timeout(360)
def test_reserved_tenant_next_to_a_flood_on_llama_replicas(tmp_path: Path) -> None:
    need_llama()
    nn = load_bench("noisy_neighbour.py", "noisy_neighbour_bench_llama")
    procs: list[EngineProcess] = []
    try:
        procs = start_llama_replicas(
            2, alias=nn.MODEL, parallel=SLOTS, ctx_size=8192, threads=1, ignore_eos=True, timeout=60
        )
        prefill_s, step_s = _measure(procs[0].url, nn.MODEL)
        # The benchmark paces gold by the approximate token count of its prompt; the gateway charges the
        # real one (the tiny model's BPE splits the benchmark's words finer): send 70% of the reservation
        # in real MU.
        gold = render_chat_prompt(nn.gold_messages(0, 300))
        finer = len(load_tokenizer(default_hf_model()).encode(gold)) / nn.prompt_tokens(
            nn.gold_messages(0, 300)
        )
        params = nn.BenchParams(
            phase_s=8.0,
            warmup_s=2.0,
            gold_share=0.7 / finer,
            gold_prompt_tokens=300,
            gold_max_tokens=4,
            free_max_tokens=48,  # short free requests: a gold request waits at most one of them per slot
            max_num_seqs=SLOTS,
            step_overhead_s=step_s * SLOTS,  # a full step / max_num_seqs = the measured per-token share
            decode_s_per_seq=0.0,
            prefill_s_per_token=prefill_s,
            drain_timeout_s=60.0,
            engine_priority=False,  # llama.cpp takes none
        )
        cost_path = tmp_path / "cost-profile.json"
        cost_path.write_text(json.dumps(nn.cost_profile(params).to_dict()))
        fleet = params.capacity_mu_per_min * params.engines
        cfg = {
            "gateway": {"host": "127.0.0.1", "port": 0, "first_byte_timeout_s": 120, "health_checks": False},
            "ops": {"log_level": "WARNING"},
            "deployments": [
                {
                    "model": nn.MODEL,
                    "engine": "llamacpp",
                    "tokenizer": str(default_hf_model()),
                    "capacity_mu_per_min": params.capacity_mu_per_min,
                    "cost_profile": str(cost_path),
                    "routing": {"policy": "least_requests"},
                    "replicas": [{"name": f"r{i}", "url": p.url} for i, p in enumerate(procs)],
                }
            ],
            "tenants": [
                {
                    "name": "gold",
                    "api_keys": [nn.GOLD_KEY],
                    "priority": "interactive",
                    "reserved_mu_per_min": {nn.MODEL: fleet * params.reserved_share},
                    "best_effort_mu_per_min": 0,
                },
                {
                    "name": "free",
                    "api_keys": [nn.FREE_KEY],
                    "priority": "best_effort",
                    "best_effort_mu_per_min": None,
                },
            ],
            "admission": {"queue_max": 1000, "deadline_s": 10, "admin_api_keys": [nn.ADMIN_KEY]},
        }
        cfg_path = tmp_path / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        gw = nn.Proc([sys.executable, "-m", "fleetgate.cli", "serve", "--config", str(cfg_path)], "gateway")
        try:
            url = gw.wait_ready()
            t0 = time.monotonic()
            res = asyncio.run(
                nn._drive(
                    params,
                    url,
                    [p.url for p in procs],
                    {"gateway": gw.proc.pid, "engines": [p.pid for p in procs]},
                )
            )
            wall = time.monotonic() - t0
        finally:
            gw.kill()
    finally:
        for proc in procs:
            proc.stop()
    a, b = res["phases"]["A"], res["phases"]["B"]
    summary = nn.report(res)
    print(
        f"\nmeasured at saturation: prefill {prefill_s * 1e6:.0f} us/token, decode "
        f"{step_s * 1000:.2f} ms/token; {wall:.0f} s"
    )
    print(summary)
    assert res["nothing_lost"], summary
    assert a["gold_admitted_share"] >= 0.99, summary
    assert b["gold_admitted_share"] >= 0.99, summary
    statuses = b["free_statuses"]
    assert statuses.get("200", 0) > 0 and statuses.get("503", 0) > 0, summary
    assert set(statuses) <= {"200", "503"}, summary
    # free stays within the fleet meter (the simulated-engine test's bound: 80% of capacity minus gold's use,
    # over the phase plus the longest queue wait and the meter's burst, x1.5 for a loaded machine)
    fleet_per_s = res["fleet_capacity_mu_per_min"] / 60.0
    gold_mu = res["gold_rate_per_s"] * res["gold_cost_mu"] * params.phase_s
    free_bound = fleet_per_s * 0.8 * (params.phase_s + 12.0) - gold_mu
    assert statuses["200"] * res["free_cost_mu"] <= 1.5 * free_bound, summary
    assert res["ttft_p50_ratio"] <= 4.0, summary  # loose: llama.cpp has no priority (module docstring)
