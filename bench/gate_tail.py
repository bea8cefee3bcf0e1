"""Where the slowest requests of a live run's prediction waited, and what an ideal central queue would do
(issue 20, item 3: the dispatch gate's p99 at high load).

For a ``router_compare.py`` result on simulated engines (``--from-live``, as ``router_compare_sim.py``
predicts it: the live prompts, the live engine model, the gateway's replica names), each policy is run once
in the simulator and every request's TTFT is split into

- **held**: time in the dispatch gate (dispatch minus arrival);
- **engine queue**: time at its engine before its prefill finished, beyond its solo prefill;
- **solo**: its prefill alone on an idle engine with the cache it actually got (the engine model itself);

for all requests, the slowest 5% and the slowest 1%. Also per policy: **idle while held**, the
replica-seconds a replica had no prefill running (between one request's first token and the next one's
admission) while the gate held a request; and an **oracle**: one central queue in front of the replicas with
every solo prefill known exactly, first come first served or shortest first with the gate's aging (the
gate's own order, with exact knowledge and no idle time), which bounds what any release order can do with
this work. The oracles use only the simulator's numbers: diagnostics, never router inputs.

    PYTHONPATH=src .venv/bin/python bench/gate_tail.py --from-live \\
        bench/results/router_compare_s10_simlive/u9.json \\
        --params '{"fleetgate": {}, "fleetgate@a1": {"gate_aging": 1}, "cache_aware": {}}'
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from router_compare import engine_facts, engine_profile
from router_compare_sim import live_engine, live_prompt_slice
from tail_diagnosis import priority_oracle

from fleetgate.core.routing.registry import build_policy
from fleetgate.core.units import DEFAULT_PROFILE
from fleetgate.sim.des import SimConfig, Simulator, default_ids
from fleetgate.sim.traces import Trace, load_trace
from fleetgate.simengine.perfmodel import EngineModel, EngineRequest, PerfParams, StepResult


class RecordingEngine:
    """An engine model that also keeps every request's admission and first-token times (the simulator
    drives it as the engine itself: everything else is the wrapped model's)."""

    def __init__(self, perf: PerfParams) -> None:
        self.engine = EngineModel(perf)
        self.admitted: dict[str, float] = {}
        self.first: dict[str, float] = {}

    def advance(self, until: float) -> StepResult:
        res = self.engine.advance(until)
        self.admitted.update(res.admitted)
        self.first.update(res.first_token)
        return res

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def solo_s(perf: PerfParams, trace: Trace, cached: np.ndarray) -> np.ndarray:
    """Each request's TTFT alone on an idle engine that holds the prefix it really found cached."""
    memo: dict[tuple[int, int], float] = {}
    out = np.zeros(len(trace.requests))
    for i, r in enumerate(trace.requests):
        key = (r.input_tokens, int(cached[i]))
        if key not in memo:
            eng = EngineModel(perf, track_emitted=False)
            t, m = 0.0, int(cached[i]) // r.block_tokens
            if m:
                warm = EngineRequest("warm", m * r.block_tokens, 1, tuple(r.hash_ids[:m]), 0, r.block_tokens)
                eng.submit(warm, 0.0)
                t = eng.run_until_idle().end + 1.0
            eng.advance(t)
            eng.submit(EngineRequest("x", r.input_tokens, 1, tuple(r.hash_ids), 0, r.block_tokens), t)
            memo[key] = eng.run_until_idle().first_token["x"] - t
        out[i] = memo[key]
    return out


