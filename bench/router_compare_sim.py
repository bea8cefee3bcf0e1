"""Offline proxy of ``bench/router_compare.py`` in the discrete-event simulator (seconds instead of minutes).

The live comparison replays 1,000 requests of the Mooncake conversation trace at 6x against 4 simulated
engines (tokens scaled by 1/32, engines at ``--time-scale 0.25``). This script builds the same workload for
``sim.des``: the same trace slice with lengths scaled by 1/32 and each ``hash_id`` one 16-token block, the
live engine profile (``router_compare.ENGINE_PROFILE``) with every duration multiplied by the time scale, the
gateway's default cost profile, and the same fleetgate parameters (``router_compare.engine_facts``). It
runs several 1,000-request slices of the trace (the live run uses the first) and reports each policy's p95
TTFT and hit rate relative to the first policy listed, so a routing change can be judged on more than the
50 requests that make up one slice's tail. Not a substitute for the live run: no HTTP, no gateway/engine CPU
contention (the live p95s are 0.05-0.1 s higher), but it ranked the policies like the live runs did.

    .venv/bin/python bench/router_compare_sim.py [--policies cache_aware,fleetgate,fleetgate@x]
        [--params '{"x": {"spill_factor": 2.0}}'] [--slices 0,1000,...] [--rate 6] [--replicas 4]

``name@tag`` runs policy ``name`` with ``params[tag]`` (on top of the engine facts for fleetgate).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from router_compare import ENGINE_PROFILE, engine_facts

from fleetgate.core.routing.registry import build_policy
from fleetgate.core.units import DEFAULT_PROFILE
from fleetgate.sim.des import SimConfig, Simulator
from fleetgate.sim.traces import Trace, TraceRequest, default_traces_dir, load_trace
from fleetgate.simengine.perfmodel import EngineModel, PerfParams


def live_engine(time_scale: float) -> PerfParams:
    """The live engines' parameters with every duration in wall-clock seconds."""
    p = PerfParams.from_mapping(ENGINE_PROFILE["perf"])
    return PerfParams.from_mapping(
        {
            **ENGINE_PROFILE["perf"],
            "prefill_s_per_token": p.prefill_s_per_token * time_scale,
            "prefill_s_per_token_sq": p.prefill_s_per_token_sq * time_scale,
            "step_overhead_s": p.step_overhead_s * time_scale,
            "decode_s_per_seq": p.decode_s_per_seq * time_scale,
            "decode_s_per_kv_token": p.decode_s_per_kv_token * time_scale,
        }
    )


def scaled_slice(reqs: list[TraceRequest], rate: float, tokens_scale: float) -> Trace:
    t0 = reqs[0].arrival_s

    def sc(x: int) -> int:
        return max(1, round(x * tokens_scale))

    return Trace(
        "mooncake-scaled",
        [
            TraceRequest(
                arrival_s=(r.arrival_s - t0) / rate,
                input_tokens=sc(r.input_tokens),
                output_tokens=sc(r.output_tokens),
                tenant=r.tenant,
                hash_ids=r.hash_ids,
                block_tokens=max(1, round(r.block_tokens * tokens_scale)),
                session=r.session,
            )
            for r in reqs
        ],
        "mooncake",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="cache_aware,fleetgate,least_requests,round_robin")
    ap.add_argument("--params", default="{}", help='JSON {"tag or policy": {params}}.')
    ap.add_argument("--rate", type=float, default=6.0)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--slices", default="0,1000,2000,3000,4000,5000")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--time-scale", type=float, default=0.25)
    ap.add_argument("--tokens-scale", type=float, default=1 / 32)
    ap.add_argument("--no-engine-facts", action="store_true")
    args = ap.parse_args()
    starts = [int(x) for x in args.slices.split(",")]
    path = default_traces_dir() / "mooncake" / "conversation_trace.jsonl"
    full = load_trace(path, max_requests=max(starts) + args.requests).requests
    perf = live_engine(args.time_scale)
    facts = {} if args.no_engine_facts else engine_facts(args.time_scale)
    params: dict[str, dict[str, Any]] = json.loads(args.params)
    names = args.policies.split(",")
    out: dict[str, list[tuple[float, float, float, float, float]]] = {}
    for st in starts:
        trace = scaled_slice(full[st : st + args.requests], args.rate, args.tokens_scale)
        for label in names:
            name, _, tag = label.partition("@")
            p = {**(facts if name == "fleetgate" else {}), **params.get(tag or name, {})}
            sim = Simulator(
                trace,
                build_policy(name, p),
                DEFAULT_PROFILE,
                lambda _n: EngineModel(perf),
                SimConfig(replicas=args.replicas, seed=1),
            )
            res = sim.run()
            tt = res.ttft_s[~np.isnan(res.ttft_s)]
            s = res.summary
            out.setdefault(label, []).append(
                (
                    float(np.percentile(tt, 95)),
                    s["cache_hit_rate"],
                    s["max_over_mean_load"],
                    float(np.percentile(tt, 50)),
                    float(np.percentile(tt, 99)),
                )
            )
    ref = out[names[0]]
    print(f"slices {starts} x {args.requests} requests, rate x{args.rate}, {args.replicas} replicas")
    print(
        "| policy | p95 / first (geo. mean) | per slice | hit / first | p95 s per slice | max/mean load "
        "| p50 / first | p99 / first |"
    )
    print("|---|---|---|---|---|---|---|---|")

    def geo(v: list[tuple[float, float, float, float, float]], i: int) -> float:
        return float(np.exp(np.mean([np.log(a[i] / b[i]) for a, b in zip(v, ref, strict=True)])))

    for label, v in out.items():
        ratio = np.array([a[0] / b[0] for a, b in zip(v, ref, strict=True)])
        hit = np.array([a[1] / b[1] if b[1] else 1.0 for a, b in zip(v, ref, strict=True)])
        print(
            f"| {label} | {np.exp(np.log(ratio).mean()):.3f} | {' '.join(f'{x:.2f}' for x in ratio)} "
            f"| {hit.mean():.3f} | {' '.join(f'{a[0]:.2f}' for a in v)} | {max(a[2] for a in v):.2f} "
            f"| {geo(v, 3):.3f} | {geo(v, 4):.3f} |"
        )


if __name__ == "__main__":
    main()
