"""Routing policies on the agentic-sessions workload (bench/workloads/agentic.py) in the simulator.

    .venv/bin/python bench/session_affinity.py --replicas 8,16 --policies cache_aware,fleetgate,fleetgate@ctx
        --params '{"ctx": {"key": "context"}}' [--sessions-per-replica 20] [--rate-per-replica 0.01]

``name@tag`` runs policy ``name`` with ``params[tag]``. Sessions and their start rate scale with the replica
count, so each fleet size sees the same load per replica. Prints p50/p95/p99 TTFT, hit rate and max/mean
load per policy, and each one's p95 relative to the first policy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads.agentic import agentic_trace

from fleetgate.sim.runner import SimOptions, run_des


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="cache_aware,fleetgate")
    ap.add_argument("--params", default="{}")
    ap.add_argument("--replicas", default="8,16")
    ap.add_argument("--sessions-per-replica", type=int, default=20)
    ap.add_argument(
        "--rate-per-replica", type=float, default=0.1, help="session starts per second per replica"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    params: dict[str, dict[str, Any]] = json.loads(args.params)
    print("| replicas | policy | TTFT p50 | p95 | p99 | p95 / first | hit rate | max/mean load |")
    print("|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.replicas.split(",")):
        trace = agentic_trace(
            sessions=args.sessions_per_replica * n, session_rate=args.rate_per_replica * n, seed=args.seed
        )
        first = None
        for label in args.policies.split(","):
            name, _, tag = label.partition("@")
            opts = SimOptions(trace="agentic", policy=name, policy_params=params.get(tag or name, {}),
                              replicas=n, mode="des", seed=args.seed)  # fmt: skip
            s = run_des(opts, trace=trace).summary
            first = first or s["ttft_p95_s"]
            print(
                f"| {n} | {label} | {s['ttft_p50_s']:.3f} | {s['ttft_p95_s']:.3f} | {s['ttft_p99_s']:.3f} | "
                f"{s['ttft_p95_s'] / first:.3f} | {s['cache_hit_rate']:.3f} | "
                f"{s['max_over_mean_load']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
