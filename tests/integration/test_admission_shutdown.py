"""The admission store is the composition root's to open and close: ``build_gateway`` registers the
``AdmissionService`` it built as the server's first service (``start``: the store check; ``aclose``: queued
requests answered, the store closed), so it stops last, after every request settled and every loop that
uses the store stopped. On a real Redis (FLEETGATE_TEST_REDIS_URL): the gateway's connections are gone from
the server's ``CLIENT LIST`` once the gateway stopped (in process, before it exits), and a ``fleetgate serve``
process told SIGTERM exits 0 with no ``Unclosed`` warning (Python's development mode shows them).
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
import yaml

from fleetgate.config import parse_config
from fleetgate.runtime import build_gateway

REDIS_URL = os.environ.get("FLEETGATE_TEST_REDIS_URL")
pytestmark = [
    pytest.mark.skipif(not REDIS_URL, reason="FLEETGATE_TEST_REDIS_URL not set (scripts/test.sh starts one)"),
    pytest.mark.timeout(90),
]


def _config(engine_url: str) -> dict[str, Any]:
    return {
        "gateway": {"host": "127.0.0.1", "port": 0},
        "deployments": [{"model": "sim-model", "replicas": [{"name": "e0", "url": engine_url}]}],
        "tenants": [{"name": "gold", "api_keys": ["sk-gold"], "reserved_mu_per_min": {"sim-model": 50}}],
        "admission": {
            "admin_api_keys": ["sk-admin"],
            "store": {"kind": "redis", "url": REDIS_URL, "namespace": f"t{uuid.uuid4().hex}"},
        },
        "ops": {"access_log": False},
    }


async def _others(checker: Any) -> int:
    """Connections to this test's Redis database other than the checker's own."""
    db = checker.connection_pool.connection_kwargs.get("db", 0)
    me = await checker.client_id()
    return sum(1 for c in await checker.client_list() if int(c["db"]) == db and int(c["id"]) != me)


async def test_stopping_the_gateway_closes_its_redis_connections(start_engine: Any) -> None:
    engine = start_engine("sim-model")
    checker = aioredis.from_url(REDIS_URL)
    try:
        before = await _others(checker)
        gateway = build_gateway(parse_config(_config(engine.url)))
        url = await gateway.server.start(port=0)
        async with httpx.AsyncClient() as client:
            body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            r = await client.post(
                f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-gold"}
            )
            assert r.status_code == 200, r.text
        assert await _others(checker) > before  # the admission store (and its loops) hold connections
        await gateway.stop(5.0)
        for _ in range(40):  # the server notices a closed socket within a moment
            if await _others(checker) == before:
                break
            await asyncio.sleep(0.05)
        assert await _others(checker) == before
    finally:
        await checker.aclose()


def test_serve_closes_the_store_on_sigterm_without_unclosed_warnings(
    tools: Any, start_engine: Any, tmp_path: Path
) -> None:
    engine = start_engine("sim-model")
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(_config(engine.url)))
    gw = tools.ServerProcess(
        [tools.PY, "-X", "dev", "-m", "fleetgate.cli", "serve", "--config", str(path)],
        name="gw-term",
        env={"PYTHONWARNINGS": "always"},
    )
    try:
        url = gw.wait_ready(60)
        with httpx.Client() as client:
            body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            r = client.post(
                f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-gold"}
            )
            assert r.status_code == 200, r.text
        gw.signal(signal.SIGTERM)
        assert gw.wait(30) == 0, gw.output[-3000:]
        gw._reader.join(5)
        assert not [ln for ln in gw.lines if "Unclosed" in ln or "ResourceWarning" in ln], gw.output[-3000:]
    finally:
        gw.kill()
