"""Simulator speed benchmark: requests simulated per wall-clock second (one core).

Cases (issue 5's targets):
  mooncake: the Mooncake conversation trace, 12,031 requests on 16 replicas   (target < 15 s)
  large:    1,000,000 synthetic requests on 128 replicas                      (target < 10 min)
  fluid:    14 days of the ServeGen m-large rate table in fluid mode           (target < 2 min)

Usage: .venv/bin/python bench/sim_speed.py [--case mooncake,large,fluid] [--policy fleetgate]
       [--large-requests 1000000] [--profile-top 0]   (profile-top N: cProfile, print the N top functions)

On a shared machine run it under ``nice`` and read ``cpu_s_incl_loading`` (process CPU seconds: the wall time
on an otherwise idle core) next to ``load_avg_1m``; py-spy (``py-spy record -f raw -- python ...``) gives a
profile without cProfile's per-call overhead, which inflates the engine model's many small calls.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import resource
import sys
import time
from pathlib import Path

from fleetgate.sim.runner import SimOptions, run
from fleetgate.sim.traces import default_traces_dir


def _case(name: str, args: argparse.Namespace) -> SimOptions:
    traces = default_traces_dir()
    if name == "mooncake":
        return SimOptions(
            trace=str(traces / "mooncake" / "conversation_trace.jsonl"),
            policy=args.policy,
            replicas=16,
            mode="des",
        )
    if name == "large":
        # ~60 % of 128 replicas' capacity with ServeGen-like lengths and shared system prompts.
        n = args.large_requests
        return SimOptions(
            trace=f"synthetic:n={n},rate=400,cv=1.2,groups=200,blocks=2",
            policy=args.policy,
            replicas=128,
            mode="des",
        )
    if name == "fluid":
        return SimOptions(
            trace=str(traces / "servegen" / "rates_language_m-large.csv"),
            mode="fluid",
            replicas=60,
            autoscale="fleetgate",
            autoscale_params={"max_replicas": 1000},
            slo_ttft_p95_s=2.0,
            cold_start_s=180.0,
        )
    raise SystemExit(f"unknown case {name!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default="mooncake,large,fluid")
    ap.add_argument("--policy", default="fleetgate")
    ap.add_argument("--large-requests", type=int, default=1_000_000)
    ap.add_argument("--profile-top", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    results = []
    for name in args.case.split(","):
        opts = _case(name.strip(), args)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        c0 = time.process_time()
        if args.profile_top:
            prof = cProfile.Profile()
            summary, _ = prof.runcall(run, opts)
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile_top)
        else:
            summary, _ = run(opts)
        total = time.perf_counter() - t0
        cpu = time.process_time() - c0
        row = {
            "case": name,
            "mode": summary["mode"],
            "policy": summary["policy"],
            "replicas": opts.replicas,
            "requests": summary["requests"],
            "sim_wall_s": round(summary["wall_s"], 2),
            "total_wall_s_incl_loading": round(total, 2),
            "requests_per_s": round(summary["requests"] / summary["wall_s"]),
            # CPU seconds of this process = wall time on an otherwise idle core (the machine is shared).
            "cpu_s_incl_loading": round(cpu, 2),
            "requests_per_cpu_s": round(summary["requests"] / cpu),
            "ttft_mean_s": summary["ttft_mean_s"],
            "ttft_p95_s": summary["ttft_p95_s"],
            # The machine is shared: its 1-minute load average before and after says how much of a core the
            # run got (wall / cpu_s is the other way to read it).
            "load_avg_1m": [round(load0, 1), round(os.getloadavg()[0], 1)],
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        }
        results.append(row)
        print(json.dumps(row), flush=True)
    meta = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpu": platform.processor() or "?",
    }
    print(json.dumps(meta))
    if args.json:
        args.json.write_text(json.dumps({"results": results, "meta": meta}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
