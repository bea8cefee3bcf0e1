"""Soak: the gateway at a steady share (default 80%) of its measured capacity for a long time, with its RSS
and open file descriptors sampled; after warm-up neither may trend upwards.

    .venv/bin/python bench/soak.py --duration-s 1800          # the 30-minute run (`make soak`)
    .venv/bin/python bench/soak.py --duration-s 300           # a 5-minute run

Set-up: simulated engines (time scale 0.01) behind one ``fleetgate serve`` with two tenants and the Redis
admission store (a private redis-server; memory store when redis-server is not installed). First a short
closed-loop calibration finds the fleet's throughput (requests/s answered 200), then the load generator
paces requests at ``--load`` times that. Every request goes through the chaos ledger (tests/chaos), so the
soak also checks that nothing was lost, mixed or truncated. Results: a JSON file and a one-line summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "chaos"))

import chaos_ledger as cl  # noqa: E402


def proc_sample(pid: int) -> tuple[float, int]:
    """(RSS in MiB, open file descriptors) of ``pid`` from /proc."""
    rss_kib = 0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
                break
    return rss_kib / 1024.0, len(os.listdir(f"/proc/{pid}/fd"))


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    if sxx == 0:
        return 0.0
    return 60.0 * sum((t - mx) * (v - my) for t, v in points) / sxx


async def sampler(
    pid: int, every_s: float, out: list[dict[str, float]], t0: float, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        try:
            rss, fds = proc_sample(pid)
        except OSError:
            break
        out.append({"t_s": round(time.monotonic() - t0, 2), "rss_mib": round(rss, 2), "fds": fds})
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass


async def calibrate(url: str, seconds: float, workers: int) -> float:
    """Closed-loop throughput (200s per second) with ``workers`` concurrent clients."""
    load = cl.LoadGen(cl.Front([url]), total=10**9, workers=workers, deadline_s=30, capped_share=0.0)
    task = asyncio.create_task(load.run())
    await asyncio.sleep(2.0)  # warm connections and caches
    start_ok = sum(1 for e in load.ledger if e.outcome == "ok")
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    ok = sum(1 for e in load.ledger if e.outcome == "ok") - start_ok
    rate = ok / (time.monotonic() - t0)
    load.total = load.sent  # stop issuing; let in-flight finish
    await task
    return rate


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    redis: cl.Redis | None = None
    try:
        redis = cl.Redis()
        redis_url = redis.url
    except RuntimeError:
        redis_url = ""
    engines: list[cl.Engine] = []
    gateway: cl.Gateway | None = None
    try:
        engines = [cl.Engine(i, args.time_scale) for i in range(args.engines)]
        cfg_path = cl.gateway_config(work / "soak.yaml", engines, redis_url or "redis://127.0.0.1:1/0",
                                     capped_rpm=args.capped_rpm)  # fmt: skip
        if not redis_url:
            cfg = yaml.safe_load(cfg_path.read_text())
            cfg["admission"]["store"] = {"kind": "memory"}
            cfg_path.write_text(yaml.safe_dump(cfg))
        gateway = cl.Gateway(cfg_path, "soak-gateway")
        capacity = await calibrate(gateway.url, args.calibrate_s, args.workers)
        rate = capacity * args.load
        total = int(rate * args.duration_s)
        print(f"capacity {capacity:.1f} req/s; soaking at {rate:.1f} req/s for {args.duration_s:.0f} s "
              f"({total} requests)", flush=True)  # fmt: skip
        samples: list[dict[str, float]] = []
        stop = asyncio.Event()
        t0 = time.monotonic()
        task = asyncio.create_task(sampler(gateway.proc.pid, args.sample_s, samples, t0, stop))
        load = cl.LoadGen(
            cl.Front([gateway.url]),
            total=total,
            workers=args.workers,
            deadline_s=60,
            rate=rate,
            capped_share=0.0,
        )

        async def stop_sending_at_duration() -> None:
            # the pacing falls behind when the box cannot hold the rate: stop at the duration, not the count
            await asyncio.sleep(args.duration_s)
            load.total = min(load.total, load.sent)

        stopper = asyncio.create_task(stop_sending_at_duration())
        await load.run()
        stopper.cancel()
        wall = time.monotonic() - t0
        stop.set()
        await task
        report = cl.check(load.ledger, capped_rpm=args.capped_rpm,
                          capped_concurrency=args.workers, access_logs={})  # fmt: skip
        steady = [s for s in samples if s["t_s"] >= args.warmup_s]
        rss_slope = slope_per_min([(s["t_s"], s["rss_mib"]) for s in steady])
        fd_slope = slope_per_min([(s["t_s"], s["fds"]) for s in steady])
        # bounded structures (e.g. the SLO window's 100,000 samples) grow until full, then stay flat: the
        # last quarter shows whether growth stopped
        last = steady[len(steady) * 3 // 4 :]
        rss_slope_last = slope_per_min([(s["t_s"], s["rss_mib"]) for s in last])
        fd_slope_last = slope_per_min([(s["t_s"], s["fds"]) for s in last])
        rss = [s["rss_mib"] for s in steady] or [0.0]
        fds = [s["fds"] for s in steady] or [0]
        steady_min = max(1e-9, (steady[-1]["t_s"] - steady[0]["t_s"]) / 60.0) if len(steady) > 1 else 1e-9
        # "no growth trend": the fitted growth over the steady part is under 5% of RSS (and 10% of FDs,
        # at least 5 descriptors: connection churn moves the count by a few)
        rss_growth = rss_slope * steady_min
        fd_growth = fd_slope * steady_min
        verdict = rss_growth < 0.05 * rss[0] and fd_growth < max(5.0, 0.1 * fds[0])
        result = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "duration_s": round(wall, 1),
            "load_share": args.load,
            "capacity_req_s": round(capacity, 1),
            "rate_req_s": round(rate, 1),
            # below rate_req_s when the box could not keep the pace (the generator then runs behind schedule,
            # closed-loop with its workers, and the soak lasts longer than duration_s)
            "achieved_req_s": round(report.total / wall, 1) if wall > 0 else 0.0,
            "engines": args.engines,
            "admission_store": "redis" if redis_url else "memory",
            "requests": report.total,
            "ok": report.ok,
            "explicit_errors": report.errors,
            "lost": report.lost,
            "hung": report.hung,
            "mixed": report.duplicated_or_mixed,
            "truncated": report.truncated,
            "warmup_s": args.warmup_s,
            "rss_mib_first_last_max": [rss[0], rss[-1], max(rss)],
            "fds_first_last_max": [fds[0], fds[-1], max(fds)],
            "rss_slope_mib_per_min": round(rss_slope, 4),
            "fd_slope_per_min": round(fd_slope, 4),
            "rss_slope_last_quarter_mib_per_min": round(rss_slope_last, 4),
            "fd_slope_last_quarter_per_min": round(fd_slope_last, 4),
            # what the verdict compares: fitted growth over the steady part vs 5% of RSS, max(5, 10%) of FDs
            "rss_growth_steady_mib": round(rss_growth, 2),
            "fd_growth_steady": round(fd_growth, 1),
            "no_growth_trend": verdict,
            "samples": samples,
            "error_kinds": report.error_kinds,
            "violations": report.violations[:20],
        }
        return result
    finally:
        if gateway is not None:
            gateway.kill()
        for e in engines:
            e.kill()
        if redis is not None:
            redis.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=1800.0)
    ap.add_argument("--load", type=float, default=0.8, help="share of the measured capacity")
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--time-scale", type=float, default=0.01)
    ap.add_argument("--calibrate-s", type=float, default=15.0)
    ap.add_argument("--warmup-s", type=float, default=60.0)
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--capped-rpm", type=float, default=600.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "soak.json")
    args = ap.parse_args()
    result = asyncio.run(soak(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    brief = {k: v for k, v in result.items() if k not in ("samples", "violations")}
    print(json.dumps(brief))
    ok = (
        result["no_growth_trend"]
        and result["lost"] == 0
        and result["mixed"] == 0
        and result["truncated"] == 0
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
