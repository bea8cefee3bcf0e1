"""Micro-benchmark: microseconds per ``pick`` (+ ``on_dispatch`` + ``on_complete``) for every routing policy.

Not a test: run ``.venv/bin/python bench/routing_pick.py [--replicas 128] [--requests 20000]``. A synthetic
stream of requests over a fleet of ``--replicas`` replicas: 200 conversation groups whose prompts share
prefixes (like Mooncake ``hash_ids``, 512-token blocks), in-flight counters that rise at dispatch and fall
at completion (each request completes ``--concurrency`` picks later), and engine metrics on every snapshot.
Snapshots are rebuilt only for the replica that changed, as the simulator does, so the figure is the
policy's own cost. ``--learned-rates``: every snapshot carries a learned prefill rate (a deployment after its
first requests; fixed, scattered 10% around 5,000 tokens/s). ``--params``: JSON params per policy name or
``@tag`` (``--policies fleetgate,fleetgate@old --params '{"old": {...}}'``).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fleetgate.core.routing import POLICY_NAMES, RoutingPolicy, build_policy
from fleetgate.core.types import RandomSource, ReplicaSnapshot, RequestInfo, RouteDecision


def make_requests(n: int, seed: int) -> list[RequestInfo]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        group = int(rng.paretovariate(1.2)) % 200
        turn = rng.randint(1, 12)
        hashes = (0, *(group * 1000 + k for k in range(1, turn + 1)))
        inp = len(hashes) * 512 - rng.randint(0, 511)
        out.append(
            RequestInfo(
                request_id=f"q{i}",
                model="m",
                input_tokens=inp,
                estimated_output_tokens=300,
                cost_mu=0.00016 * inp + 0.0012 * 300,
                prefix_hashes=hashes,
                prefix_block_tokens=512,
                arrival_s=i * 0.01,
            )
        )
    return out


class _Null:
    """Harness baseline: always the first replica, no bookkeeping."""

    name = "harness"

    def pick(
        self,
        request: RequestInfo,
        replicas: Sequence[ReplicaSnapshot],
        now: float,
        rng: RandomSource,
        exclude: frozenset[str] = frozenset(),
    ) -> RouteDecision:
        return RouteDecision(replicas[0].name)

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        pass

    def on_complete(self, request: RequestInfo, replica: str, now: float, cost_mu: float, ok: bool) -> None:
        pass


def run(
    policy_name: str,
    replicas: int,
    requests: list[RequestInfo],
    concurrency: int,
    params: dict[str, Any] | None = None,
    learned_rates: bool = False,
) -> float:
    policy: RoutingPolicy = _Null() if policy_name == "harness" else build_policy(policy_name, params)
    rng = random.Random(1)
    spread = random.Random(3)
    snaps = [
        ReplicaSnapshot(
            f"replica-{i}",
            engine_waiting=0,
            engine_running=0,
            engine_kv_usage=0.1,
            learned_prefill_tokens_per_s=5000.0 * (1.0 + 0.1 * spread.gauss(0, 1)) if learned_rates else None,
        )
        for i in range(replicas)
    ]
    index = {s.name: i for i, s in enumerate(snaps)}
    inflight: deque[tuple[RequestInfo, str]] = deque()
    t0 = time.process_time()
    for req in requests:
        now = req.arrival_s
        d = policy.pick(req, snaps, now, rng)
        policy.on_dispatch(req, d.replica, now)
        i = index[d.replica]
        s = snaps[i]
        snaps[i] = replace(
            s, inflight_requests=s.inflight_requests + 1, inflight_mu=s.inflight_mu + req.cost_mu
        )
        inflight.append((req, d.replica))
        if len(inflight) > concurrency:
            done, name = inflight.popleft()
            policy.on_complete(done, name, now, done.cost_mu, True)
            j = index[name]
            s = snaps[j]
            snaps[j] = replace(
                s,
                inflight_requests=s.inflight_requests - 1,
                inflight_mu=max(0.0, s.inflight_mu - done.cost_mu),
            )
    return (time.process_time() - t0) / len(requests) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--replicas", type=int, default=128)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--policies", default=",".join(POLICY_NAMES))
    ap.add_argument("--params", default="{}", help="JSON: policy name or @tag -> params")
    ap.add_argument("--learned-rates", action="store_true", help="snapshots carry learned prefill rates")
    args = ap.parse_args()
    params: dict[str, dict[str, Any]] = json.loads(args.params)
    reqs = make_requests(args.requests, seed=7)
    print(f"replicas={args.replicas} requests={args.requests} (pick + on_dispatch + on_complete, us/request)")
    base = run("harness", args.replicas, reqs, args.concurrency, learned_rates=args.learned_rates)
    print(f"{'(harness)':15s} {base:8.1f} us/request (snapshot updates; subtracted below)")
    for label in args.policies.split(","):
        name, _, tag = label.partition("@")
        us = run(name, args.replicas, reqs, args.concurrency, params.get(tag or name), args.learned_rates)
        us -= base
        print(f"{label:15s} {us:8.1f} us/pick")


if __name__ == "__main__":
    main()
