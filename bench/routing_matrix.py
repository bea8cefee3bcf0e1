"""Issue 20's simulator matrix in one command: every workload and load at 8 / 16 / 32 replicas, per run.

Sessions 8-10 ran the matrix with throwaway shell loops around ``bench/session_affinity.py`` and summarised
it with throwaway scripts; this is the same loop and the same summary, in the repo, so a figure in
docs/benchmarks.md can be rerun from one line::

    FLEETGATE_TRACES_DIR=../shared/traces nice -n 19 .venv/bin/python bench/routing_matrix.py \\
        --out /tmp/matrix --runs 0:0.3,1:0.3,0:0 \\
        --policies round_robin,least_requests,p2c,cache_aware,fleetgate,fleetgate@old \\
        --params '{"old": {"key": "prefix", "hot_share": 0.5, "spill_max_wait_s": null}}'

A run is ``seed:speed_noise`` (``0:0.3`` = seed 0, wandering engine speeds; ``0:0`` = identical engines).
Each cell's table goes to ``OUT/s{seed}_n{noise}_{workload}_{load}.txt`` and is not recomputed when it is
there (delete it to rerun), so an interrupted matrix resumes. ``--summary-only`` summarises what is there;
``--merge DIR`` adds another matrix folder's cells (e.g. the baselines of an earlier run, which are
deterministic) to the summary.

The summary, per fleetgate variant and run: cells where issue 20's bar is met (p95 <= 0.8x the best other
policy's, hit rate >= 0.9x the best other's, p99 <= the best other's), cells with p99 <= the best other's,
p95 against ``--ref`` (lower / higher / same, geometric mean of p95 and p99) and the worst cells; with
several runs, a last row per variant pools every cell of every run. "Other"
means every policy whose name does not start with ``fleetgate``.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent

LOADS: dict[str, tuple[str, ...]] = {
    "agentic": ("0.01", "0.015", "0.02"),
    "rag": ("0.5", "1", "1.5"),
    "batch": ("0.3", "0.5", "0.7"),
    "mix": ("0.5", "1", "1.5"),
    "mooncake": ("1", "1.5"),
    "azure": ("1", "1.5"),
}
REPLICAS = (8, 16, 32)
#: The summary's pooled row per variant: every cell of every run.
ALL_RUNS = "all runs"


@dataclass(frozen=True)
class Row:
    """One policy's figures in one cell."""

    p50: float
    p95: float
    p99: float
    hit: float


@dataclass
class Tally:
    """One fleetgate variant's summary over one run's cells."""

    cells: int = 0
    bar: int = 0
    p99_ok: int = 0
    lower: int = 0
    higher: int = 0
    same: int = 0
    log_p95: list[float] = field(default_factory=list)
    log_p99: list[float] = field(default_factory=list)
    worst: list[tuple[float, str, float]] = field(default_factory=list)


def cell_path(out: Path, seed: int, noise: str, workload: str, load: str) -> Path:
    return out / f"s{seed}_n{noise}_{workload}_{load}.txt"


def parse_cell(text: str, workload: str) -> dict[tuple[int, str], Row]:
    """``session_affinity.py``'s first table: ``(replicas, policy) -> Row``."""
    rows: dict[tuple[int, str], Row] = {}
    for line in text.splitlines():
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) != 12 or c[0] != workload:
            continue
        try:
            rows[(int(c[2]), c[4])] = Row(float(c[5]), float(c[6]), float(c[7]), float(c[9]))
        except ValueError:
            continue
    return rows


def run_cell(args: argparse.Namespace, path: Path, seed: int, noise: str, workload: str, load: str) -> None:
    cmd = [
        sys.executable,
        str(HERE / "session_affinity.py"),
        "--workload",
        workload,
        "--load",
        load,
        "--replicas",
        ",".join(map(str, REPLICAS)),
        "--seed",
        str(seed),
        "--speed-noise",
        noise,
        "--policies",
        args.policies,
        "--bar",
    ]
    if args.params:
        cmd += ["--params", args.params]
    t0 = time.time()
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        sys.exit(f"{workload} x{load} seed {seed} noise {noise} failed:\n{res.stderr[-2000:]}")
    path.write_text(res.stdout)
    stamp = time.strftime("%H:%M:%S", time.gmtime())
    print(f"{stamp} load {os.getloadavg()[0]:.2f} {path.name} {time.time() - t0:.0f} s", flush=True)


