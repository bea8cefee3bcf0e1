#!/usr/bin/env python3
"""Calibrate the simulated engine's performance model in-process (no HTTP) -> the ``fleetgate-sim`` profile.

The default simulated engine batches up to 256 requests; saturating it over HTTP would take thousands of
requests per second, more than a 2-core machine can send. Its performance model is pure, so this script
measures it directly, the same way ``fleetgate calibrate`` measures a live engine: for each shape of the
sweep, ``4 x max_num_seqs`` identical requests are queued at once and the steady-state completion rate (the
middle half of the completions) gives the replica seconds per request; ``core.calibrate`` fits the profile.
Deployments of simulated engines at their default settings should use ``cost_profile: fleetgate-sim``.

    .venv/bin/python bench/sim_default_profile.py [--no-write] [--max-num-seqs N --mixes]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import replace
from pathlib import Path

from fleetgate.core.calibrate import Measurement, fit_cost_profile, sweep_design
from fleetgate.simengine.perfmodel import EngineModel, EngineRequest, PerfParams

ROOT = Path(__file__).resolve().parent.parent


def saturated_seconds(params: PerfParams, input_tokens: int, output_tokens: int) -> float:
    """Replica seconds per request of one shape when the engine is kept saturated."""
    return saturated_mix_seconds(params, [(input_tokens, output_tokens)])


def saturated_mix_seconds(params: PerfParams, shapes: list[tuple[int, int]]) -> float:
    """Replica seconds per request of a mix (shapes cycled) when the engine is kept saturated."""
    n = 4 * params.max_num_seqs * len(shapes)
    model = EngineModel(params)
    for k in range(n):
        i, o = shapes[k % len(shapes)]
        model.submit(EngineRequest(f"r{k}", i, o), 0.0)
    finished: list[float] = []
    while (t := model.next_event_time()) is not None:
        finished.extend(model.advance(t).finished.values())
    finished.sort()
    t_lo, t_hi = finished[n // 4], finished[(3 * n) // 4]
    inner = sum(1 for f in finished if t_lo < f <= t_hi)
    return (t_hi - t_lo) / inner


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out", type=Path, default=ROOT / "src" / "fleetgate" / "profiles" / "fleetgate-sim.json"
    )
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--max-num-seqs", type=int, default=None, help="Override the batch size.")
    ap.add_argument(
        "--mixes", action="store_true", help="Also predict bench/calibrate_check.py's mixes vs the model."
    )
    args = ap.parse_args(argv)
    params = PerfParams()
    if args.max_num_seqs is not None:
        params = replace(params, max_num_seqs=args.max_num_seqs)
    design = sweep_design([16, 128, 512, 1024, 2048, 4096], [4, 32, 96, 256, 512], [params.max_num_seqs])
    ms = [
        Measurement(
            p.input_tokens, p.output_tokens, saturated_seconds(params, p.input_tokens, p.output_tokens)
        )
        for p in design
    ]
    cal = fit_cost_profile(
        ms,
        random.Random(0),
        name="fleetgate-sim",
        model="fleetgate-sim",
        hardware="simulated (default PerfParams)",
        engine="fleetgate engine sim, time scale 1",
        perf={
            "prefill_base_s": 0.0,
            "prefill_s_per_token": params.prefill_s_per_token,
            "prefill_s_per_token2": params.prefill_s_per_token_sq,
            "decode_step_base_s": params.step_overhead_s,
            "decode_step_per_seq_s": params.decode_s_per_seq,
            "decode_step_per_kilotoken_s": params.decode_s_per_kv_token * 1000.0,
            "max_batch": params.max_num_seqs,
            "kv_capacity_tokens": params.kv_capacity_tokens,
            "source": "bench/sim_default_profile.py (in-process saturation of simengine.perfmodel)",
        },
    )
    p = cal.profile
    print(f"{len(ms)} shapes; extra terms: {list(cal.terms) or 'none'}")
    print(
        f"alpha={p.alpha:.6g} beta={p.beta:.6g} gamma={p.gamma:.6g} delta={p.delta:.6g} "
        f"epsilon={p.epsilon:.6g}"
    )
    print(f"held-out R^2={cal.r2_holdout:.4f} MAPE={cal.mape_holdout:.2%} (train MAPE={cal.mape_train:.2%})")
    if args.mixes:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from calibrate_check import MIXES

        for name, shapes in MIXES.items():
            measured = 60.0 / saturated_mix_seconds(params, shapes)
            predicted = p.saturated_requests_per_min(sum(p.cost(i, o) for i, o in shapes) / len(shapes))
            print(
                f"{name:<14} predicted {predicted:8.1f} req/min  model {measured:8.1f}"
                f"  {predicted / measured - 1:+.1%}"
            )
    if not args.no_write:
        data = p.to_dict() | {"measurements": [m.as_dict() for m in ms]}
        args.out.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
