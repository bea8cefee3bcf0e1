"""Reservations at run time (issue 18 item 4): ``PUT/DELETE /admin/tenants/{name}/reservations`` on real
gateways (HTTP on 127.0.0.1), with the in-memory store and with the real Redis (FLEETGATE_TEST_REDIS_URL):
a change that a GPU pool cannot back is refused with 409 and the shortfall; an accepted one is enforced at
once (the tenant's reservation, the pool's floors) and, with Redis, seen by another gateway replica and by
a gateway started afterwards (a restart loses none)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from fleetgate.config import parse_config
from fleetgate.runtime import Gateway, build_gateway

REDIS_URL = os.environ.get("FLEETGATE_TEST_REDIS_URL")
ADMIN = {"Authorization": "Bearer sk-admin"}
GOLD = {"Authorization": "Bearer sk-gold"}


def _config(store: dict[str, Any]) -> dict[str, Any]:
    replica = [{"name": "r", "url": "http://127.0.0.1:9"}]
    return {
        "gateway": {"host": "127.0.0.1", "port": 0},
        # 100 MU/min per replica at target 0.7: 70 MU/min per GPU of reservation; chat-b's 70 takes one
        "pools": [{"name": "gpus", "gpus": 4}],
        "deployments": [
            {"model": "chat-a", "pool": "gpus", "replicas": replica},
            {"model": "chat-b", "pool": "gpus", "replicas": replica},
            {"model": "free", "replicas": replica},  # no pool: never refused
        ],
        "tenants": [
            {"name": "gold", "api_keys": ["sk-gold"], "reserved_mu_per_min": {"chat-a": 70}},
            {"name": "silver", "api_keys": ["sk-silver"], "reserved_mu_per_min": {"chat-b": 70}},
        ],
        "admission": {"admin_api_keys": ["sk-admin"], "store": store},
        "ops": {"access_log": False},
    }


STORES = ["memory", pytest.param("redis", marks=pytest.mark.skipif(not REDIS_URL, reason="no test Redis"))]


def _store(kind: str, namespace: str) -> dict[str, Any]:
    if kind == "memory":
        return {"kind": "memory"}
    return {"kind": "redis", "url": REDIS_URL, "namespace": namespace}


class Gateways:
    def __init__(self) -> None:
        self.started: list[Gateway] = []

    async def start(self, doc: dict[str, Any]) -> tuple[Gateway, str]:
        gw = build_gateway(parse_config(doc))
        url = await gw.start(0)
        self.started.append(gw)
        return gw, url

    async def stop(self, gw: Gateway) -> None:
        await gw.stop(0.5)
        await gw.admission.aclose()  # type: ignore[attr-defined]  # the AdmissionService's store
        self.started.remove(gw)


@pytest.fixture
async def gateways() -> AsyncIterator[Gateways]:
    g = Gateways()
    try:
        yield g
    finally:
        for gw in list(g.started):
            await g.stop(gw)


async def _call(
    session: aiohttp.ClientSession, method: str, url: str, body: Any = None, headers: Any = ADMIN
) -> tuple[int, Any]:
    async with session.request(method, url, json=body, headers=headers) as r:
        return r.status, await r.json(content_type=None)


def _reserved(gw: Gateway, tenant: str) -> dict[str, float]:
    return next(dict(t.reserved_mu_per_min) for t in gw.admission.tenant_summaries() if t.name == tenant)


@pytest.mark.parametrize("kind", STORES)
async def test_put_change_refuse_delete(gateways: Gateways, kind: str) -> None:
    gw, url = await gateways.start(_config(_store(kind, f"t{uuid.uuid4().hex}")))
    base = f"{url}/admin/tenants/gold/reservations"
    async with aiohttp.ClientSession() as s:
        assert await _call(s, "GET", base) == (
            200,
            {"tenant": "gold", "reserved_mu_per_min": {"chat-a": 70.0}},
        )
        # fits: chat-a 3 GPUs (210 MU/min) + chat-b 1; a model outside any pool never counts
        status, body = await _call(s, "PUT", base, {"chat-a": 210, "free": 1e6})
        assert (status, body["reserved_mu_per_min"]) == (200, {"chat-a": 210.0, "free": 1e6})
        assert _reserved(gw, "gold") == {"chat-a": 210.0, "free": 1e6}
        # 211 MU/min needs a fourth GPU for chat-a: 5 with chat-b's, the pool has 4
        status, body = await _call(s, "PUT", base, {"chat-a": 211})
        assert status == 409, body
        err = body["error"]
        assert err["code"] == "pool_oversold" and err["type"] == "invalid_request_error"
        assert err["shortfall"] == {
            "pool": "gpus",
            "gpus": 4,
            "gpus_needed": 5,
            "short_gpus": 1,
            "sold_mu_per_min": 281.0,
            "short_mu_per_min": pytest.approx(281.0 * (1 - 4 / (281 / 70)), abs=1e-3),
        }
        assert "short by 1 GPUs" in err["message"]
        assert _reserved(gw, "gold")["chat-a"] == 210.0  # nothing changed
        # another tenant's raise into the same pool is refused just the same
        status, body = await _call(s, "PUT", f"{url}/admin/tenants/silver/reservations", {"chat-b": 71})
        assert status == 409 and body["error"]["shortfall"]["short_gpus"] == 1
        # lowering never needs room; 0 removes a model; DELETE one model, then all
        assert (await _call(s, "PUT", base, {"chat-a": 100, "free": 0}))[1]["reserved_mu_per_min"] == {
            "chat-a": 100.0
        }
        status, body = await _call(s, "DELETE", base + "/chat-a")
        assert (status, body["reserved_mu_per_min"]) == (200, {})
        assert _reserved(gw, "gold") == {}
        assert (await _call(s, "PUT", f"{url}/admin/tenants/silver/reservations", {"chat-b": 280}))[0] == 200
        status, body = await _call(s, "DELETE", f"{url}/admin/tenants/silver/reservations")
        assert (status, body["reserved_mu_per_min"]) == (200, {})


@pytest.mark.parametrize("kind", STORES)
async def test_bad_requests_and_auth(gateways: Gateways, kind: str) -> None:
    _, url = await gateways.start(_config(_store(kind, f"t{uuid.uuid4().hex}")))
    base = f"{url}/admin/tenants/gold/reservations"
    async with aiohttp.ClientSession() as s:
        status, body = await _call(s, "PUT", base, {"chat-a": 10}, headers=GOLD)
        assert (status, body["error"]["code"]) == (403, "admin_only")  # a tenant cannot buy for itself
        assert (await _call(s, "PUT", base, {"chat-a": 10}, headers={}))[0] == 401
        status, body = await _call(s, "PUT", f"{url}/admin/tenants/nobody/reservations", {"chat-a": 1})
        assert (status, body["error"]["code"]) == (404, "tenant_not_found")
        status, body = await _call(s, "PUT", base, {"gpt-9": 1})
        assert (status, body["error"]["code"], body["error"]["param"]) == (400, "model_not_found", "gpt-9")
        for bad in ({"chat-a": -1}, {"chat-a": "lots"}, {"chat-a": True}, {}):
            status, body = await _call(s, "PUT", base, bad)
            assert (status, body["error"]["code"]) == (400, "invalid_reservations"), bad
        status, body = await _call(s, "PUT", base, [1])  # the gateway's one JSON body parser
        assert status == 400 and "must be a JSON object" in body["error"]["message"]
        async with s.put(base, data=b"{not json", headers=ADMIN) as r:
            error = (await r.json())["error"]
            assert r.status == 400 and "not valid JSON" in error["message"]
            assert error["type"] == "invalid_request_error"
        async with s.put(base, data=b'{"chat-a": 1' + b"0" * 400 + b"}", headers=ADMIN) as r:
            assert r.status == 400  # an integer no float holds: invalid, never a 500


@pytest.mark.skipif(not REDIS_URL, reason="no test Redis")
async def test_every_replica_sees_a_change_and_a_restart_loses_none(gateways: Gateways) -> None:
    doc = _config(_store("redis", f"t{uuid.uuid4().hex}"))
    one, url_one = await gateways.start(doc)
    two, url_two = await gateways.start(doc)
    async with aiohttp.ClientSession() as s:
        status, _ = await _call(s, "PUT", f"{url_one}/admin/tenants/gold/reservations", {"chat-a": 140})
        assert status == 200
        for _ in range(50):  # the other replica re-reads the store every second
            if _reserved(two, "gold") == {"chat-a": 140.0}:
                break
            await asyncio.sleep(0.1)
        assert _reserved(two, "gold") == {"chat-a": 140.0}
        # replica two checks against what replica one sold: chat-a 2 + chat-b 1 GPUs, 1 left
        status, body = await _call(s, "PUT", f"{url_two}/admin/tenants/silver/reservations", {"chat-b": 141})
        assert status == 409 and body["error"]["shortfall"]["gpus_needed"] == 5
        await gateways.stop(one)
        await gateways.stop(two)
        three, url_three = await gateways.start(doc)  # a restart: the config still says 70
        for _ in range(50):
            if _reserved(three, "gold") == {"chat-a": 140.0}:
                break
            await asyncio.sleep(0.1)
        assert _reserved(three, "gold") == {"chat-a": 140.0}
        assert await _call(s, "GET", f"{url_three}/admin/tenants/gold/reservations") == (
            200,
            {"tenant": "gold", "reserved_mu_per_min": {"chat-a": 140.0}},
        )


@pytest.mark.parametrize("kind", STORES)
async def test_conflicting_changes_at_the_same_instant_never_oversell(gateways: Gateways, kind: str) -> None:
    """Two admins raise two tenants' reservations at once, each through its own gateway replica (with the
    memory store, one gateway: it is the whole fleet): gold's chat-a to 3 GPUs' worth, silver's chat-b to 2;
    each change fits the pool alone (3 + 1 or 1 + 2 GPUs of 4) but not both (5). Round after round exactly
    one gets 200 and the other 409 pool_oversold, and what the store holds afterwards fits the pool."""
    doc = _config(_store(kind, f"t{uuid.uuid4().hex}"))
    _, url_one = await gateways.start(doc)
    url_two = (await gateways.start(doc))[1] if kind == "redis" else url_one
    gold = "/admin/tenants/gold/reservations"
    silver = "/admin/tenants/silver/reservations"
    winners: dict[str, int] = {}
    async with aiohttp.ClientSession() as s:
        for round_ in range(20):
            first, second = (url_one, url_two) if round_ % 2 else (url_two, url_one)
            (sa, ba), (sb, bb) = await asyncio.gather(
                _call(s, "PUT", f"{first}{gold}", {"chat-a": 210}),
                _call(s, "PUT", f"{second}{silver}", {"chat-b": 140}),
            )
            assert sorted((sa, sb)) == [200, 409], (round_, ba, bb)
            loser = bb if sa == 200 else ba
            assert (
                loser["error"]["code"] == "pool_oversold" and loser["error"]["shortfall"]["gpus_needed"] == 5
            )
            winner = "gold" if sa == 200 else "silver"
            winners[winner] = winners.get(winner, 0) + 1
            held = {
                t: (await _call(s, "GET", f"{url_two}/admin/tenants/{t}/reservations"))[1][
                    "reserved_mu_per_min"
                ]
                for t in ("gold", "silver")
            }
            assert held == {
                "gold": {"chat-a": 210.0 if winner == "gold" else 70.0},
                "silver": {"chat-b": 140.0 if winner == "silver" else 70.0},
            }, round_
            for path, model in ((gold, "chat-a"), (silver, "chat-b")):  # back to one replica each
                assert (await _call(s, "PUT", f"{url_one}{path}", {model: 70}))[0] == 200
    assert sum(winners.values()) == 20, winners
