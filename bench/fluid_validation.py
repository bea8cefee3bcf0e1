"""Fluid mode vs discrete-event mode on the same ServeGen slices (docs/simulator.md, "Fluid mode").

Usage: .venv/bin/python bench/fluid_validation.py [--quick]
Prints one Markdown table: replica-hours, TTFT p95 and slo_attainment in both modes and their differences.
"""

from __future__ import annotations

import argparse
from typing import Any

from fleetgate.sim.runner import SimOptions, run
from fleetgate.sim.traces import default_traces_dir

CASES: list[dict[str, Any]] = [
    {"tenant": "client_148", "duration_s": 1800.0, "replicas": 5},
    {"tenant": "client_91", "duration_s": 3600.0, "replicas": 2},
    {"tenant": "client_143", "duration_s": 3600.0, "replicas": 4},
    {"tenant": "client_143", "duration_s": 7200.0, "replicas": 8, "autoscale": "fleetgate"},
    {"tenant": "client_91", "duration_s": 7200.0, "replicas": 2, "autoscale": "fleetgate"},
    {"tenant": "client_143", "duration_s": 3600.0, "replicas": 3},
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only the first three cases")
    ap.add_argument("--slo", type=float, default=2.0)
    args = ap.parse_args()
    path = str(default_traces_dir() / "servegen" / "rates_language_m-large.csv")
    print(
        "| tenant | horizon | replicas | autoscale | requests | rh des | rh fluid | diff "
        "| p95 des | p95 fluid | diff | slo des | slo fluid |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for case in CASES[:3] if args.quick else CASES:
        out = {}
        for mode in ("des", "fluid"):
            opts = SimOptions(
                trace=path,
                mode=mode,
                policy="least_requests",
                seed=1,
                slo_ttft_p95_s=args.slo,
                cold_start_s=180.0,
                **case,
            )
            out[mode], _ = run(opts)
        d, f = out["des"], out["fluid"]
        print(
            f"| {case['tenant']} | {case['duration_s'] / 3600:g} h | {case['replicas']} | "
            f"{case.get('autoscale', 'static')} | {d['requests']} | {d['replica_hours']:.2f} | "
            f"{f['replica_hours']:.2f} | {f['replica_hours'] / d['replica_hours'] - 1:+.1%} | "
            f"{d['ttft_p95_s']:.3g} | {f['ttft_p95_s']:.3g} | {f['ttft_p95_s'] / d['ttft_p95_s'] - 1:+.0%} | "
            f"{d['slo_attainment']:.3f} | {f['slo_attainment']:.3f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