def summarise(outs: list[Path], runs: list[tuple[int, str]], ref: str, worst: int) -> str:
    tallies: dict[tuple[str, str], Tally] = {}
    order: list[tuple[str, str]] = []
    for seed, noise in runs:
        run = f"{seed}, {'noisy' if float(noise) > 0 else 'same'}"
        cell_run = f"s{seed}" if float(noise) > 0 else f"s{seed} same"
        for workload, loads in LOADS.items():
            for load in loads:
                rows: dict[tuple[int, str], Row] = {}
                for out in outs:  # later folders add policies (or replace rows) of the same cell
                    path = cell_path(out, seed, noise, workload, load)
                    if path.exists():
                        rows.update(parse_cell(path.read_text(), workload))
                for n in REPLICAS:
                    others = {p: v for (k, p), v in rows.items() if k == n and not p.startswith("fleetgate")}
                    if not others or (n, ref) not in rows:
                        continue
                    best95 = min(v.p95 for v in others.values())
                    best99 = min(v.p99 for v in others.values())
                    best_hit = max(v.hit for v in others.values())
                    base = rows[(n, ref)]
                    for (k, p), v in rows.items():
                        if k != n or not p.startswith("fleetgate"):
                            continue
                        r95, r99 = v.p95 / base.p95, v.p99 / base.p99
                        for key in ((p, run), (p, ALL_RUNS)):
                            if key not in tallies:
                                tallies[key] = Tally()
                                order.append(key)
                            t = tallies[key]
                            t.cells += 1
                            t.bar += v.p95 <= 0.8 * best95 and v.hit >= 0.9 * best_hit and v.p99 <= best99
                            t.p99_ok += v.p99 <= best99
                            t.lower += r95 < 1 - 1e-9
                            t.higher += r95 > 1 + 1e-9
                            t.same += abs(r95 - 1) <= 1e-9
                            t.log_p95.append(math.log(r95))
                            t.log_p99.append(math.log(r99))
                            t.worst.append((r95, f"{workload} {n} x{load} {cell_run}", r99))

    def gm(v: list[float]) -> float:
        return math.exp(sum(v) / len(v)) if v else math.nan

    lines = [
        f"| variant | run | cells | bar met | p99 <= best other | p95 lower / higher / same vs {ref} "
        f"| geometric mean p95, p99 vs {ref} | worst cells p95 (p99) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    # (each variant's pooled row after every per-run row, only when there is more than one run)
    pooled = [k for k in order if k[1] == ALL_RUNS] if len(runs) > 1 else []
    for p, run in [k for k in order if k[1] != ALL_RUNS] + pooled:
        t = tallies[(p, run)]
        ws = "; ".join(f"{c} {r:.2f} ({r99:.2f})" for r, c, r99 in sorted(t.worst, reverse=True)[:worst])
        lines.append(
            f"| {p} | {run} | {t.cells} | {t.bar} | {t.p99_ok} | {t.lower} / {t.higher} / {t.same} "
            f"| {gm(t.log_p95):.3f}, {gm(t.log_p99):.3f} | {ws} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the per-cell tables")
    ap.add_argument("--runs", default="0:0.3,1:0.3,0:0", help="seed:speed_noise, comma-separated")
    ap.add_argument("--policies", default="round_robin,least_requests,p2c,cache_aware,fleetgate")
    ap.add_argument("--params", default="", help="session_affinity.py --params (JSON, per @tag)")
    ap.add_argument("--workloads", default=",".join(LOADS), help="subset of " + ",".join(LOADS))
    ap.add_argument("--ref", default="fleetgate", help="the policy every fleetgate variant is compared with")
    ap.add_argument("--worst", type=int, default=3, help="worst cells to name per row")
    ap.add_argument("--summary-only", action="store_true")
    ap.add_argument(
        "--merge",
        type=Path,
        action="append",
        default=[],
        help="another matrix folder whose cells join the summary (e.g. baselines run before); repeatable",
    )
    args = ap.parse_args()
    runs = [(int(s), n) for s, n in (r.split(":") for r in args.runs.split(","))]
    wanted = args.workloads.split(",")
    unknown = set(wanted) - set(LOADS)
    if unknown:
        ap.error(f"unknown workloads: {sorted(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.summary_only:
        for seed, noise in runs:
            for workload in wanted:
                for load in LOADS[workload]:
                    path = cell_path(args.out, seed, noise, workload, load)
                    if not path.exists():
                        run_cell(args, path, seed, noise, workload, load)
    print(summarise([*args.merge, args.out], runs, args.ref, args.worst))


if __name__ == "__main__":
    main()
