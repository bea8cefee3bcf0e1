"""How well fleetgate's TTFT estimate predicts each request's real time to first token in the simulator.

    .venv/bin/python bench/ttft_prediction.py --workload rag --load 1 --replicas 16 --speed-noise 0.3
        --params '{"default": {}, "busy": {"rate_learning": "busy"}}'

Runs fleetgate with each named parameter set of ``--params`` on one cell of bench/session_affinity.py and
records, per request, what the pick estimated for the replica it chose (``est_ttft_s``: queued prefill ahead +
own prefill + slot wait, seconds from dispatch) and what happened (first token less dispatch). Prints per set:
the ratio real / estimated (p10 / p50 / p90), the mean absolute log2 error, the share of requests within 2x,
the same for the queue part alone (requests estimated to wait), the gate's hold (dispatch less arrival, p95)
and the run's TTFT p50 / p95 / p99.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from session_affinity import PER_REPLICA, build

from fleetgate.core.lifecycle.observers import ObserverBase
from fleetgate.core.routing.fleetgate import FleetgateParams, FleetgatePolicy
from fleetgate.core.routing.parts import PartContext, build_scorers
from fleetgate.core.types import RandomSource, ReplicaSnapshot, RequestInfo, RouteDecision
from fleetgate.core.units import CostProfile
from fleetgate.profiles import load_profile
from fleetgate.sim.des import SimConfig, Simulator
from fleetgate.sim.engine import engine_factory
from fleetgate.sim.speed import SpeedVariation
from fleetgate.sim.traces import Trace


class _Recording(FleetgatePolicy):
    """fleetgate as the registry builds it, remembering each pick's estimate and its queue part."""

    def __init__(self, params: FleetgateParams, profile: CostProfile) -> None:
        ctx = PartContext(profile=profile, rate_tau_s=params.rate_tau_s)
        super().__init__(
            params,
            profile,
            outliers=params.outlier.detector(),
            scorers=build_scorers(params.scorers, ctx),
        )
        self.estimated: dict[str, tuple[float, float]] = {}

    def pick(
        self,
        request: RequestInfo,
        replicas: Sequence[ReplicaSnapshot],
        now: float,
        rng: RandomSource,
        exclude: frozenset[str] = frozenset(),
    ) -> RouteDecision:
        d = super().pick(request, replicas, now, rng, exclude)
        t = d.scores.get("est_ttft_s", math.nan)
        own = self.estimate.memo[4]
        self.estimated[request.request_id] = (t, t - own)
        return d


class _Outcomes(ObserverBase):
    def __init__(self) -> None:
        self.dispatched: dict[str, float] = {}
        self.arrived: dict[str, float] = {}
        self.first: dict[str, float] = {}

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        self.dispatched[request.request_id] = now
        self.arrived.setdefault(request.request_id, request.arrival_s)

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        self.first.setdefault(request.request_id, now)


def _q(xs: list[float]) -> list[float]:
    return statistics.quantiles(xs, n=10) if len(xs) > 1 else [math.nan] * 9


def run_one(
    trace: Trace, n: int, seed: int, params: dict[str, Any], speed: SpeedVariation
) -> tuple[dict[str, float], list[float], list[float], list[float]]:
    """One run: the summary, real / estimated per request, the same for the queue part, the gate holds."""
    profile = load_profile("llama2-70b-h100-tp4")
    block = trace.requests[0].block_tokens
    policy = _Recording(FleetgateParams.model_validate(params), profile)
    seen = _Outcomes()
    sim = Simulator(
        trace,
        policy,
        profile,
        engine_factory(profile, hash_block_tokens=block, speed=speed),
        SimConfig(replicas=n, seed=seed),
        observers=(seen,),
    )
    s = sim.run().summary
    ratio: list[float] = []
    qratio: list[float] = []
    holds: list[float] = []
    for rid, ft in seen.first.items():
        est = policy.estimated.get(rid)
        at = seen.dispatched.get(rid)
        if est is None or at is None:
            continue
        real = ft - at
        holds.append(at - seen.arrived[rid])
        if est[0] > 0 and real > 0:
            ratio.append(real / est[0])
        own = est[0] - est[1]
        if est[1] > 0.05 and real - own > 0:
            qratio.append((real - own) / est[1])
    return s, ratio, qratio, holds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="rag", choices=sorted(PER_REPLICA))
    ap.add_argument("--load", default="1", help="comma-separated loads")
    ap.add_argument("--replicas", default="16", help="comma-separated replica counts")
    ap.add_argument("--seed", default="0", help="comma-separated seeds")
    ap.add_argument("--traces", type=Path, default=Path("/work/shared/traces"))
    ap.add_argument("--speed-noise", type=float, default=0.0)
    ap.add_argument("--speed-spread", type=float, default=0.0)
    ap.add_argument("--params", default='{"default": {}}', help="name -> fleetgate params (JSON)")
    args = ap.parse_args()
    sets: dict[str, dict[str, Any]] = json.loads(args.params)
    print("| cell | params | real/est p10 / p50 / p90 | mean abs log2 err | within 2x | queue part: "
          "real-own / est p10 / p50 / p90 (n) | gate hold p90 s | TTFT p50 / p95 / p99 | hit |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    p95s: dict[str, list[float]] = {name: [] for name in sets}
    errs: dict[str, list[float]] = {name: [] for name in sets}
    for seed in (int(x) for x in args.seed.split(",")):
        for load in (float(x) for x in args.load.split(",")):
            for n in (int(x) for x in args.replicas.split(",")):
                trace = build(args.workload, n, load, PER_REPLICA[args.workload], seed, args.traces)
                for name, params in sets.items():
                    speed = SpeedVariation(args.speed_spread, args.speed_noise, 30.0, seed)
                    s, ratio, qratio, holds = run_one(trace, n, seed, params, speed)
                    logs = [abs(math.log2(x)) for x in ratio]
                    r, qr, h = _q(ratio), _q(qratio), _q(holds)
                    within = sum(1 for x in logs if x <= 1.0) / max(len(logs), 1)
                    p95s[name].append(s["ttft_p95_s"])
                    errs[name].append(statistics.fmean(logs) if logs else math.nan)
                    print(
                        f"| {args.workload} {n} x{load:g} s{seed} | {name} | {r[0]:.2f} / {r[4]:.2f} / "
                        f"{r[8]:.2f} | {errs[name][-1]:.2f} | {within:.2f} | {qr[0]:.2f} / {qr[4]:.2f} / "
                        f"{qr[8]:.2f} ({len(qratio)}) | {h[8]:.2f} | {s['ttft_p50_s']:.2f} / "
                        f"{s['ttft_p95_s']:.2f} / {s['ttft_p99_s']:.2f} | {s['cache_hit_rate']:.3f} |",
                        flush=True,
                    )
    first = next(iter(sets))
    print()
    print(f"| params | cells | p95 / {first}'s: geometric mean, lower / higher (2%), worst "
          "| mean abs log2 err |")  # fmt: skip
    print("|---|---|---|---|")
    for name in sets:
        rel = [a / b for a, b in zip(p95s[name], p95s[first], strict=True)]
        gm = math.exp(statistics.fmean(math.log(x) for x in rel))
        lo = sum(1 for x in rel if x < 0.98)
        hi = sum(1 for x in rel if x > 1.02)
        err = statistics.fmean(errs[name])
        print(f"| {name} | {len(rel)} | {gm:.3f}, {lo} / {hi}, {max(rel):.3f} | {err:.2f} |")


if __name__ == "__main__":
    main()
