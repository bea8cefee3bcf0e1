"""Routing policies on the seeded workloads of bench/workloads/ in the simulator (issue 20).

    .venv/bin/python bench/session_affinity.py --workload agentic --replicas 8,16,32 --load 0.01
        --policies cache_aware,fleetgate,fleetgate@ctx --params '{"ctx": {"key": "context"}}'

``--workload``: ``agentic`` (``--load``: session starts / s / replica; ``--per-replica``: sessions),
``rag`` and ``batch`` (``--load``: requests / s / replica; ``--per-replica``: requests), ``mix`` (``--load``:
multiple of the mix's nominal rates; ``--per-replica``: seconds of trace). ``name@tag`` runs policy
``name`` with ``params[tag]``. Request counts and rates scale with the replica count, so each fleet size
sees the same load per replica. Prints p50/p95/p99 TTFT, hit rate and max/mean load per policy, and each
one's p95 relative to the first policy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads.agentic import agentic_trace
from workloads.batch import batch_trace
from workloads.mix import mix_trace
from workloads.rag import rag_trace

from fleetgate.sim.runner import SimOptions, run_des
from fleetgate.sim.traces import Trace

#: Default ``--per-replica`` of each workload.
PER_REPLICA = {"agentic": 20.0, "rag": 150.0, "batch": 60.0, "mix": 600.0}


def build(workload: str, n: int, load: float, per_replica: float, seed: int) -> Trace:
    if workload == "agentic":
        return agentic_trace(sessions=int(per_replica * n), session_rate=load * n, seed=seed)
    if workload == "rag":
        return rag_trace(requests=int(per_replica * n), rate=load * n, seed=seed)
    if workload == "batch":
        return batch_trace(requests=int(per_replica * n), rate=load * n, seed=seed)
    if workload == "mix":
        return mix_trace(replicas=n, load=load, seed=seed, duration_s=per_replica)
    raise SystemExit(f"unknown workload {workload!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="agentic", choices=sorted(PER_REPLICA))
    ap.add_argument("--policies", default="cache_aware,fleetgate")
    ap.add_argument("--params", default="{}")
    ap.add_argument("--replicas", default="8,16")
    ap.add_argument("--per-replica", type=float, default=None, help="trace size per replica (see above)")
    ap.add_argument("--load", "--rate-per-replica", type=float, default=0.01, help="load (see above)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    params: dict[str, dict[str, Any]] = json.loads(args.params)
    per = args.per_replica if args.per_replica is not None else PER_REPLICA[args.workload]
    print("| workload | load | replicas | requests | policy | TTFT p50 | p95 | p99 | p95 / first | hit rate "
          "| max/mean load | wall s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.replicas.split(",")):
        trace = build(args.workload, n, args.load, per, args.seed)
        first = None
        for label in args.policies.split(","):
            name, _, tag = label.partition("@")
            opts = SimOptions(trace=args.workload, policy=name, policy_params=params.get(tag or name, {}),
                              replicas=n, mode="des", seed=args.seed)  # fmt: skip
            t0 = time.perf_counter()
            s = run_des(opts, trace=trace).summary
            first = first or s["ttft_p95_s"]
            print(
                f"| {args.workload} | {args.load:g} | {n} | {len(trace.requests)} | {label} | "
                f"{s['ttft_p50_s']:.3f} | {s['ttft_p95_s']:.3f} | {s['ttft_p99_s']:.3f} | "
                f"{s['ttft_p95_s'] / first:.3f} | {s['cache_hit_rate']:.3f} | "
                f"{s['max_over_mean_load']:.2f} | {time.perf_counter() - t0:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
