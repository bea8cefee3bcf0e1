"""Mid-stream failover with real simulated engines: a stream whose replica crashes or stalls after the first
byte is continued on another replica, and the client sees one stream with the text and usage of an unbroken
run (the simulated engine's text is a deterministic function of the prompt and the tokens before it)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import orjson

from fleetgate.core.sse import DONE_DATA, parse_all

MODEL = "sim-model"
TOKENS = 200


def _body(i: int, tokens: int = TOKENS) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Story number {i}: tell me about rivers and towns."}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _read(raw: bytes) -> dict[str, Any]:
    """What the client saw: text, usage, ids, errors, chunk count and whether [DONE] ended it."""
    events = parse_all(raw)
    text: list[str] = []
    out: dict[str, Any] = {"errors": [], "ids": set(), "created": set(), "models": set(), "roles": 0}
    out["done"] = bool(events) and events[-1].data == DONE_DATA
    out["dones"] = sum(e.data == DONE_DATA for e in events)
    out["usage"] = None
    out["finish"] = None
    for e in events:
        if e.data == DONE_DATA:
            continue
        obj = orjson.loads(e.data)
        if "error" in obj:
            out["errors"].append(obj["error"])
            continue
        out["ids"].add(obj["id"])
        out["created"].add(obj["created"])
        out["models"].add(obj["model"])
        if obj.get("usage"):
            out["usage"] = obj["usage"]
        for choice in obj.get("choices") or ():
            assert choice["index"] == 0
            delta = choice["delta"]
            out["roles"] += "role" in delta
            text.append(delta.get("content") or "")
            if choice.get("finish_reason"):
                out["finish"] = choice["finish_reason"]
    out["text"] = "".join(text)
    return out


async def _run(url: str, n: int, tokens: int = TOKENS) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def one(i: int) -> dict[str, Any]:
            r = await client.post("/v1/chat/completions", json=_body(i, tokens))
            assert r.status_code == 200, r.text
            return _read(r.content)

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_crash_and_stall_mid_stream_are_continued_transparently(
    start_engine: Any, start_gateway: Any, tools: Any
) -> None:
    engines = [start_engine(MODEL, time_scale="1.0", wait=False) for _ in range(3)]
    for e in engines:
        e.wait_ready()
    gateway = start_gateway(
        {MODEL: engines},
        policy="round_robin",
        deployment={"failover": {"timeout_s": 2.0}},
        stream_idle_timeout_s=1.0,
        connect_timeout_s=0.5,
    )
    t0 = time.monotonic()
    healthy = asyncio.run(_run(gateway.url, 30))
    print(f"healthy run {time.monotonic() - t0:.2f} s")
    assert all(not r["errors"] and r["done"] for r in healthy)

    async def faulty() -> list[dict[str, Any]]:
        run = asyncio.create_task(_run(gateway.url, 30))
        await asyncio.sleep(0.4)  # every stream has started and sent some tokens
        async with httpx.AsyncClient(timeout=5) as c:
            await c.post(engines[1].url + "/admin/fault", json={"kind": "stall", "value": 0})
            try:
                await c.post(engines[0].url + "/admin/fault", json={"kind": "crash", "value": 0.05})
            except httpx.HTTPError:
                pass
        return await run

    t0 = time.monotonic()
    broken = asyncio.run(faulty())
    wall = time.monotonic() - t0
    assert engines[0].proc.wait(10) != 0  # it really crashed
    metrics = httpx.get(gateway.url + "/metrics").text
    continued = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("fleetgate_stream_continuations_total{") and 'outcome="ok"' in line
    )
    print(f"wall {wall:.2f} s, continuations {continued}")
    assert continued >= 10  # a third of the streams were on each faulty replica
    for ref, got in zip(healthy, broken, strict=True):
        assert got["errors"] == []
        assert got["done"] and got["dones"] == 1
        assert got["text"] == ref["text"]
        assert got["usage"] == ref["usage"] or _same_usage(got["usage"], ref["usage"])
        assert got["finish"] == "length"
        assert len(got["ids"]) == 1 and len(got["created"]) == 1 and got["models"] == {MODEL}
        assert got["roles"] == 1
    assert "fleetgate_stream_resume_seconds_count" in metrics
    assert "fleetgate_failover_overhead_mu_total" in metrics


def _same_usage(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("prompt_tokens", "completion_tokens", "total_tokens")
    return all(a[k] == b[k] for k in keys)
