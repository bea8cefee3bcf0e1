"""The tail bound through a real gateway and two real simulated engines on 127.0.0.1.

One engine is slowed (fault ``slow``) so that its first tokens come seconds after the fleetgate policy's
estimate expects them; with ``tail_bound_s`` set, the policy sets that replica aside while its oldest
unanswered streamed request is overdue, and ``/metrics`` counts the replicas it set aside. Every request is
answered, the slow replica's included."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx

MODEL = "sim-model"


def _metric(text: str, name: str) -> float:
    m = re.search(rf'^{name}{{deployment="{MODEL}"}} ([0-9.e+-]+)$', text, re.M)
    assert m is not None, f"{name} missing from /metrics"
    return float(m.group(1))


async def _stream(client: httpx.AsyncClient, url: str, k: int) -> str:
    text = f"request {k}: " + " ".join(f"w{k}x{i}" for i in range(60))
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 2, "stream": True}
    out = []
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            out.append(line)
    assert out and "data: [DONE]" in out
    return "\n".join(out)


def test_tail_bound_sets_a_late_replica_aside_and_counts_it(
    start_engine: Any, start_gateway: Any, tools: Any
) -> None:
    engines = [start_engine(MODEL, wait=False) for _ in range(3)]
    for e in engines:
        e.wait_ready()
    # its first tokens ~1.3 s after dispatch, the others' in ms; three replicas, because the bound is
    # relative to the candidates' median lateness: with two and factor 2 it never acts
    tools.set_fault(engines[0], "slow", 1500.0)
    # The bound alone, on each replica's own learned rate (the defaults before session 10 but the bound):
    # with the default's pooled rates a replica not learned yet counts as the median, and the slow one got
    # 3 of the 10 requests here before the bound set it aside ([3, 4, 3]).
    params: dict[str, object] = {
        "tail_bound_s": 0.3,
        "tail_bound_keep_share": None,
        "learned_rate_noise": 1.0,
        "learned_rate_scale": "seconds",
    }
    gateway = start_gateway({MODEL: engines}, "fleetgate", routing_params=params)
    url = gateway.wait_ready()
    metrics = httpx.get(url + "/metrics", timeout=5).text
    assert _metric(metrics, "fleetgate_tail_bound_dropped_total") == 0

    async def staggered() -> list[str]:
        async with httpx.AsyncClient(timeout=120) as client:
            tasks = []
            for k in range(10):
                tasks.append(asyncio.create_task(_stream(client, url, k)))
                await asyncio.sleep(0.25)
            return await asyncio.gather(*tasks)

    streams = asyncio.run(staggered())
    assert len(streams) == 10
    metrics = httpx.get(url + "/metrics", timeout=5).text
    assert _metric(metrics, "fleetgate_tail_bound_dropped_total") >= 1
    served = [tools.engine_stats(e)["server"] for e in engines]
    received = [s["requests_received"] - s["probes_received"] for s in served]
    assert sum(received) == 10
    assert received[0] < min(received[1:])  # without the bound this replay reads [2, 6, 2]
