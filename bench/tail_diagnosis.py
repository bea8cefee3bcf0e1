"""Where a workload's TTFT tail comes from, per policy, and how low it could go (issue 20, item 3).

For one workload cell (``bench/session_affinity.py``'s workloads and loads) this prints

- **bounds** from the trace alone, with the simulated engine itself: each request's *solo* TTFT (its own
  prefill on an idle replica that already holds the longest prefix any earlier request sent, i.e. no
  queueing and the best cache it could have); the p50/p95/p99 of that is a floor no router goes under. And an
  **FCFS oracle**: one central first-come-first-served queue in front of ``n`` replicas with every request's
  solo prefill time known exactly (M/G/n; the same as sending each request at arrival to the replica whose
  queued prefill ends first, knowing every prefill exactly); ``--orders`` adds central queues that start the
  request with the smallest ``arrival + c x prefill`` instead. All use only the simulator's own numbers:
  diagnostics, never router inputs. (Prefill-only: a workload whose tail is KV memory or decode, like
  agentic overload, is not bounded by them.)
- **per policy**, each request's TTFT split into the time held at the gateway (dispatch gate), the time
  queued in the engine before its prefill (engine TTFT minus its solo TTFT) and its solo TTFT, for all
  requests and for the tail (TTFT at or above the policy's p95), plus the tail's share of long prompts.

    nice -n 19 .venv/bin/python bench/tail_diagnosis.py --workload batch --load 0.5 --replicas 8 \\
        --policies cache_aware,fleetgate
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from session_affinity import PER_REPLICA, build

from fleetgate.sim.engine import engine_factory, perf_params_from_profile
from fleetgate.sim.runner import SimOptions, _profile, run_des
from fleetgate.sim.traces import Trace
from fleetgate.simengine.perfmodel import EngineModel, EngineRequest


def solo_ttft(trace: Trace, params: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per request: TTFT alone on an idle replica holding the longest prefix any earlier request sent, and
    the cached tokens that assumes."""
    seen: set[int] = set()
    out = np.zeros(len(trace.requests))
    cached_tokens = np.zeros(len(trace.requests))
    memo: dict[tuple[int, int], float] = {}
    for i, r in enumerate(trace.requests):
        m = 0
        for h in r.hash_ids:
            if h not in seen:
                break
            m += 1
        seen.update(r.hash_ids)
        m = min(m, max(0, len(r.hash_ids) - 1))
        key = (r.input_tokens, m * r.block_tokens)
        got = memo.get(key)
        if got is None:
            eng = EngineModel(params, track_emitted=False)
            t = 0.0
            if m:
                eng.submit(EngineRequest("warm", m * r.block_tokens, 1, tuple(r.hash_ids[:m]), 0,
                                         r.block_tokens), 0.0)  # fmt: skip
                t = eng.run_until_idle().end + 1.0
            eng.advance(t)
            eng.submit(EngineRequest("x", r.input_tokens, 1, tuple(r.hash_ids), 0, r.block_tokens), t)
            res = eng.run_until_idle()
            got = memo[key] = res.first_token["x"] - t
        out[i] = got
        cached_tokens[i] = m * r.block_tokens
    return out, cached_tokens


def fcfs_oracle(arrival: np.ndarray, service: np.ndarray, n: int) -> np.ndarray:
    """TTFT of M/G/n first come, first served with the given service (prefill) times."""
    free = [0.0] * n
    out = np.zeros(len(arrival))
    for i in np.argsort(arrival, kind="stable"):
        start = max(arrival[i], heapq.heappop(free))
        heapq.heappush(free, start + service[i])
        out[i] = start + service[i] - arrival[i]
    return out


