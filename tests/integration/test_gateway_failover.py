"""Mid-stream failover with real simulated engines: a stream whose replica crashes or stalls after the first
byte is continued on another replica, and the client sees one stream with the text and usage of an unbroken
run (the simulated engine's text is a deterministic function of the prompt and the tokens before it)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

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


async def _engine_counts(client: httpx.AsyncClient, url: str) -> tuple[float, float]:
    """(requests running, generation tokens so far) from a simulated engine's /metrics."""
    running = generated = 0.0
    for line in (await client.get(url + "/metrics")).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name == "vllm:num_requests_running":
            running += float(line.rsplit(" ", 1)[1])
        elif name == "vllm:generation_tokens_total":
            generated += float(line.rsplit(" ", 1)[1])
    return running, generated


async def _until_streaming(urls: list[str], each: int, timeout_s: float = 30.0) -> None:
    """Wait until every engine runs ``each`` of the streams and has generated tokens for them (>= 2 each since
    the call), so a fault injected next breaks streams after their first bytes: a fixed sleep was too short on
    a loaded machine (the streams had not started, so the faults were met before the first byte and retried,
    not continued: 0 continuations in a parallel run)."""
    async with httpx.AsyncClient(timeout=5) as client:
        base = [(await _engine_counts(client, u))[1] for u in urls]
        deadline = time.monotonic() + timeout_s
        while True:
            counts = [await _engine_counts(client, u) for u in urls]
            if all(r >= each and g - b >= 2 * each for (r, g), b in zip(counts, base, strict=True)):
                return
            assert time.monotonic() < deadline, f"streams not running on every engine: {counts}"
            await asyncio.sleep(0.05)


#: How much slower the simulated engines run while a test's requests start (``slow`` fault): a 200-token
#: answer lasts ~0.9 s at full speed, so on a loaded CI machine (load 10-16) a fault injected after polling
#: the engines could land before the gateway had any byte of it, or after it ended (CI: 0 of 2 continued).
#: At 20x a token takes ~90 ms: the answers are still near their start when the fault lands.
SLOW = 20


async def _set_fault(client: httpx.AsyncClient, url: str, kind: str, value: float | None = None) -> None:
    body: dict[str, Any] = {"kind": kind} if value is None else {"kind": kind, "value": value}
    r = await client.post(url + "/admin/fault", json=body)
    assert r.status_code == 200, r.text


async def _engine_stats(client: httpx.AsyncClient, url: str) -> tuple[int, int]:
    """(requests in the engine's running batch, tokens it generated so far): its own ``/admin/stats``."""
    engine = (await client.get(url + "/admin/stats")).json()["engine"]
    return int(engine["num_running"]), int(engine["generation_tokens"])


async def _until_generating(urls: list[str], each: int, tokens: int = 5, timeout_s: float = 60.0) -> None:
    """Wait until every engine runs ``each`` requests in its batch, then until each of those requests has
    had ``tokens`` more (``each * tokens`` more on the engine's own count: one per running request per
    step), so every first token was sent some steps ago and has reached the gateway. Meant for engines
    slowed by ``SLOW`` (then the wait ends well before the answers do)."""
    async with httpx.AsyncClient(timeout=10) as client:
        deadline = time.monotonic() + timeout_s
        start: dict[str, int] = {}  # engine -> its token count when it first ran ``each``
        done: set[str] = set()
        while len(done) < len(urls):
            assert time.monotonic() < deadline, f"requests not running on every engine: {start}, {done}"
            await asyncio.sleep(0.05)
            for u in set(urls) - done:
                running, generated = await _engine_stats(client, u)
                if u not in start:
                    if running >= each:
                        start[u] = generated
                elif generated - start[u] >= each * tokens:
                    done.add(u)


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
        await _until_streaming([e.url for e in engines], each=10)  # round robin: 10 streams on each
        async with httpx.AsyncClient(timeout=5) as c:
            stalled = await c.post(engines[1].url + "/admin/fault", json={"kind": "stall", "value": 0})
            assert stalled.status_code == 200, stalled.text
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


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_contract_refuses_what_cannot_continue_exactly(start_engine: Any, start_gateway: Any) -> None:
    """Tool calls in progress, response_format, n > 1 and logprobs end with one clean SSE error event (as
    without failover); a plain stream whose client did not ask for usage gets none after a continuation."""
    engines = [start_engine(MODEL, "--fault", "stall=3", wait=False) for _ in range(2)]
    for e in engines:
        e.wait_ready()
    gateway = start_gateway({MODEL: engines}, stream_idle_timeout_s=0.5)
    base = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Weather?"}],
        "max_tokens": 30,
        "stream": True,
    }
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    cases = {
        "tool_calls": {"tools": [tool], "tool_choice": "required"},
        "guided_decoding": {"response_format": {"type": "json_object"}},
        "n": {"n": 2},
        "logprobs": {"logprobs": True, "top_logprobs": 2},
    }
    for reason, extra in cases.items():
        r = httpx.post(gateway.url + "/v1/chat/completions", json={**base, **extra}, timeout=20)
        assert r.status_code == 200, r.text
        events = parse_all(r.content)
        assert events[-1].data.startswith('{"error":'), (reason, r.text[-500:])
        assert sum("error" in e.data for e in events) == 1
        metrics = httpx.get(gateway.url + "/metrics").text
        assert _metric(metrics, "fleetgate_stream_continuation_refusals_total", reason=reason) == 1, reason
    # both replicas stall: a plain stream is continued once, stalls again, and no third replica exists
    r = httpx.post(gateway.url + "/v1/chat/completions", json=base, timeout=20)
    events = parse_all(r.content)
    assert events[-1].data.startswith('{"error":') and "usage" not in r.text
    metrics = httpx.get(gateway.url + "/metrics").text
    assert _metric(metrics, "fleetgate_stream_continuation_refusals_total", reason="no_replica") == 1
    assert _metric(metrics, "fleetgate_stream_continuations_total", outcome="failed") == 1


