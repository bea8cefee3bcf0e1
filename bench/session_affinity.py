"""Routing policies on the seeded workloads of bench/workloads/ and the shared chat traces in the simulator
(issue 20).

    .venv/bin/python bench/session_affinity.py --workload agentic --replicas 8,16,32 --load 0.01
        --policies cache_aware,fleetgate,fleetgate@ctx --params '{"ctx": {"key": "context"}}'

``--workload``: ``agentic`` (``--load``: session starts / s / replica; ``--per-replica``: sessions),
``rag`` and ``batch`` (``--load``: requests / s / replica; ``--per-replica``: requests), ``mix`` (``--load``:
multiple of the mix's nominal rates; ``--per-replica``: seconds of trace), ``mooncake`` and ``azure`` (the
shared chat traces under ``--traces``; ``--load``: multiple of the rate at which docs/benchmarks.md replays
them, i.e. Mooncake's recorded rate on 16 replicas and Azure conv's on 8, scaled to the replica count;
``--per-replica``: requests). ``name@tag`` runs policy ``name`` with ``params[tag]``. Request counts and rates
scale with the replica count, so each fleet size sees the same load per replica.

``--speed-noise`` / ``--speed-spread`` (``sim.speed``): replicas whose speed wanders (redrawn every
``--speed-period`` s) or differs for good, so the rates learned online differ per replica as on real
machines. Prints p50/p95/p99 TTFT, hit rate and max/mean load per policy and each one's p95 relative to the
first policy; with ``--bar``, the issue's bar per fleetgate policy against the best of the others (p95 <=
0.8x the best other's, hit rate >= 0.9x the best other's, p99 <= the best other's).
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

from fleetgate.sim.engine import engine_factory
from fleetgate.sim.runner import SimOptions, _profile, run_des
from fleetgate.sim.speed import SpeedVariation
from fleetgate.sim.traces import Trace, load_trace

#: Default ``--per-replica`` of each workload.
PER_REPLICA = {
    "agentic": 20.0,
    "rag": 150.0,
    "batch": 60.0,
    "mix": 600.0,
    "mooncake": 3000 / 16,
    "azure": 4000 / 8,
}
#: The ``fleetgate`` policy's defaults before session 10 (its parts' own), for comparisons with today's
#: (``--params '{"old": ...}'`` with ``fleetgate@old``) and for the tests of a mechanism on the policy that
#: showed it (docs/benchmarks.md, "Session 10: a better default policy").
SESSION9_DEFAULTS: dict[str, Any] = {
    "key": "prefix",
    "hot_share": 0.5,
    "spill_max_wait_s": None,
    "guard_exempt_ratio": 0.3,
    "learned_rate_noise": 1.0,
    "learned_rate_scale": "seconds",
    "tail_bound_s": None,
    "tail_bound_keep_share": None,
}
#: The chat traces: file under ``--traces`` and the replica count whose load ``--load 1`` means.
CHAT = {
    "mooncake": ("mooncake/conversation_trace.jsonl", 16),
    "azure": ("azure-2023/AzureLLMInferenceTrace_conv.csv", 8),
}


def build(workload: str, n: int, load: float, per_replica: float, seed: int, traces: Path) -> Trace:
    if workload == "agentic":
        return agentic_trace(sessions=int(per_replica * n), session_rate=load * n, seed=seed)
    if workload == "rag":
        return rag_trace(requests=int(per_replica * n), rate=load * n, seed=seed)
    if workload == "batch":
        return batch_trace(requests=int(per_replica * n), rate=load * n, seed=seed)
    if workload == "mix":
        return mix_trace(replicas=n, load=load, seed=seed, duration_s=per_replica)
    if workload in CHAT:
        path, nominal = CHAT[workload]
        return load_trace(
            traces / path, seed=seed, rate_scale=load * n / nominal, max_requests=int(per_replica * n)
        )
    raise SystemExit(f"unknown workload {workload!r}")


def bar_rows(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's bar for each fleetgate policy of one cell against the best other policy's p95."""
    others = [r for r in rows if not r["label"].startswith("fleetgate")]
    if not others:
        return []
    best = min(others, key=lambda r: r["p95"])
    best_hit = max(r["hit"] for r in others)
    best_p99 = min(r["p99"] for r in others)
    out = []
    for r in rows:
        if not r["label"].startswith("fleetgate"):
            continue
        p95 = r["p95"] / best["p95"]
        hit = r["hit"] / best_hit if best_hit > 0 else 1.0
        p99 = r["p99"] / best_p99
        met = p95 <= 0.8 and hit >= 0.9 and p99 <= 1.0
        cell = f"| {r['workload']} | {r['load']:g} | {r['n']} | {r['label']} "
        out.append(
            f"{cell}| {best['label']} ({best['p95']:.3f}) "
            f"| {p95:.3f} | {hit:.3f} | {p99:.3f} | {'yes' if met else 'no'} |"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="agentic", choices=sorted(PER_REPLICA))
    ap.add_argument("--policies", default="cache_aware,fleetgate")
    ap.add_argument("--params", default="{}")
    ap.add_argument("--replicas", default="8,16")
    ap.add_argument("--per-replica", type=float, default=None, help="trace size per replica (see above)")
    ap.add_argument("--load", "--rate-per-replica", type=float, default=0.01, help="load (see above)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--traces", type=Path, default=Path("/work/shared/traces"), help="shared traces folder")
    ap.add_argument("--speed-noise", type=float, default=0.0, help="replica speed wander (log sd)")
    ap.add_argument("--speed-spread", type=float, default=0.0, help="fixed replica speed spread (log sd)")
    ap.add_argument("--speed-period", type=float, default=30.0, help="seconds between speed redraws")
    ap.add_argument("--bar", action="store_true", help="print the issue's bar per fleetgate policy")
    args = ap.parse_args()
    params: dict[str, dict[str, Any]] = json.loads(args.params)
    per = args.per_replica if args.per_replica is not None else PER_REPLICA[args.workload]
    speed = SpeedVariation(args.speed_spread, args.speed_noise, args.speed_period, args.seed)
    print("| workload | load | replicas | requests | policy | TTFT p50 | p95 | p99 | p95 / first | hit rate "
          "| max/mean load | wall s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    bars: list[str] = []
    for n in (int(x) for x in args.replicas.split(",")):
        trace = build(args.workload, n, args.load, per, args.seed, args.traces)
        block = trace.requests[0].block_tokens if trace.requests else 16
        first = None
        rows: list[dict[str, Any]] = []
        for label in args.policies.split(","):
            name, _, tag = label.partition("@")
            opts = SimOptions(trace=args.workload, policy=name, policy_params=params.get(tag or name, {}),
                              replicas=n, mode="des", seed=args.seed)  # fmt: skip
            factory = engine_factory(_profile(opts), hash_block_tokens=block, speed=speed)
            t0 = time.perf_counter()
            s = run_des(opts, trace=trace, engine_factory=factory).summary
            first = first or s["ttft_p95_s"]
            rows.append({"workload": args.workload, "load": args.load, "n": n, "label": label, "p95":
                         s["ttft_p95_s"], "p99": s["ttft_p99_s"], "hit": s["cache_hit_rate"]})  # fmt: skip
            print(
                f"| {args.workload} | {args.load:g} | {n} | {len(trace.requests)} | {label} | "
                f"{s['ttft_p50_s']:.3f} | {s['ttft_p95_s']:.3f} | {s['ttft_p99_s']:.3f} | "
                f"{s['ttft_p95_s'] / first:.3f} | {s['cache_hit_rate']:.3f} | "
                f"{s['max_over_mean_load']:.2f} | {time.perf_counter() - t0:.1f} |",
                flush=True,
            )
        bars += bar_rows(rows)
    if args.bar and bars:
        print()
        print("| workload | load | replicas | policy | best other (p95) | p95 / best | hit / best hit "
              "| p99 / best p99 | bar met |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
        print("\n".join(bars))


if __name__ == "__main__":
    main()
