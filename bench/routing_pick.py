"""Micro-benchmark: microseconds per ``pick`` (+ ``on_dispatch`` + ``on_complete``) for every routing policy.

Not a test: run ``.venv/bin/python bench/routing_pick.py [--replicas 128] [--requests 20000]``. A synthetic
stream of requests over a fleet of ``--replicas`` replicas: 200 conversation groups whose prompts share
prefixes (like Mooncake ``hash_ids``, 512-token blocks), in-flight counters that rise at dispatch and fall
at completion (each request completes ``--concurrency`` picks later), and engine metrics on every snapshot.
Snapshots are rebuilt only for the replica that changed, as the simulator does, so the figure is the
policy's own cost. ``--learned-rates``: every snapshot carries a learned prefill rate (a deployment after its
first requests; fixed, scattered 10% around 5,000 tokens/s). ``--params``: JSON params per policy name or
``@tag`` (``--policies fleetgate,fleetgate@old --params '{"old": {...}}'``).

Two source trees side by side in one process (a shared machine's load drifts between processes):
``--src old=/tmp/old/src --src new=src --rounds 8`` imports each tree's ``fleetgate`` on its own, runs every
tree x policy once per round in a rotating order, and prints each one's median over the rounds and its
median per-round ratio to the first tree's first policy.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fleetgate.core.routing import POLICY_NAMES, RoutingPolicy, build_policy
from fleetgate.core.types import RandomSource, ReplicaSnapshot, RequestInfo, RouteDecision


def make_requests(n: int, seed: int, request_cls: Any = RequestInfo) -> list[RequestInfo]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        group = int(rng.paretovariate(1.2)) % 200
        turn = rng.randint(1, 12)
        hashes = (0, *(group * 1000 + k for k in range(1, turn + 1)))
        inp = len(hashes) * 512 - rng.randint(0, 511)
        out.append(
            request_cls(
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
    tree: tuple[Any, Any] = (build_policy, ReplicaSnapshot),
) -> float:
    build, snapshot_cls = tree
    policy: RoutingPolicy = _Null() if policy_name == "harness" else build(policy_name, params)
    rng = random.Random(1)
    spread = random.Random(3)
    snaps = [
        snapshot_cls(
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


def load_tree(src: str) -> tuple[Any, Any, Any]:
    """``(build_policy, ReplicaSnapshot, RequestInfo)`` of the ``fleetgate`` under ``src``, imported apart
    from any other tree's (each tree's policies get that tree's own types: enums are compared by identity)."""
    for name in [m for m in sys.modules if m == "fleetgate" or m.startswith("fleetgate.")]:
        del sys.modules[name]
    sys.path.insert(0, src)
    try:
        routing = importlib.import_module("fleetgate.core.routing")
        types = importlib.import_module("fleetgate.core.types")
    finally:
        sys.path.remove(src)
    return routing.build_policy, types.ReplicaSnapshot, types.RequestInfo


def side_by_side(args: argparse.Namespace, params: dict[str, dict[str, Any]]) -> None:
    trees = {label: load_tree(path) for label, _, path in (s.partition("=") for s in args.src)}
    reqs = {label: make_requests(args.requests, 7, t[2]) for label, t in trees.items()}
    runs = [(label, p) for label in trees for p in args.policies.split(",")]
    got: dict[tuple[str, str], list[float]] = {r: [] for r in runs}
    for rnd in range(args.rounds):
        order = runs[rnd % len(runs) :] + runs[: rnd % len(runs)]
        for label, policy in order:
            tree = trees[label][:2]
            base = run(
                "harness", args.replicas, reqs[label], args.concurrency, None, args.learned_rates, tree
            )
            name, _, tag = policy.partition("@")
            us = run(
                name,
                args.replicas,
                reqs[label],
                args.concurrency,
                params.get(tag or name),
                args.learned_rates,
                tree,
            )
            got[(label, policy)].append(us - base)
    ref = got[runs[0]]
    first = f"{runs[0][0]} {runs[0][1]}"
    print(f"replicas={args.replicas} requests={args.requests} rounds={args.rounds} (us/pick, median; ratio to {first}: median per round, min-max)")  # fmt: skip  # noqa: E501
    for r in runs:
        ratios = [a / b for a, b in zip(got[r], ref, strict=True)]
        print(
            f"{r[0]:>8s} {r[1]:15s} {statistics.median(got[r]):8.1f} us/pick  ratio "
            f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--replicas", type=int, default=128)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--policies", default=",".join(POLICY_NAMES))
    ap.add_argument("--params", default="{}", help="JSON: policy name or @tag -> params")
    ap.add_argument("--learned-rates", action="store_true", help="snapshots carry learned prefill rates")
    ap.add_argument("--src", action="append", default=[], help="LABEL=PATH of a source tree (repeatable)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the trees side by side (with --src)")
    args = ap.parse_args()
    params: dict[str, dict[str, Any]] = json.loads(args.params)
    if args.src:
        side_by_side(args, params)
        return
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