def test_failover_overhead_in_capacity_ledger_and_tenant_charged_client_usage(
    start_engine: Any, tools: Any, tmp_path: Path
) -> None:
    crashing = start_engine(MODEL, time_scale="1.0", wait=False)
    good = start_engine(MODEL, time_scale="1.0", wait=False)
    for e in (crashing, good):
        e.wait_ready()
    cfg = {
        "gateway": {"host": "127.0.0.1", "port": 0, "stream_idle_timeout_s": 1.0},
        "deployments": [
            {
                "model": MODEL,
                "routing": {"policy": "round_robin"},
                "replicas": [{"name": "r0", "url": crashing.url}, {"name": "r1", "url": good.url}],
            }
        ],
        "tenants": [{"name": "gold", "api_keys": ["sk-gold-test"], "reserved_mu_per_min": {MODEL: 10_000}}],
        "admission": {"admin_api_keys": ["sk-admin-test"]},
    }
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    gateway = tools.ServerProcess(
        [tools.PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], name="gw"
    )
    try:
        url = gateway.wait_ready()
        auth = {"Authorization": "Bearer sk-gold-test"}
        admin = {"Authorization": "Bearer sk-admin-test"}

        async def run() -> list[dict[str, Any]]:
            async with httpx.AsyncClient(base_url=url, timeout=60, headers=auth) as client:
                tasks = [
                    asyncio.create_task(client.post("/v1/chat/completions", json=_body(i))) for i in range(4)
                ]
                await _until_streaming([crashing.url, good.url], each=2)  # round robin: 2 streams on each
                async with httpx.AsyncClient(timeout=5) as c:
                    try:
                        await c.post(crashing.url + "/admin/fault", json={"kind": "crash", "value": 0.01})
                    except httpx.HTTPError:
                        pass
                return [_read((await t).content) for t in tasks]

        results = asyncio.run(run())
        assert all(not r["errors"] and r["done"] and r["finish"] == "length" for r in results)
        usage = [r["usage"] for r in results]
        assert all(u["completion_tokens"] == TOKENS for u in usage)
        metrics = httpx.get(url + "/metrics", headers=admin).text
        assert _metric(metrics, "fleetgate_stream_continuations_total", outcome="ok") == 2
        overhead = _metric(metrics, "fleetgate_failover_overhead_mu_total")
        assert overhead > 0
        cap = httpx.get(url + "/admin/capacity", headers=admin).json()["deployments"]
        (dep,) = [d for d in cap if d["deployment"] == MODEL]
        assert dep["failover_overhead_mu"] == pytest.approx(overhead)
        # the tenant is charged the client-visible usage (its prompt once, every token once), not the fleet's
        totals = httpx.get(url + "/admin/usage/gold", headers=admin).json()["usage"]
        assert totals["completion_tokens"] == 4 * TOKENS
        assert totals["prompt_tokens"] == sum(u["prompt_tokens"] for u in usage)
    finally:
        gateway.kill()


def test_non_stream_request_continued_mid_generation_with_failover_non_stream(
    start_engine: Any, start_gateway: Any
) -> None:
    """``failover.non_stream``: a plain non-streamed request is streamed from the engine; its replica crashes
    mid-generation, another continues, and the client gets one JSON answer equal to the unbroken one."""
    engines = [start_engine(MODEL, time_scale="1.0", wait=False) for _ in range(2)]
    for e in engines:
        e.wait_ready()
    gateway = start_gateway(
        {MODEL: engines},
        policy="round_robin",
        deployment={"failover": {"non_stream": True, "timeout_s": 2.0}},
        stream_idle_timeout_s=1.0,
    )
    bodies = [{**_body(i), "stream": False} for i in range(4)]
    for b in bodies:
        b.pop("stream_options")

    async def run(crash: bool) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
            if crash:  # the engines run SLOW times slower until the crash (see SLOW)
                async with httpx.AsyncClient(timeout=10) as c:
                    for e in engines:
                        await _set_fault(c, e.url, "slow", SLOW)
            tasks = [asyncio.create_task(client.post("/v1/chat/completions", json=b)) for b in bodies]
            if crash:
                await _until_generating([e.url for e in engines], each=2)  # round robin: 2 on each
                async with httpx.AsyncClient(timeout=10) as c:
                    try:
                        await c.post(engines[0].url + "/admin/fault", json={"kind": "crash", "value": 0.01})
                    except httpx.HTTPError:
                        pass
                    await _set_fault(c, engines[1].url, "none")  # the continuations run at full speed
            out = []
            for t in tasks:
                r = await t
                assert r.status_code == 200, r.text
                out.append(r.json())
            return out

    healthy = asyncio.run(run(crash=False))
    broken = asyncio.run(run(crash=True))
    for ref, got in zip(healthy, broken, strict=True):
        assert got["object"] == "chat.completion"
        assert got["choices"][0]["message"]["content"] == ref["choices"][0]["message"]["content"]
        assert got["choices"][0]["finish_reason"] == "length"
        assert _same_usage(got["usage"], ref["usage"]) and got["usage"]["completion_tokens"] == TOKENS
    metrics = httpx.get(gateway.url + "/metrics").text
    assert _metric(metrics, "fleetgate_interrupted_streams_total", outcome="continued") == 2
