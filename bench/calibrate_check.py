#!/usr/bin/env python3
"""Does MU predict capacity for any workload shape? Saturated req/min predicted by a profile vs measured.

For three mixes whose shapes are NOT in the calibration design (prefill-heavy, decode-heavy, mixed), a closed
loop climbs a concurrency ladder against the engine until completed requests per minute stop growing; the
profile predicts ``capacity_mu_per_min / mean MU per request`` (MU from the engine-reported token counts of
the very requests that ran). Target: within 10%.

    # against a running engine, calibrating first (writes the profile next to the report):
    .venv/bin/python bench/calibrate_check.py --engine http://127.0.0.1:8001 --model NAME
    # with an existing profile:
    .venv/bin/python bench/calibrate_check.py --engine URL --model NAME --profile profile.json
    # start a simulated engine for the run (time-scaled):
    .venv/bin/python bench/calibrate_check.py --spawn-sim --time-scale 10

Exit status 1 if any mix misses the 10% target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from fleetgate.core.calibrate import (
    Measurement,
    default_design,
    fit_cost_profile,
    mixed_design,
    sweep_design,
)
from fleetgate.core.units import CostProfile
from fleetgate.engines.calibration import calibrate_engine
from fleetgate.engines.calibration_plot import plot_calibration
from fleetgate.engines.calibration_probe import EngineProbe, Shape, process_tree_cpu_seconds
from fleetgate.profiles import load_profile

#: (input tokens, output tokens) shapes of each mix; none of them is a calibration design point.
MIXES: dict[str, list[tuple[int, int]]] = {
    "prefill-heavy": [(1500, 8), (700, 12), (1800, 6), (1100, 10)],
    "decode-heavy": [(48, 160), (100, 200), (24, 120), (70, 180)],
    "mixed": [(400, 60), (900, 24), (64, 140), (1200, 100), (200, 40)],
}
TARGET = 0.10


@contextmanager
def spawn_sim(time_scale: float, extra: list[str]) -> Iterator[str]:
    """Start ``fleetgate engine sim`` on a free port; yield its base URL; stop it afterwards."""
    cmd = [
        sys.executable,
        "-m",
        "fleetgate.cli",
        "engine",
        "sim",
        "--port",
        "0",
        "--time-scale",
        str(time_scale),
        *extra,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        deadline = time.monotonic() + 30
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            m = re.search(r"engine ready on (http://127\.0\.0\.1:\d+)", line)
            if m:
                url = m.group(1)
                break
        if url is None:
            raise RuntimeError(f"simulated engine did not start: {' '.join(cmd)}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def measure_mix(
    probe: EngineProbe,
    shapes: list[tuple[int, int]],
    words: dict[int, int],
    ladder: list[int],
    requests_per_worker: int,
    profile: CostProfile,
    min_requests: int = 8,
    min_busy_s: float = 0.0,
) -> dict[str, Any]:
    cycle = [Shape(words[i], o) for i, o in shapes]

    def pick(i: int) -> Shape:
        return cycle[i % len(cycle)]

    pick_fn: Callable[[int], Shape] = pick
    # whole cycles, and enough of them that the middle half of the run is steady state
    per_worker = -(-requests_per_worker // len(cycle)) * len(cycle)
    least = -(-max(8 * len(cycle), min_requests) // len(cycle)) * len(cycle)
    sat = await probe.saturate(
        pick_fn,
        ladder,
        requests_per_worker=per_worker,
        min_requests=least,
        min_busy_s=min_busy_s,
        cycle=len(cycle),
    )
    best = sat.best
    costs = [profile.cost(p, c) for p, c in best.usages]
    mean_cost = sum(costs) / len(costs)
    predicted = profile.capacity_mu_per_min / mean_cost
    measured = best.throughput_rps * 60.0
    return {
        "shapes": shapes,
        "predicted_req_per_min": predicted,
        "measured_req_per_min": measured,
        "error": predicted / measured - 1.0,
        "mean_mu_per_request": mean_cost,
        "saturated_at_concurrency": best.concurrency,
        "levels": [lv.as_dict() for lv in sat.levels],
        "usages": [list(u) for u in best.usages],
    }


def rescore(report_path: Path, seed: int) -> dict[str, Any]:
    """Refit the profile from a finished run's stored measurements with the current fitting code and
    predict its measured mixes again (the measurements do not depend on the profile). Requests' token
    counts come from the report's ``usages``; older reports lack them, so their nominal mix shapes are
    used, shifted by the measured mean prompt-token overhead of the chat template."""
    report = json.loads(report_path.read_text())
    prof_data = json.loads(Path(report["profile_source"]).read_text())
    ms = [
        Measurement(
            m["input_tokens"],
            m["output_tokens"],
            m["replica_seconds"],
            mix=tuple((int(a), int(b)) for a, b in m.get("mix", [])),
        )
        for m in prof_data["measurements"]
    ]
    cal = fit_cost_profile(ms, random.Random(seed), name=prof_data.get("name", "calibrated"))
    out: dict[str, Any] = {
        "source": str(report_path),
        "calibration": {
            "r2_holdout": cal.r2_holdout,
            "mape_holdout": cal.mape_holdout,
            "mape_all": cal.mape_all,
            "terms": list(cal.terms),
            "holdout": cal.holdout,
        },
        "profile": {k: v for k, v in cal.profile.to_dict().items() if k not in ("perf", "fit")},
        "mixes": {},
    }
    for name, res in report["mixes"].items():
        if res.get("usages"):
            usages = [(int(a), int(b)) for a, b in res["usages"]]
        else:
            shapes = [(int(a), int(b)) for a, b in res["shapes"]]
            best = max(res["levels"], key=lambda lv: lv["throughput_rps"])
            shift = round(best["mean_prompt_tokens"] - sum(i for i, _ in shapes) / len(shapes))
            usages = [(i + shift, o) for i, o in shapes]
        mean_cost = sum(cal.profile.cost(p, c) for p, c in usages) / len(usages)
        predicted = cal.profile.capacity_mu_per_min / mean_cost
        measured = float(res["measured_req_per_min"])
        out["mixes"][name] = {
            "predicted_req_per_min": predicted,
            "measured_req_per_min": measured,
            "error": predicted / measured - 1.0,
        }
    out["max_abs_error"] = max(abs(r["error"]) for r in out["mixes"].values())
    out["pass"] = out["max_abs_error"] <= TARGET
    return out


def _busy_clock(args: argparse.Namespace) -> Callable[[], float] | None:
    if args.engine_pid is None:
        return None
    pid = int(args.engine_pid)

    def clock() -> float:
        return process_tree_cpu_seconds(pid)

    return clock


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def scaled_mixes(scale: float) -> dict[str, list[tuple[int, int]]]:
    """The mixes with every length scaled (for slow engines); at least 1 token each."""
    return {
        name: [(max(round(i * scale), 1), max(round(o * scale), 1)) for i, o in shapes]
        for name, shapes in MIXES.items()
    }


async def check(args: argparse.Namespace, engine: str) -> dict[str, Any]:
    report: dict[str, Any] = {
        "engine": engine,
        "model": args.model,
        "machine": f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(sys.argv),
        "replica_clock": "wall" if args.engine_pid is None else "engine process CPU time",
    }
    if args.profile:
        profile = load_profile(args.profile)
        report["profile_source"] = args.profile
    else:
        ladder_c = tuple(int(c) for c in args.ladder.split(","))
        if args.inputs or args.outputs:
            base = default_design(args.quick)
            ins = _ints(args.inputs) if args.inputs else sorted({p.input_tokens for p in base})
            outs = _ints(args.outputs) if args.outputs else sorted({p.output_tokens for p in base})
            design = sweep_design(ins, outs, ladder_c)
        else:
            design = [replace(p, concurrencies=ladder_c) for p in default_design(args.quick)]
        if args.mixed_runs:
            design += mixed_design(
                sorted({p.input_tokens for p in design}),
                sorted({p.output_tokens for p in design}),
                ladder_c,
                args.mixed_runs,
                random.Random(args.seed + 1),
            )
        run = await calibrate_engine(
            engine,
            args.model,
            design=design,
            quick=args.quick,
            seed=args.seed,
            progress=not args.quiet,
            requests_per_worker=args.requests_per_worker,
            busy_clock=_busy_clock(args),
            min_requests=args.min_requests,
            min_busy_s=args.min_busy_s,
            jitter=args.jitter,
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        prof_path = args.out.with_name(args.out.stem + "-profile.json")
        prof_path.write_text(json.dumps(run.to_json(engine, args.model, args.quick), indent=2) + "\n")
        plot_calibration(
            run, args.out.with_name(args.out.stem + "-fit.png"), title=f"{args.model} @ {engine}"
        )
        profile = run.calibration.profile
        report["profile_source"] = str(prof_path)
        report["calibration"] = {
            "r2_holdout": run.calibration.r2_holdout,
            "mape_holdout": run.calibration.mape_holdout,
            "mape_all": run.calibration.mape_all,
            "shapes": len(run.measurements),
            "mixed_runs": sum(1 for m in run.measurements if m.mix) if not args.jitter else args.mixed_runs,
            "jitter": args.jitter,
            "terms": list(run.calibration.terms),
        }
    report["profile"] = {k: v for k, v in profile.to_dict().items() if k not in ("perf", "fit")}
    ladder = [int(c) for c in args.ladder.split(",")]
    results: dict[str, Any] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        probe = EngineProbe(session, engine, args.model, busy_clock=_busy_clock(args))
        words: dict[int, int] = {}
        mixes = scaled_mixes(args.mix_scale)
        report["mix_scale"] = args.mix_scale
        for shapes in mixes.values():
            for i, _ in shapes:
                if i not in words:
                    words[i] = await probe.words_for(i)
        for name, shapes in mixes.items():
            res = await measure_mix(
                probe,
                shapes,
                words,
                ladder,
                args.requests_per_worker,
                profile,
                args.min_requests,
                args.min_busy_s if args.engine_pid is not None else 0.0,
            )
            results[name] = res
            if not args.quiet:
                print(
                    f"{name:<14} predicted {res['predicted_req_per_min']:8.1f} req/min  measured "
                    f"{res['measured_req_per_min']:8.1f} req/min  error {res['error']:+.1%} "
                    f"(saturated at c={res['saturated_at_concurrency']})",
                    flush=True,
                )
    report["mixes"] = results
    report["max_abs_error"] = max(abs(r["error"]) for r in results.values())
    report["pass"] = report["max_abs_error"] <= TARGET
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", help="Engine base URL (OpenAI-compatible).")
    ap.add_argument("--model", default="fleetgate-sim", help="Model name to request.")
    ap.add_argument("--profile", help="Cost profile (bundled name or JSON); default: calibrate first.")
    ap.add_argument("--quick", action="store_true", help="Quick calibration sweep (when calibrating).")
    ap.add_argument("--spawn-sim", action="store_true", help="Start a simulated engine for the run.")
    ap.add_argument("--time-scale", type=float, default=10.0, help="Simulated engine time scale.")
    ap.add_argument("--sim-arg", action="append", default=[], help="Extra argument for `engine sim`.")
    ap.add_argument(
        "--ladder", default="1,2,4,8,16,32,64", help="Concurrency ladder (calibration and mixes)."
    )
    ap.add_argument("--requests-per-worker", type=int, default=4)
    ap.add_argument("--min-requests", type=int, default=8, help="Fewest requests per ladder rung.")
    ap.add_argument(
        "--inputs", default="", help="Calibration input lengths, e.g. 16,128,512 (default: design)."
    )
    ap.add_argument(
        "--outputs", default="", help="Calibration output lengths, e.g. 4,32,96 (default: design)."
    )
    ap.add_argument(
        "--mixed-runs",
        type=int,
        default=0,
        help="Add this many mixed-shape runs (random grid shapes interleaved) to the calibration sweep.",
    )
    ap.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        help="Spread each grid shape's lengths by +-this fraction (8 variants), so requests run out of step.",
    )
    ap.add_argument("--mix-scale", type=float, default=1.0, help="Scale the mixes' lengths (slow engines).")
    ap.add_argument(
        "--engine-pid",
        type=int,
        default=None,
        help="Measure replica time as the CPU time of this local engine process and its children.",
    )
    ap.add_argument(
        "--min-busy-s",
        type=float,
        default=2.0,
        help="With --engine-pid: extend a rung until the engine used this much CPU time.",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/calibrate_check.json"))
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument(
        "--rescore",
        type=Path,
        default=None,
        help="Refit the profile of a finished report (REPORT.json) with the current code; no engine.",
    )
    args = ap.parse_args(argv)
    if args.rescore is not None:
        res = rescore(args.rescore, args.seed)
        for name, r in res["mixes"].items():
            print(
                f"{name:<14} predicted {r['predicted_req_per_min']:8.1f} req/min  measured "
                f"{r['measured_req_per_min']:8.1f} req/min  error {r['error']:+.1%}"
            )
        cal = res["calibration"]
        print(
            f"held-out MAPE {cal['mape_holdout']:.1%} (split {cal['holdout']}), refitted on all: "
            f"MAPE {cal['mape_all']:.1%}, terms {cal['terms']}; max |error| {res['max_abs_error']:.1%} -> "
            f"{'PASS' if res['pass'] else 'FAIL'}"
        )
        if args.out != Path("bench/results/calibrate_check.json"):
            args.out.write_text(json.dumps(res, indent=2) + "\n")
        return 0 if res["pass"] else 1
    if not args.engine and not args.spawn_sim:
        ap.error("give --engine URL or --spawn-sim")

    if args.spawn_sim:
        with spawn_sim(args.time_scale, args.sim_arg) as url:
            report = asyncio.run(check(args, url))
        report["sim_time_scale"] = args.time_scale
        report["sim_args"] = args.sim_arg
    else:
        report = asyncio.run(check(args, args.engine))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"max |error| {report['max_abs_error']:.1%} -> {'PASS' if report['pass'] else 'FAIL'};"
        f" wrote {args.out}"
    )
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
