"""How far apart the prefill rates learned online for a deployment's replicas are in the simulator.

    .venv/bin/python bench/learned_rate_spread.py --workload batch --load 0.5 --replicas 8 --speed-noise 0.3
        [--params '{"rate_learning": "busy"}']

Runs fleetgate (default parameters, or ``--params``) on a workload of bench/session_affinity.py and, after
every update of the learner, the ratio of the largest to the smallest learned rate over the replicas learned
so far; prints its p10 / p50 / p90 over the run, the engines' true rate (the profile's) and the final learned
rates. Accuracy: at every completion, the completing replica's learned rate over its true rate at that moment
(the profile's rate x the replica's speed factor, ``sim.speed``), p10 / p50 / p90 over the run, and how many
replicas had a rate by the end. Without ``--speed-noise`` / ``--speed-spread`` every replica is the same
deterministic engine (docs/simulator.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from session_affinity import PER_REPLICA, build

from fleetgate.core.engine_rates import EngineRateLearner
from fleetgate.core.lifecycle.observers import ObserverBase
from fleetgate.core.routing.registry import build_policy
from fleetgate.core.types import RequestInfo, Usage
from fleetgate.profiles import load_profile
from fleetgate.sim.des import SimConfig, Simulator
from fleetgate.sim.engine import engine_factory, perf_params_from_profile
from fleetgate.sim.speed import SpeedVariation, SpeedVaryingEngine


class _Spread(ObserverBase):
    """A lifecycle observer sampling the spread of the learned rates at every completion (it runs before
    the learner sees that completion: a lag of one event)."""

    def __init__(self) -> None:
        self.learner: EngineRateLearner | None = None
        self.spread: list[float] = []
        #: replica -> its true prefill rate at a time (set once the simulator exists)
        self.true_rate: Callable[[str, float], float] | None = None
        self.accuracy: list[float] = []

    def on_complete(
        self, request: RequestInfo, replica: str, now: float, usage: Usage | None, cost_mu: float, ok: bool
    ) -> None:
        if self.learner is None:
            return
        rs = [v.prefill_tokens_per_s for v in self.learner.current.values() if v.prefill_tokens_per_s]
        if len(rs) >= 2:
            self.spread.append(max(rs) / min(rs))
        own = self.learner.rates(replica).prefill_tokens_per_s
        if own and self.true_rate is not None:
            self.accuracy.append(own / self.true_rate(replica, now))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="batch", choices=sorted(PER_REPLICA))
    ap.add_argument("--load", type=float, default=0.5)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--traces", type=Path, default=Path("/work/shared/traces"))
    ap.add_argument("--speed-noise", type=float, default=0.0)
    ap.add_argument("--speed-spread", type=float, default=0.0)
    ap.add_argument("--speed-period", type=float, default=30.0)
    ap.add_argument("--params", default="{}", help="fleetgate policy params (JSON)")
    args = ap.parse_args()
    n = args.replicas
    trace = build(args.workload, n, args.load, PER_REPLICA[args.workload], args.seed, args.traces)
    profile = load_profile("llama2-70b-h100-tp4")
    block = trace.requests[0].block_tokens
    speed = SpeedVariation(args.speed_spread, args.speed_noise, args.speed_period, args.seed)
    sim = Simulator(
        trace,
        build_policy("fleetgate", json.loads(args.params), profile=profile),
        profile,
        engine_factory(profile, hash_block_tokens=block, speed=speed),
        SimConfig(replicas=n, seed=args.seed),
        observers=(watched := _Spread(),),
    )
    watched.learner = sim.rates
    true = 1.0 / perf_params_from_profile(profile, hash_block_tokens=block).prefill_s_per_token
    engines: dict[str, object] = {}

    def true_rate(replica: str, now: float) -> float:
        if replica not in engines:
            engines.update((r.name, r.engine) for r in sim.replicas)
        engine = engines[replica]
        return true * (engine.speed_at(now) if isinstance(engine, SpeedVaryingEngine) else 1.0)

    watched.true_rate = true_rate
    summary = sim.run().summary
    final = sorted(round(v.prefill_tokens_per_s or 0) for v in sim.rates.current.values())
    q = statistics.quantiles(watched.spread, n=10) if len(watched.spread) > 1 else [float("nan")] * 9
    print(f"engines' rate {true:.0f} tokens/s; learned at the end: {final}")
    print(f"max/min learned over the run: p10 {q[0]:.2f}, p50 {q[4]:.2f}, p90 {q[8]:.2f}")
    acc = statistics.quantiles(watched.accuracy, n=10) if len(watched.accuracy) > 1 else [float("nan")] * 9
    learned = sum(1 for v in sim.rates.current.values() if v.prefill_tokens_per_s)
    print(f"learned / true at each completion: p10 {acc[0]:.3f}, p50 {acc[4]:.3f}, p90 {acc[8]:.3f} "
          f"({len(watched.accuracy)} samples); replicas learned at the end: {learned} of {n}")  # fmt: skip
    print(f"TTFT p50 / p95 / p99 {summary['ttft_p50_s']:.3f} / {summary['ttft_p95_s']:.3f} / "
          f"{summary['ttft_p99_s']:.3f} s, hit {summary['cache_hit_rate']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
