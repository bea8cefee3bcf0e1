"""Open-loop load at a fixed request rate (what wrk cannot do): latency p50/p99 of full streamed responses.

Used by bench/gateway_overhead.sh for "p99 at 500 req/s". Arrivals are evenly spaced so the offered load does
not depend on how fast responses come back (no coordinated omission).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp

BODY = {
    "model": "bench",
    "messages": [{"role": "user", "content": "Say hello"}],
    "max_tokens": 2,
    "stream": True,
    "stream_options": {"include_usage": True},
}


async def _one(session: aiohttp.ClientSession, url: str, latencies: list[float], errors: list[int]) -> None:
    start = time.perf_counter()
    try:
        async with session.post(url, json=BODY, headers={"Authorization": "Bearer sk-bench"}) as resp:
            await resp.read()
            if resp.status != 200:
                errors.append(resp.status)
                return
    except aiohttp.ClientError:
        errors.append(0)
        return
    latencies.append(time.perf_counter() - start)


async def run(url: str, rate: float, seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    errors: list[int] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = []
        start = time.perf_counter()
        n = int(rate * seconds)
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(session, url, latencies, errors)))
        await asyncio.gather(*tasks)
    latencies.sort()

    def pct(p: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else float("nan")
        )

    return {"sent": n, "ok": len(latencies), "errors": len(errors), "p50_ms": pct(0.5), "p99_ms": pct(0.99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.url, args.rate, args.seconds))))


if __name__ == "__main__":
    main()
