"""One GPU pool for four deployments on ServeGen (issue 18, Acceptance): fleetgate vs static vs independent.

Builds ``bench/scenarios/servegen_pool.yaml`` from the trace and runs it under the three capacity modes
(``fleetgate simulate --scenario ... --capacity MODE`` does the same runs one at a time):

1. **Split**: the 162 tenant columns of ``servegen/rates_language_m-large.csv``, sorted by total request
   volume (largest first, ties by name), dealt round-robin to the deployments ``chat-a``..``chat-d``: the
   largest tenant to chat-a, the second to chat-b, ..., the fifth to chat-a again.
2. **Own peaks**: the scenario is run once with ``independent`` on an unbounded pool (every scale-up granted):
   each deployment's ``peak_replicas`` is its own peak.
3. **Pool**: 60 % of the sum of those peaks, in GPUs (``gpus_per_replica`` 4), rounded down to whole replicas.
4. **Reservations**: the four largest tenants (one per deployment) hold reservations whose floors together
   are 30 % of the pool (rounded down to whole replicas), shared in proportion to their mean MU/min; each
   reservation is exactly what its floor backs at the autoscaler's target utilisation
   (``floor x capacity_mu_per_min x target``).

Usage:
    .venv/bin/python bench/capacity_servegen.py [--duration-s 86400] [--json OUT] [--plot OUT.png]
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import yaml

from fleetgate.core.autoscale import AutoscalePolicy
from fleetgate.profiles import load_profile
from fleetgate.sim.capacity import CapacitySimulator, build_deployments, run_scenario
from fleetgate.sim.capacity_report import busiest_day, plot_allocation
from fleetgate.sim.capacity_scenario import Scenario
from fleetgate.sim.traces import default_traces_dir, load_rate_table

TRACE = "../shared/traces/servegen/rates_language_m-large.csv"
NAMES = ("chat-a", "chat-b", "chat-c", "chat-d")
PROFILE = "llama2-70b-h100-tp4"
GPUS_PER_REPLICA = 4
HERE = Path(__file__).resolve().parent


def split(columns_by_volume: Sequence[str], n: int) -> list[list[str]]:
    """Columns dealt round-robin (largest first) to ``n`` deployments."""
    return [list(columns_by_volume[k::n]) for k in range(n)]


def base_scenario(args: argparse.Namespace) -> dict[str, Any]:
    table = load_rate_table(default_traces_dir() / "servegen" / "rates_language_m-large.csv")
    parts = split(table.tenants_by_volume(), len(NAMES))
    return {
        "pool": {"name": "h100", "gpus": 1_000_000},
        "cold_start_s": 180,
        "slo_ttft_p95_s": 1.0,
        "seed": args.seed,
        **({"duration_s": args.duration_s} if args.duration_s else {}),
        "deployments": [
            {
                "name": name,
                "trace": TRACE,
                "tenants": cols,
                "profile": PROFILE,
                "gpus_per_replica": GPUS_PER_REPLICA,
                "min_replicas": 1,
                "max_replicas": 1024,
                "reservations": {},
            }
            for name, cols in zip(NAMES, parts, strict=True)
        ],
    }


def size_pool(
    raw: dict[str, Any], peaks: dict[str, int], pool_fraction: float = 0.6, reserved_fraction: float = 0.3
) -> dict[str, Any]:
    """Pool at 60 % of the own peaks; floors of the largest tenants at 30 % of the pool."""
    table = load_rate_table(default_traces_dir() / "servegen" / "rates_language_m-large.csv")
    replicas = math.floor(pool_fraction * sum(peaks.values()))
    pool = replicas * GPUS_PER_REPLICA
    floors_total = math.floor(reserved_fraction * replicas)
    tops = [d["tenants"][0] for d in raw["deployments"]]
    mean = {t: float(table.rates[t].mean()) for t in tops}
    exact = {t: floors_total * mean[t] / sum(mean.values()) for t in tops}
    floors = {t: math.floor(v) for t, v in exact.items()}
    for t in sorted(tops, key=lambda t: -(exact[t] - floors[t]))[: floors_total - sum(floors.values())]:
        floors[t] += 1
    cap = load_profile(PROFILE).capacity_mu_per_min
    target = AutoscalePolicy().target_utilisation
    out = dict(raw, pool={"name": "h100", "gpus": pool})
    out["deployments"] = [
        dict(d, reservations={d["tenants"][0]: round(floors[d["tenants"][0]] * cap * target, 6)})
        for d in raw["deployments"]
    ]
    return out


def write_yaml(raw: dict[str, Any], path: Path, peaks: dict[str, int], pool_f: float, res_f: float) -> None:
    head = (
        "# Issue 18 acceptance scenario, written by bench/capacity_servegen.py (rerun it, do not edit).\n"
        "# Split: ServeGen m-large columns sorted by total requests (largest first), dealt round-robin to\n"
        "# chat-a..chat-d. Own peaks (independent, unbounded pool): "
        + ", ".join(f"{k} {v}" for k, v in peaks.items())
        + f" replicas.\n# Pool: {pool_f:.0%} of their sum x {GPUS_PER_REPLICA} GPUs. Reservations: the "
        f"largest tenant of each deployment;\n# floors together {res_f:.0%} of the pool, shared by mean "
        "MU/min.\n"
    )
    flow = yaml.safe_dump(raw, sort_keys=False, default_flow_style=None, width=110)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + flow, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=None, help="Replay only this long (default 14 days).")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scenario", type=Path, default=HERE / "scenarios" / "servegen_pool.yaml")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "capacity_servegen.json")
    ap.add_argument("--plot", type=Path, default=HERE / "results" / "capacity_servegen_allocation.png")
    ap.add_argument("--modes", default="fleetgate,independent,static")
    ap.add_argument("--pool-fraction", type=float, default=0.6, help="Pool / sum of the own peaks.")
    ap.add_argument("--reserved-fraction", type=float, default=0.3, help="Floors / pool.")
    ap.add_argument("--peaks-from", type=Path, default=None, help="Own peaks from an earlier --json output.")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    raw = base_scenario(args)
    if args.peaks_from is not None:
        peaks = {
            k: int(v) for k, v in orjson.loads(args.peaks_from.read_bytes())["meta"]["own_peaks"].items()
        }
    else:
        own = run_scenario(Scenario.model_validate(raw), "independent")
        peaks = {k: int(v["peak_replicas"]) for k, v in own["deployments"].items()}
    raw = size_pool(raw, peaks, args.pool_fraction, args.reserved_fraction)
    write_yaml(raw, args.scenario, peaks, args.pool_fraction, args.reserved_fraction)
    scenario = Scenario.model_validate(raw)
    deps = build_deployments(scenario, None)  # one workload draw for every mode
    summaries = {
        m: CapacitySimulator(scenario, m, deployments=[d.fresh() for d in deps]).run()
        for m in args.modes.split(",")
    }
    head = (
        "mode", "pool GPU-h used", "occupancy", "useful GPU-h", "utilisation", "pool utilisation",
        "reserved slo", "reserved shed", "best-effort served", "best-effort shed", "best-effort slo",
        "reclaims",
    )  # fmt: skip
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m, s in summaries.items():
        r, b = s["tiers"]["reserved"], s["tiers"]["best_effort"]
        cells = (
            m, f"{s['pool_gpu_hours']:,.0f}", f"{s['pool_occupancy']:.3f}", f"{s['useful_gpu_hours']:,.0f}",
            f"{s['utilisation']:.3f}", f"{s['pool_utilisation']:.4f}", f"{r['slo_attainment']:.4f}",
            f"{r['shed']:,}", f"{b['served'] / max(1, b['requests']):.4f}", f"{b['shed']:,}",
            f"{b['slo_attainment']:.4f}", str(s["reclaims"]),
        )  # fmt: skip
        rows.append("| " + " | ".join(cells) + " |")
    dep_rows = ["| mode | deployment | replica-h | peak | floor | min ready | slo | shed |", "|" + "---|" * 8]
    for m, s in summaries.items():
        for name, d in s["deployments"].items():
            cells = (
                m, name, f"{d['replica_hours']:,.0f}", str(d["peak_replicas"]), str(d["floor_replicas"]),
                str(d["min_ready_replicas"]), f"{d['slo_attainment']:.4f}", f"{d['shed']:,}",
            )  # fmt: skip
            dep_rows.append("| " + " | ".join(cells) + " |")
    day = busiest_day(summaries.get("fleetgate") or next(iter(summaries.values())))
    if args.plot:
        plot_allocation(
            summaries, args.plot, day, f"ServeGen m-large, 4 deployments, pool {scenario.pool.gpus} GPUs"
        )
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} python {platform.python_version()}",
        "own_peaks": peaks,
        "pool_fraction": args.pool_fraction,
        "reserved_fraction": args.reserved_fraction,
        "pool_gpus": scenario.pool.gpus,
        "busiest_day": day,
        "wall_s": time.perf_counter() - t0,
    }
    if args.json:
        clean = {m: {k: v for k, v in s.items() if not k.startswith("_")} for m, s in summaries.items()}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_bytes(orjson.dumps({"meta": meta, "runs": clean}, option=orjson.OPT_INDENT_2) + b"\n")
    print("\n".join(rows))
    print()
    print("\n".join(dep_rows))
    print()
    print(orjson.dumps(meta).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
