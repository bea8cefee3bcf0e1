"""Same decisions before and after a refactor on issue 20's matrix cells: simulator summaries of two trees.

``bench/sim_equality.py`` compares ``fleetgate simulate`` on the trace files; this compares the matrix's own
cells (``bench/session_affinity.py``'s synthetic workloads and chat traces, wandering or identical engine
speeds) for fleetgate's default and session 9's defaults, every summary field but wall time::

    FLEETGATE_TRACES_DIR=/work/shared/traces nice -n 19 .venv/bin/python bench/matrix_equality.py \\
        --old-src /tmp/old/src [--runs 0:0.3,1:0.3,0:0] [--cells agentic:0.015,rag:1] [--replicas 8,32]

Each tree runs in its own process (``PYTHONPATH``), both at once. Exit status 1 when any summary differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CELLS = "agentic:0.015,rag:1,mooncake:1.5,batch:0.5,mix:1,azure:1.5"


def summaries(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """This process's tree: ``cell -> summary`` for every run, cell, fleet size and parameter set."""
    sys.path.insert(0, str(HERE))
    from session_affinity import PER_REPLICA, SESSION9_DEFAULTS, build

    from fleetgate.sim.engine import engine_factory
    from fleetgate.sim.runner import SimOptions, _profile, run_des
    from fleetgate.sim.speed import SpeedVariation

    print(f"tree: {Path(engine_factory.__code__.co_filename).parents[2]}", file=sys.stderr)
    out: dict[str, dict[str, Any]] = {}
    for run in args.runs.split(","):
        seed_s, noise_s = run.split(":")
        seed, noise = int(seed_s), float(noise_s)
        speed = SpeedVariation(0.0, noise, 30.0, seed)
        for cell in args.cells.split(","):
            workload, load = cell.split(":")
            for n in (int(x) for x in args.replicas.split(",")):
                trace = build(workload, n, float(load), PER_REPLICA[workload], seed, args.traces)
                block = trace.requests[0].block_tokens if trace.requests else 16
                for tag, params in (("default", {}), ("session9", SESSION9_DEFAULTS)):
                    opts = SimOptions(
                        trace=workload,
                        policy="fleetgate",
                        policy_params=dict(params),
                        replicas=n,
                        mode="des",
                        seed=seed,
                    )
                    factory = engine_factory(_profile(opts), hash_block_tokens=block, speed=speed)
                    s = run_des(opts, trace=trace, engine_factory=factory).summary
                    out[f"s{seed}_n{noise_s}_{workload}_{load}_{n}_{tag}"] = {
                        k: v for k, v in s.items() if "wall" not in k
                    }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old-src", help="the other tree's src (omit with --json: this tree only)")
    ap.add_argument("--runs", default="0:0.3,1:0.3,0:0", help="seed:speed_noise, comma-separated")
    ap.add_argument("--cells", default=CELLS, help="workload:load, comma-separated")
    ap.add_argument("--replicas", default="8,32")
    ap.add_argument(
        "--traces", type=Path, default=Path(os.environ.get("FLEETGATE_TRACES_DIR", "/work/shared/traces"))
    )
    ap.add_argument("--json", type=Path, help="write this tree's summaries here and exit")
    args = ap.parse_args()
    if args.json is not None:
        args.json.write_text(json.dumps(summaries(args), indent=1, sort_keys=True, default=str))
        return 0
    if not args.old_src:
        ap.error("--old-src or --json")
    passed = [
        "--runs",
        args.runs,
        "--cells",
        args.cells,
        "--replicas",
        args.replicas,
        "--traces",
        str(args.traces),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for label, src in (("old", args.old_src), ("new", str(HERE.parent / "src"))):
            path = Path(tmp) / f"{label}.json"
            env = {**os.environ, "PYTHONPATH": src}
            cmd = [sys.executable, __file__, *passed, "--json", str(path)]
            procs.append((path, subprocess.Popen(cmd, env=env)))
        for _, p in procs:
            if p.wait() != 0:
                return 2
        old, new = (json.loads(path.read_text()) for path, _ in procs)
    bad = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    for k in bad:
        print(f"{k}: differs")
    print(f"{len(old) - len(bad)}/{len(old)} summaries identical")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
