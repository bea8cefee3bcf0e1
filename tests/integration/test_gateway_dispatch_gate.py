"""The dispatch gate through a real gateway and two real simulated engines on 127.0.0.1.

The engines are slowed (fault ``slow``) so that a prompt's prefill takes about a second, and the fleetgate
policy is told a prefill rate (100 tokens/s) a few times slower still: every replica is busy after one
request each, the next requests are held at the gateway and released as the estimated backlog drains
(corrected by first-token feedback, bounded by the max-wait valve). Every request is answered; a client
that leaves while held is dropped from the queue without reaching any engine."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx

MODEL = "sim-model"


def _metric(text: str, name: str) -> float:
    m = re.search(rf'^{name}{{deployment="{MODEL}"}} ([0-9.e+-]+)$', text, re.M)
    assert m is not None, f"{name} missing from /metrics"
    return float(m.group(1))


def test_held_requests_are_all_served_and_a_leaving_client_is_dropped(
    start_engine: Any, start_gateway: Any, tools: Any
) -> None:
    engines = [start_engine(MODEL, wait=False) for _ in range(2)]
    for e in engines:
        e.wait_ready()
    for e in engines:  # engines slow enough that a prompt's prefill takes about a second
        tools.set_fault(e, "slow", 1000.0)
    params = {"prefill_tokens_per_s": 100.0, "gate_max_wait_s": 8.0}
    gateway = start_gateway({MODEL: engines}, "fleetgate", routing_params=params)
    url = gateway.wait_ready()

    def body(k: int, words: int) -> dict[str, Any]:
        text = f"request {k}: " + " ".join(f"w{k}x{i}" for i in range(words))
        return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            # ~1-2 s of estimated prefill each: two fill the replicas, the other four are held
            sizes = [150, 150, 200, 40, 120, 60]
            return await asyncio.gather(
                *(client.post(url + "/v1/chat/completions", json=body(k, n)) for k, n in enumerate(sizes))
            )

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 6
    assert all(r.json()["usage"]["completion_tokens"] == 4 for r in responses)
    metrics = httpx.get(url + "/metrics", timeout=5).text
    assert _metric(metrics, "fleetgate_gate_held_total") >= 3
    assert _metric(metrics, "fleetgate_gate_waiting_requests") == 0

    async def leave_while_held() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            chat = url + "/v1/chat/completions"
            busy = [asyncio.create_task(client.post(chat, json=body(100 + k, 300))) for k in range(2)]
            await asyncio.sleep(0.3)
            try:
                await client.post(url + "/v1/chat/completions", json=body(200, 20), timeout=0.5)
                raise AssertionError("the held request should still be waiting")
            except httpx.TimeoutException:
                pass
            for r in await asyncio.gather(*busy):
                assert r.status_code == 200

    def served() -> int:  # requests the engines received, the gateway's health probes aside
        stats = [tools.engine_stats(e)["server"] for e in engines]
        return sum(s["requests_received"] - s["probes_received"] for s in stats)

    before = served()
    asyncio.run(leave_while_held())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        metrics = httpx.get(url + "/metrics", timeout=5).text
        if _metric(metrics, "fleetgate_gate_waiting_requests") == 0:
            break
        time.sleep(0.1)
    assert _metric(metrics, "fleetgate_gate_waiting_requests") == 0
    after = served()
    assert after - before == 2  # the request whose client left never reached an engine
    # and the gateway still serves
    for e in engines:
        tools.set_fault(e, "none")
    r = httpx.post(url + "/v1/chat/completions", json=body(300, 5), timeout=30)
    assert r.status_code == 200