def q(x: np.ndarray) -> str:
    return " / ".join(f"{np.percentile(x, p):.3f}" for p in (50, 95, 99))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from-live", type=Path, required=True, help="a router_compare.py result (sim engines)")
    ap.add_argument(
        "--params", default='{"fleetgate": {}, "cache_aware": {}}',
        help='JSON {"policy[@tag]": {params}}: the policies to run, in order (fleetgate gets the live '
        "run's engine facts under its params)",
    )  # fmt: skip
    ap.add_argument("--aging", default="0.25,1,2", help="aging values of the shortest-first oracle")
    args = ap.parse_args()
    meta = json.loads(args.from_live.read_text())["meta"]
    if meta.get("engine", "sim") != "sim" or meta.get("speed_noise") or meta.get("workload"):
        sys.exit("needs a trace replay on uniform simulated engines")
    reqs = load_trace(meta["trace"], max_requests=meta["requests"]).requests
    trace = live_prompt_slice(reqs, meta["rate_scale"], meta["tokens_scale"])
    cache_blocks = (meta.get("engine_profile") or {}).get("prefix_cache_blocks")
    perf = live_engine(meta["engine_time_scale"], cache_blocks)
    facts = {
        **engine_facts(meta["engine_time_scale"], engine_profile(cache_blocks)),
        **(meta.get("policy_params") or {}).get("fleetgate", {}),
    }
    n = meta["replicas"]
    arrival = np.array([r.arrival_s for r in trace.requests])
    inputs = np.array([r.input_tokens for r in trace.requests])
    print(f"{args.from_live}: {len(arrival)} requests at x{meta['rate_scale']:g}, {n} replicas\n")
    print(
        "| policy | TTFT p50 / p95 / p99 s | hit | held: all / p95+ / p99+ mean s | engine queue: all / p95+ "
        "/ p99+ | solo: all / p95+ / p99+ | prompt tokens p99+ (all) | idle while held, replica-s "
        "(held s) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    solo_of_first: np.ndarray | None = None
    for label, extra in json.loads(args.params).items():
        name = label.partition("@")[0]
        policy = build_policy(name, {**(facts if name == "fleetgate" else {}), **extra})
        engines: dict[str, RecordingEngine] = {}

        def make(replica: str, engines: dict[str, RecordingEngine] = engines) -> Any:
            engines[replica] = RecordingEngine(perf)
            return engines[replica]

        config = SimConfig(replicas=n, seed=1, replica_ids=default_ids("r"))
        sim = Simulator(trace, policy, DEFAULT_PROFILE, make, config)
        res = sim.run()
        cached = np.asarray(sim._cached)  # (the run's per-request cache hits: read for the diagnosis only)
        ttft = res.ttft_s
        held = res.dispatch_s - res.arrival_s
        solo = solo_s(perf, trace, cached)
        if solo_of_first is None:
            solo_of_first = solo
        queued = ttft - held - solo
        t95, t99 = ttft >= np.percentile(ttft, 95), ttft >= np.percentile(ttft, 99)
        holding = union([(a, d) for a, d in zip(arrival, res.dispatch_s, strict=True) if d > a + 1e-9])
        idle = 0.0
        for eng in engines.values():
            busy = union([(eng.admitted[r], eng.first[r]) for r in eng.admitted if r in eng.first])
            gaps = [(b0, a1) for (_, b0), (a1, _) in itertools.pairwise(busy)]
            idle += overlap(gaps + ([(busy[-1][1], np.inf)] if busy else []), holding)
        parts = [
            " / ".join(f"{x[m].mean():.3f}" for m in (slice(None), t95, t99)) for x in (held, queued, solo)
        ]
        hit = cached.sum() / inputs.sum()
        print(
            f"| {label} | {q(ttft)} | {hit:.3f} | {' | '.join(parts)} | {inputs[t99].mean():.0f} "
            f"({inputs.mean():.0f}) | {idle:.2f} ({sum(b - a for a, b in holding):.1f}) |",
            flush=True,
        )
    assert solo_of_first is not None
    print(f"\nOracles (one central queue, {n} servers, the first policy's solo prefills known exactly):\n")
    print("| oracle | TTFT p50 / p95 / p99 s |")
    print("|---|---|")
    print(f"| first come, first served | {q(priority_oracle(arrival, solo_of_first, n, 0.0))} |")
    for a in (float(x) for x in args.aging.split(",") if x):
        # the gate's key prefill + aging x arrival is priority_oracle's arrival + c x prefill, c = 1 / aging
        got = priority_oracle(arrival, solo_of_first, n, 1.0 / a if a > 0 else 1e9)
        print(f"| shortest first, aging {a:g} | {q(got)} |")


if __name__ == "__main__":
    main()
