"""Admission queue under overload: per-arrival cost and event-loop lag of AdmissionService, in-process.

Best-effort requests (cost 1 MU, several tenants) arrive at ``--rate`` req/s against a deployment whose
best-effort (fleet) meter admits ``--fleet`` MU/s; the deadline is chosen so that about ``--queue`` entries
wait (the service rejects an arrival whose estimated wait ends after its deadline). The queue is prefilled
with ``--queue`` entries, then arrivals run for ``--duration`` seconds while a 10 ms ticker measures how
late the event loop runs it (what any other request, e.g. an admin call, would wait) and an admin
``overview()`` is timed every 0.5 s.

Figures: CPU per arrival (process time / arrivals), ticker lag p50/p99/max, admin call max latency
(from when it was due, so including waiting for the loop), admitted / rejected counts, mean queue length,
and (after the fix) how many full passes over the queue vs single-entry arrival passes ran. Runs with the
memory store and, when a Redis is available (``FLEETGATE_TEST_REDIS_URL`` or a local ``redis-server``),
with the Redis store::

    .venv/bin/python bench/admission_queue.py          # both stores; 300 req/s, ~250 queued
    .venv/bin/python bench/admission_queue.py --store memory --profile   # + cProfile top functions
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import os
import pstats
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from fleetgate.admission.service import AdmissionService
from fleetgate.config import parse_config
from fleetgate.core.errors import FleetgateError
from fleetgate.core.types import Priority, RequestInfo
from fleetgate.stores import AdmissionStore, MemoryStore


def make_service(store: AdmissionStore, tenants: int, fleet_mu_s: float, deadline_s: float) -> Any:
    util = 0.8
    cfg = parse_config(
        {
            "deployments": [
                {
                    "model": "m",
                    "capacity_mu_per_min": fleet_mu_s * 60.0 / util,
                    "replicas": [{"name": "r0", "url": "http://127.0.0.1:1"}],
                }
            ],
            "tenants": [
                {
                    "name": f"be{i}",
                    "api_keys": [f"sk-be{i}"],
                    "priority": "best_effort",
                    "best_effort_mu_per_min": None,
                }
                for i in range(tenants)
            ],
            "admission": {
                "best_effort_max_utilization": util,
                "fleet_burst_s": 0.0,
                "queue_max": 100_000,
                "deadline_s": deadline_s,
            },
        }
    )
    return AdmissionService.from_config(cfg, store=store)


async def run_once(store: AdmissionStore, args: argparse.Namespace) -> dict[str, float]:
    deadline_s = args.queue / args.fleet
    svc = make_service(store, args.tenants, args.fleet, deadline_s)
    await svc.start()
    tenants = [svc.authenticate(f"Bearer sk-be{i}") for i in range(args.tenants)]
    counts = {"admitted": 0, "rejected": 0, "arrivals": 0}
    tasks: set[asyncio.Task[None]] = set()
    seq = iter(range(10**9))

    async def one() -> None:
        i = next(seq)
        req = RequestInfo(
            request_id=f"r{i}", model="m", input_tokens=100, max_output_tokens=100,
            priority=Priority.BEST_EFFORT, cost_mu=1.0,
        )  # fmt: skip
        try:
            await svc.admit(tenants[i % len(tenants)], req)
            counts["admitted"] += 1
        except FleetgateError:
            counts["rejected"] += 1

    def spawn() -> None:
        t = asyncio.get_running_loop().create_task(one())
        tasks.add(t)
        t.add_done_callback(tasks.discard)

    # Drain the fleet meter's burst, then prefill the queue.
    for _ in range(args.queue + int(args.fleet) + 1):
        spawn()
    await asyncio.sleep(0.2)
    counts.update(admitted=0, rejected=0)

    lags: list[float] = []
    admin: list[float] = []
    qlen: list[int] = []
    stop = False

    async def ticker() -> None:
        period = 0.010
        nxt = time.perf_counter() + period
        while not stop:
            await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
            now = time.perf_counter()
            lags.append(max(0.0, now - nxt))
            qlen.append(len(svc.core.queue))
            nxt = max(nxt + period, now)

    async def admin_calls() -> None:
        while not stop:
            due = time.perf_counter() + 0.5
            await asyncio.sleep(0.5)
            await svc.overview()
            admin.append(time.perf_counter() - due)  # includes waiting for the loop, as a client sees it

    tick = asyncio.create_task(ticker())
    adm = asyncio.create_task(admin_calls())
    prof = cProfile.Profile() if args.profile else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if prof:
        prof.enable()
    start = time.perf_counter()
    n = 0
    while (elapsed := time.perf_counter() - start) < args.duration:
        due = int(elapsed * args.rate) + 1
        while n < due:
            spawn()
            n += 1
        await asyncio.sleep(max(0.0, n / args.rate - (time.perf_counter() - start)))
    if prof:
        prof.disable()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    stop = True
    for t in (tick, adm):
        t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await t
    queued_at_end = len(svc.core.queue)
    await svc.aclose()
    if tasks:
        _done, left = await asyncio.wait(set(tasks), timeout=10.0)
        for t in left:  # admits still waiting after aclose (should not happen)
            t.cancel()
        if left:
            print(f"{len(left)} admit calls still pending 10 s after aclose (cancelled)")
            await asyncio.gather(*left, return_exceptions=True)
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
        print(s.getvalue())
    lags.sort()
    return {
        "arrivals": n,
        "achieved_rate": n / wall,
        "cpu_per_arrival_ms": 1000.0 * cpu / max(1, n),
        "cpu_util": cpu / wall,
        "lag_p50_ms": 1000.0 * lags[len(lags) // 2] if lags else float("nan"),
        "lag_p99_ms": 1000.0 * lags[int(len(lags) * 0.99)] if lags else float("nan"),
        "lag_max_ms": 1000.0 * lags[-1] if lags else float("nan"),
        "admin_max_ms": 1000.0 * max(admin) if admin else float("nan"),
        "admitted": counts["admitted"],
        "rejected": counts["rejected"],
        "mean_queue": statistics.fmean(qlen) if qlen else 0.0,
        "queued_at_end": queued_at_end,
        "full_passes": float(getattr(svc.core, "full_passes", float("nan"))),
        "arrival_passes": float(getattr(svc.core, "arrival_passes", float("nan"))),
    }


@contextlib.contextmanager
def redis_url() -> Iterator[str | None]:
    url = os.environ.get("FLEETGATE_TEST_REDIS_URL")
    if url:
        yield url
        return
    exe = shutil.which("redis-server")
    if exe is None:
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen(
            [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", d],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(50):
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    time.sleep(0.1)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", choices=["memory", "redis", "both"], default="both")
    ap.add_argument("--rate", type=float, default=300.0, help="arrivals per second")
    ap.add_argument("--queue", type=int, default=250, help="entries waiting (steady state)")
    ap.add_argument("--fleet", type=float, default=50.0, help="best-effort admissions per second")
    ap.add_argument("--tenants", type=int, default=4)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    results: list[tuple[str, dict[str, float]]] = []
    if args.store in ("memory", "both"):
        results.append(("memory", asyncio.run(run_once(MemoryStore(), args))))
    if args.store in ("redis", "both"):
        with redis_url() as url:
            if url is None:
                print("redis: no FLEETGATE_TEST_REDIS_URL and no redis-server; skipped")
            else:
                from fleetgate.stores.redis import RedisStore

                async def with_redis() -> dict[str, float]:
                    store = RedisStore(url)
                    await store._redis.flushdb()
                    return await run_once(store, args)

                results.append(("redis", asyncio.run(with_redis())))
    print(f"rate={args.rate:g}/s queue~{args.queue} fleet={args.fleet:g} MU/s tenants={args.tenants}")
    for name, r in results:
        print(
            f"{name:7s} arrivals={r['arrivals']:.0f} ({r['achieved_rate']:.0f}/s) "
            f"cpu/arrival={r['cpu_per_arrival_ms']:.3f} ms cpu={100 * r['cpu_util']:.0f}% "
            f"lag p50/p99/max={r['lag_p50_ms']:.1f}/{r['lag_p99_ms']:.1f}/{r['lag_max_ms']:.1f} ms "
            f"admin max={r['admin_max_ms']:.1f} ms admitted={r['admitted']:.0f} "
            f"rejected={r['rejected']:.0f} mean queue={r['mean_queue']:.0f} "
            f"passes full/arrival={r['full_passes']:.0f}/{r['arrival_passes']:.0f}"
        )


if __name__ == "__main__":
    main()
