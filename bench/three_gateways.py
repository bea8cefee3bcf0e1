"""One gateway vs three in front of the same simulated engines: does routing agree across gateways?

    .venv/bin/python bench/three_gateways.py [--engines 3] [--sessions 24] [--turns 6] [--concurrency 12]

Starts ``--engines`` real ``fleetgate engine sim`` processes, then for 1 and for 3 ``fleetgate serve``
gateways (static replicas: the same engines, the default ``fleetgate`` routing policy) drives agent-like
sessions: each session has its own long system prompt and sends ``--turns`` requests one after another, and
**every request goes to a gateway picked at random** (what a load balancer in front of gateway replicas
does), so a session's turns arrive at different gateways. Prints the engines' prefix-cache hit rate (their
``vllm:prefix_cache_*`` counters: do a session's turns land on the engine that holds its prefix, whichever
gateway routed them?), the spread of requests over the engines (max/mean), and client TTFT p50/p95; the
3-gateway row is also given relative to the 1-gateway row (same run, same machine).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import yaml

from fleetgate.providers.local import free_port

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(r"ready on (http://\S+)")


def _start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        match = READY.search(line)
        if match:
            # keep reading its output so that a full pipe never blocks it
            threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True).start()
            return proc, match.group(1).rstrip("/")
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError(f"{args} did not start")


async def _counters(session: aiohttp.ClientSession, engines: list[str]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"hits": [], "queries": [], "requests": []}
    for url in engines:
        async with session.get(url + "/metrics") as r:
            text = await r.text()
        for key, name in (("hits", "vllm:prefix_cache_hits"), ("queries", "vllm:prefix_cache_queries"),
                          ("requests", "vllm:request_success")):  # fmt: skip
            pattern = rf"^{name}(?:_total)?(?:{{[^}}]*}})? (\S+)$"
            total = sum(float(m) for m in re.findall(pattern, text, re.M))
            out[key].append(total)
    return out


async def _drive(gateways: list[str], engines: list[str], args: argparse.Namespace) -> dict[str, float]:
    rng = random.Random(args.seed)
    words = [f"w{i}" for i in range(500)]
    systems = [" ".join(rng.choice(words) for _ in range(args.system_words)) for _ in range(args.sessions)]
    ttfts: list[float] = []
    sem = asyncio.Semaphore(args.concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        before = await _counters(s, engines)

        async def session_run(i: int) -> None:
            history = [{"role": "system", "content": systems[i]}]
            for turn in range(args.turns):
                history.append({"role": "user", "content": f"turn {turn}: " + " ".join(rng.sample(words, 8))})
                body = {"model": "m", "messages": history, "max_tokens": args.max_tokens, "stream": True}
                async with sem:
                    gw = rng.choice(gateways)
                    t0 = time.monotonic()
                    first = None
                    async with s.post(gw + "/v1/chat/completions", json=body) as r:
                        assert r.status == 200, await r.text()
                        async for _chunk in r.content.iter_any():
                            if first is None:
                                first = time.monotonic() - t0
                    ttfts.append(first or 0.0)
                history.append({"role": "assistant", "content": "ok " * args.max_tokens})

        await asyncio.gather(*(session_run(i) for i in range(args.sessions)))
        after = await _counters(s, engines)
    hits = sum(after["hits"]) - sum(before["hits"])
    queries = sum(after["queries"]) - sum(before["queries"])
    per_engine = [a - b for a, b in zip(after["requests"], before["requests"], strict=True)]
    ttfts.sort()
    mean = sum(per_engine) / len(per_engine) if per_engine else 0.0
    return {
        "hit_rate": hits / queries if queries else 0.0,
        "max_over_mean": max(per_engine) / mean if mean else 0.0,
        "ttft_p50": ttfts[len(ttfts) // 2],
        "ttft_p95": ttfts[int(len(ttfts) * 0.95)],
        "requests": float(len(ttfts)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=24)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=12)
    ap.add_argument("--system-words", type=int, default=600)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--time-scale", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    py = sys.executable
    procs: list[subprocess.Popen[str]] = []
    try:
        engines = []
        for _ in range(args.engines):
            cmd = [py, "-m", "fleetgate.cli", "engine", "sim", "--port", "0", "--model", "m",
                   "--time-scale", str(args.time_scale)]  # fmt: skip
            proc, url = _start(cmd)
            procs.append(proc)
            engines.append(url)
        rows = []
        for n in (1, 3):
            gateways, mine = [], []
            for i in range(n):
                cfg = ROOT / f".three_gateways_{i}.yaml"
                replicas = [{"name": f"e{k}", "url": u} for k, u in enumerate(engines)]
                cfg.write_text(yaml.safe_dump({
                    "gateway": {"port": free_port()}, "ops": {"access_log": False},
                    "deployments": [{"model": "m", "engine": "sim", "replicas": replicas}],
                }))  # fmt: skip
                proc, url = _start([py, "-m", "fleetgate.cli", "serve", "--config", str(cfg)])
                cfg.unlink()
                mine.append(proc)
                gateways.append(url)
            try:
                rows.append((n, asyncio.run(_drive(gateways, engines, args))))
            finally:
                for proc in mine:
                    proc.terminate()
                    proc.wait(30)
        print("| gateways | requests | prefix-cache hit rate | requests max/mean | TTFT p50 s | p95 s |")
        print("|---|---|---|---|---|---|")
        for n, r in rows:
            print(f"| {n} | {r['requests']:.0f} | {r['hit_rate']:.3f} | {r['max_over_mean']:.2f} | "
                  f"{r['ttft_p50']:.3f} | {r['ttft_p95']:.3f} |")  # fmt: skip
        one, three = rows[0][1], rows[1][1]
        print(f"3 / 1 gateways: hit rate {three['hit_rate'] / max(one['hit_rate'], 1e-9):.2f}x, "
              f"TTFT p95 {three['ttft_p95'] / max(one['ttft_p95'], 1e-9):.2f}x")  # fmt: skip
    finally:
        for proc in procs:
            proc.kill()


if __name__ == "__main__":
    main()