def priority_oracle(arrival: np.ndarray, service: np.ndarray, n: int, c: float) -> np.ndarray:
    """TTFT of a central non-preemptive queue in front of ``n`` replicas that starts the waiting request
    with the smallest ``arrival + c x service`` (0: FCFS; c > 0 leans to short prefills first, like the
    dispatch gate with ``gate_aging: 1 / c``; c < 0 to long ones), service times known exactly."""
    order = np.argsort(arrival, kind="stable")
    free = [0.0] * n
    waiting: list[tuple[float, int]] = []
    out = np.zeros(len(arrival))
    i = 0
    t = 0.0
    for _ in range(len(arrival)):
        t = max(t, heapq.heappop(free))
        if not waiting and i < len(order):
            t = max(t, arrival[order[i]])
        while i < len(order) and arrival[order[i]] <= t:
            j = order[i]
            heapq.heappush(waiting, (arrival[j] + c * service[j], j))
            i += 1
        j = heapq.heappop(waiting)[1]
        out[j] = t + service[j] - arrival[j]
        heapq.heappush(free, t + service[j])
    return out


def q(x: np.ndarray) -> str:
    return " / ".join(f"{np.percentile(x, p):.2f}" for p in (50, 95, 99))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="batch", choices=sorted(PER_REPLICA))
    ap.add_argument("--load", type=float, default=0.5)
    ap.add_argument("--replicas", default="8")
    ap.add_argument("--policies", default="cache_aware,fleetgate")
    ap.add_argument("--params", default="{}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-replica", type=float, default=None)
    ap.add_argument("--traces", type=Path, default=Path("/work/shared/traces"))
    ap.add_argument("--orders", default="", help="c values of priority oracles to add, e.g. 1,4,-1")
    args = ap.parse_args()
    params: dict[str, dict[str, Any]] = json.loads(args.params)
    per = args.per_replica if args.per_replica is not None else PER_REPLICA[args.workload]
    for n in (int(x) for x in args.replicas.split(",")):
        trace = build(args.workload, n, args.load, per, args.seed, args.traces)
        block = trace.requests[0].block_tokens
        opts0 = SimOptions(trace=args.workload, replicas=n, mode="des", seed=args.seed)
        prof = _profile(opts0)
        solo, _ = solo_ttft(trace, perf_params_from_profile(prof, hash_block_tokens=block))
        arrival = np.array([r.arrival_s for r in trace.requests])
        oracle = fcfs_oracle(arrival, solo, n)
        work = solo.sum() / max(arrival.max() - arrival.min(), 1e-9) / n
        print(f"\n### {args.workload} x{args.load:g}, {n} replicas, {len(trace.requests)} requests, "
              f"prefill utilisation {work:.2f}\n")  # fmt: skip
        print(
            "| what | TTFT p50 / p95 / p99 | held at gateway: all mean, tail mean | queued in engine: "
            "all mean, tail mean | solo: all mean, tail mean | tail: share of prompts >= solo p80 |"
        )
        print("|---|---|---|---|---|---|")
        long_cut = np.percentile(solo, 80)
        print(f"| solo (floor) | {q(solo)} | | | | |")
        tail = oracle >= np.percentile(oracle, 95)
        print(f"| FCFS oracle (M/G/{n}) | {q(oracle)} | | {np.mean(oracle - solo):.2f}, "
              f"{np.mean((oracle - solo)[tail]):.2f} | {solo.mean():.2f}, {solo[tail].mean():.2f} "
              f"| {np.mean(solo[tail] >= long_cut):.2f} |")  # fmt: skip
        for c in (float(x) for x in args.orders.split(",") if x):
            print(f"| priority oracle c={c:g} | {q(priority_oracle(arrival, solo, n, c))} | | | | |")
        for label in args.policies.split(","):
            name, _, tag = label.partition("@")
            opts = SimOptions(trace=args.workload, policy=name, policy_params=params.get(tag or name, {}),
                              replicas=n, mode="des", seed=args.seed)  # fmt: skip
            res = run_des(opts, trace=trace, engine_factory=engine_factory(prof, hash_block_tokens=block))
            ttft = res.ttft_s
            held = res.dispatch_s - res.arrival_s
            queued = ttft - held - solo
            tail = ttft >= np.percentile(ttft, 95)
            print(
                f"| {label} | {q(ttft)} | {held.mean():.2f}, {held[tail].mean():.2f} | "
                f"{queued.mean():.2f}, {queued[tail].mean():.2f} | "
                f"{solo.mean():.2f}, {solo[tail].mean():.2f} | {np.mean(solo[tail] >= long_cut):.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
