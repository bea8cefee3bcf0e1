"""Engine usage is not trusted without bounds (issue 22, finding 8).

A misbehaving engine (a stand-in on 127.0.0.1: no real engine can be made to lie about its token counts)
reports a billion completion tokens, or negative counts. The gateway must settle only what the request could
have produced (``max_tokens``, the deployment's context length, what was streamed), count the anomaly in
``fleetgate_usage_anomalies``, never answer 500 nor book negative totals, and tell the tenant the real wait.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from prometheus_client import generate_latest

from aiohttp_site import serve_app
from fleetgate.admission.service import AdmissionService
from fleetgate.config import parse_config
from fleetgate.core.types import Usage
from fleetgate.core.units import DEFAULT_PROFILE
from fleetgate.runtime import build_gateway

MODEL = "m"
CONTEXT = 4096


@pytest.fixture
async def lying_engine() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Answers every request with three output tokens, and reports ``lie`` as its usage."""
    lie: dict[str, Any] = {"prompt_tokens": 10, "completion_tokens": 10**9}

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        usage = {**lie, "total_tokens": lie["prompt_tokens"] + lie["completion_tokens"]}
        if not body.get("stream"):
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": "a b c"},
                "finish_reason": "stop",
            }
            return web.json_response(
                {"id": "x", "object": "chat.completion", "model": MODEL, "choices": [choice], "usage": usage}
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("a", " b", " c"):
            delta = {"index": 0, "delta": {"content": word}, "finish_reason": None}
            chunk = {"id": "x", "object": "chat.completion.chunk", "model": MODEL, "choices": [delta]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        chunk = {"id": "x", "object": "chat.completion.chunk", "model": MODEL, "choices": [], "usage": usage}
        await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with serve_app(app) as url:
        yield url, lie


def config(engine_url: str) -> dict[str, Any]:
    return {
        "gateway": {"host": "127.0.0.1", "port": 0},
        "deployments": [
            {"model": MODEL, "context_tokens": CONTEXT, "replicas": [{"name": "r0", "url": engine_url}]}
        ],
        "tenants": [
            {"name": "gold", "api_keys": ["sk-gold"], "reserved_mu_per_min": {MODEL: 10**7}},
            {"name": "small", "api_keys": ["sk-small"], "reserved_mu_per_min": {MODEL: 30}},
        ],
        "admission": {"deadline_s": 0},
    }


def anomalies(server: Any, kind: str) -> float:
    text = generate_latest(server.proxy.metrics.registry).decode()
    prefix = f'fleetgate_usage_anomalies_total{{deployment="{MODEL}",kind="{kind}",replica="r0"}} '
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(lines[0].split()[-1]) if lines else 0.0


def chat(max_tokens: int | None = None, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


async def test_reported_usage_is_cut_to_what_the_request_could_produce(
    lying_engine: tuple[str, dict[str, Any]],
) -> None:
    url, lie = lying_engine
    server = build_gateway(parse_config(config(url)))
    await server.start(0)
    admission = server.proxy.admission
    assert isinstance(admission, AdmissionService)
    gold = {"Authorization": "Bearer sk-gold"}
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            r = await client.post("/v1/chat/completions", json=chat(max_tokens=20), headers=gold)
            assert r.status_code == 200
            booked = (await admission.usage("gold"))["usage"]
            assert booked["completion_tokens"] == 20  # max_tokens, not a billion
            assert booked["settled_mu"] == pytest.approx(DEFAULT_PROFILE.settle(Usage(10, 20)))
            assert anomalies(server, "output_over_bound") == 1
            # a stream: no more than its three events could carry, even with a generous max_tokens
            r = await client.post("/v1/chat/completions", json=chat(1000, stream=True), headers=gold)
            assert r.status_code == 200 and "[DONE]" in r.text
            booked = (await admission.usage("gold"))["usage"]
            assert booked["completion_tokens"] == 20 + 3 * 16
            # no max_tokens: the context length bounds it
            r = await client.post("/v1/chat/completions", json=chat(), headers=gold)
            assert r.status_code == 200
            booked = (await admission.usage("gold"))["usage"]
            assert booked["completion_tokens"] == 20 + 3 * 16 + CONTEXT
            # negative counts: no 500 (non-stream or stream), nothing negative booked, counted
            lie.update(prompt_tokens=-5, completion_tokens=-3)
            for stream in (False, True):
                r = await client.post("/v1/chat/completions", json=chat(5, stream=stream), headers=gold)
                assert r.status_code == 200, r.text
            booked = (await admission.usage("gold"))["usage"]
            assert booked["completion_tokens"] == 20 + 3 * 16 + CONTEXT
            assert booked["prompt_tokens"] == 3 * 10 and booked["settled_mu"] > 0
            assert anomalies(server, "negative") == 2
            assert anomalies(server, "output_over_bound") == 3
    finally:
        await server.stop(1.0)


async def test_retry_after_tells_the_real_wait(lying_engine: tuple[str, dict[str, Any]]) -> None:
    url, _lie = lying_engine
    server = build_gateway(parse_config(config(url)))
    await server.start(0)
    small = {"Authorization": "Bearer sk-small"}
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            # no max_tokens and a billion reported: settled at the context length, 41 MU on 30 MU/min
            assert (await client.post("/v1/chat/completions", json=chat(), headers=small)).status_code == 200
            r = await client.post("/v1/chat/completions", json=chat(max_tokens=1), headers=small)
            assert r.status_code == 429
            debt = DEFAULT_PROFILE.settle(Usage(10, CONTEXT))
            wait = debt / (30 / 60)  # about 82 s: honest, not capped at 60
            assert int(r.headers["Retry-After"]) == pytest.approx(math.ceil(wait), abs=2)
            assert float(r.headers["retry-after-ms"]) / 1000 == pytest.approx(wait, abs=2)
    finally:
        await server.stop(1.0)
