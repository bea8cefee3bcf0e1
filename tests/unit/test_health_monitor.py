"""HealthMonitor details that need an HTTP peer with specific behaviour: an in-process aiohttp stand-in for
vLLM's answer to ``priority`` without ``--scheduling-policy priority`` (vLLM itself cannot run here; the
probe body follows the engine dialect), and the
``/livez`` routes. The fault suite against real simulated-engine processes is in tests/integration."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from fleetgate.core.health import Remediate
from fleetgate.core.types import HealthState
from fleetgate.engines.dialects import dialect
from fleetgate.health import HealthMonitor, add_livez_routes
from fleetgate.health.monitor import reason_kind
from fleetgate.providers.leader import LeaderOnly


class Engine:
    def __init__(self, accept_priority: bool) -> None:
        self.accept_priority = accept_priority
        self.bodies: list[dict[str, Any]] = []

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        if "priority" in body and not self.accept_priority:
            msg = "Got priority -100 but Priority scheduling is not enabled."
            return web.json_response({"error": {"message": msg, "type": "BadRequestError"}}, status=400)
        return web.json_response({"choices": [{"text": "o", "index": 0}], "usage": {"completion_tokens": 1}})


@pytest.fixture
async def engine_url() -> AsyncIterator[tuple[Engine, str]]:
    eng = Engine(accept_priority=False)
    app = web.Application()
    app.router.add_post("/v1/completions", eng.completions)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield eng, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_probe_body_follows_the_engine_dialect(engine_url: tuple[Engine, str]) -> None:
    """The dialect decides: no priority for vLLM without `engine_priority` (one request, no 400 and retry),
    -100 when the deployment says the engine runs priority scheduling, always for the simulated engine."""
    eng, url = engine_url
    mon = HealthMonitor(model="m", registry=CollectorRegistry(), dialect=dialect("vllm"))
    mon.set_replicas({"r": url})
    try:
        res = await mon.probe("r")
        assert res.ok, res
        (body,) = eng.bodies
        assert "priority" not in body and body["max_tokens"] == 1 and body["model"] == "m"
    finally:
        await mon.stop()
    for kind, engine_priority in (("vllm", True), ("sim", False)):
        mon = HealthMonitor(
            model="m", registry=CollectorRegistry(), dialect=dialect(kind), engine_priority=engine_priority
        )
        mon.set_replicas({"r": url})
        try:
            res = await mon.probe("r")
            assert eng.bodies[-1]["priority"] == -100
            assert not res.ok and res.error == "http_400"  # this stand-in rejects the field: a failed probe
        finally:
            await mon.stop()
    mon = HealthMonitor(model="m", dialect=dialect("llamacpp"), engine_priority=True)
    mon.set_replicas({"r": url})
    try:
        assert (await mon.probe("r")).ok and "priority" not in eng.bodies[-1]
    finally:
        await mon.stop()


async def test_probe_refused_and_unknown_replica() -> None:
    mon = HealthMonitor(model="m")
    mon.set_replicas({"r": "http://127.0.0.1:9"})  # discard port: nothing listens
    try:
        res = await mon.probe("r")
        assert not res.ok and res.error == "refused"
        assert mon.state("nope") == HealthState.UNHEALTHY and not mon.routable("nope")
    finally:
        await mon.stop()


async def test_livez_routes() -> None:
    mon = HealthMonitor(model="m", initial_state=HealthState.HEALTHY)
    mon.set_replicas({"a": "http://127.0.0.1:9", "b": "http://127.0.0.1:9"})
    app = web.Application()
    add_livez_routes(app, mon)
    async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as client:
        assert (await client.get("/livez")).status == 200
        assert (await client.get("/readyz/a")).status == 200
        rh = mon.tracker("b")
        assert rh is not None
        t = mon.clock()
        rh.on_probe(t + 1.0, False, 5.0, "timeout")
        rh.on_probe(t + 20.0, False, 5.0, "timeout")
        assert rh.state == HealthState.UNHEALTHY
        r = await client.get("/livez/b")
        assert r.status == 503 and (await r.json())["b"]["alive"] is False
        assert (await client.get("/livez")).status == 503
        assert (await client.get("/livez/a")).status == 200
        assert (await client.get("/livez/zzz")).status == 404
        assert (await client.get("/readyz")).status == 503


def test_reason_kind_is_bounded() -> None:
    assert reason_kind("error_rate 0.66 over 20 requests") == "error_rate"
    assert reason_kind("remediation_failed: boom") == "remediation_failed"
    assert reason_kind("") == "unknown"


async def test_set_replicas_adds_and_drops() -> None:
    reg = CollectorRegistry()
    mon = HealthMonitor(model="m", registry=reg)
    mon.set_replicas({"a": "http://127.0.0.1:1/", "b": "http://127.0.0.1:2"})
    assert set(mon.states()) == {"a", "b"} and mon.state("a") == HealthState.STARTING
    assert reg.get_sample_value("fleetgate_health_state", {"replica": "a", "state": "starting"}) == 1.0
    mon.set_replicas([("b", "http://127.0.0.1:2")])
    assert set(mon.states()) == {"b"}
    assert reg.get_sample_value("fleetgate_health_state", {"replica": "a", "state": "starting"}) is None


async def test_a_followers_declined_remediation_logs_info_not_error(caplog: pytest.LogCaptureFixture) -> None:
    """Only the leading gateway deletes the pod: a follower's refusal is expected, so it is no error line
    (it still counts as not remediated, so the follower retries after the back-off)."""
    restarted: list[str] = []

    class Inner:
        async def restart(self, name: str) -> None:
            restarted.append(name)

    leader = {"now": False}
    reg = CollectorRegistry()
    mon = HealthMonitor(model="m", registry=reg, remediator=LeaderOnly(Inner(), lambda: leader["now"]))
    mon.set_replicas({"a": "http://127.0.0.1:1"})
    with caplog.at_level(logging.INFO, logger="fleetgate"):
        await mon._remediate("a", Remediate("a", "probe timeout", 1))
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "remediation replica=a" in r.getMessage()]
    assert (
        logging.INFO,
        "health remediation replica=a declined: not the leader: replica a is left to the gateway that leads",
    ) in lines, lines
    assert not [m for lvl, m in lines if lvl >= logging.ERROR], lines
    assert restarted == []
    counted = [
        (s.labels["result"], s.value)
        for m in reg.collect()
        if m.name == "fleetgate_health_remediations"
        for s in m.samples
        if s.name.endswith("_total")
    ]
    assert counted == [("error", 1.0)], counted
    leader["now"] = True  # the leader restarts it
    await mon._remediate("a", Remediate("a", "probe timeout", 2))
    assert restarted == ["a"]
