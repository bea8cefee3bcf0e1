"""AdmissionService (async shell) over the memory store, tenants/API keys, config and the admin routes."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from fleetgate.admission.http import add_admin_routes
from fleetgate.admission.service import AdmissionService
from fleetgate.admission.tenants import bearer_token
from fleetgate.config import ConfigError, load_config, parse_config
from fleetgate.core.errors import AuthenticationError, RateLimitError, ServiceUnavailableError
from fleetgate.core.types import Priority, RequestInfo, Usage
from fleetgate.gateway.errors import error_headers
from fleetgate.stores import MemoryStore

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tenants.yaml"


class FakeClock:
    """A settable clock (the service also sleeps in real time while requests wait, so keep waits short)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def cfg(**admission: object) -> dict[str, object]:
    return {
        "deployments": [
            {
                "model": "m",
                "capacity_mu_per_min": 60,
                "replicas": [
                    {"name": "r0", "url": "http://127.0.0.1:1"},
                    {"name": "r1", "url": "http://127.0.0.1:2"},
                ],
            }
        ],
        "tenants": [
            {
                "name": "gold",
                "api_keys": ["sk-gold"],
                "reserved_mu_per_min": {"m": 60},
                "requests_per_minute": 600,
            },
            {
                "name": "free",
                "api_keys": ["sk-free"],
                "priority": "best_effort",
                "best_effort_mu_per_min": None,
            },
        ],
        "admission": {"admin_api_keys": ["sk-admin"], **admission},
    }


def req(rid: str, cost: float = 1.0, **kw: object) -> RequestInfo:
    return RequestInfo(request_id=rid, model="m", cost_mu=cost, **kw)  # type: ignore[arg-type]


def service(clock: FakeClock | None = None, **admission: object) -> AdmissionService:
    return AdmissionService.from_config(parse_config(cfg(**admission)), clock=clock or FakeClock())


# ---------------------------------------------------------------------------------------------- config
def test_config_hashes_plain_keys_and_keeps_no_plain_key() -> None:
    c = parse_config(cfg())
    digest = hashlib.sha256(b"sk-gold").hexdigest()
    assert c.tenants[0].api_keys == [f"sha256:{digest}"]
    assert "sk-gold" not in c.model_dump_json()
    # an already hashed key is kept as is
    c2 = parse_config({"tenants": [{"name": "t", "api_keys": [f"sha256:{digest.upper()}"]}]})
    assert c2.tenants[0].api_keys == [f"sha256:{digest}"]


def test_config_rejects_duplicate_keys_and_bad_values() -> None:
    with pytest.raises(ConfigError, match="used twice"):
        parse_config({"tenants": [{"name": "a", "api_keys": ["k"]}, {"name": "b", "api_keys": ["k"]}]})
    with pytest.raises(ConfigError, match="reservation"):
        parse_config({"tenants": [{"name": "a", "reserved_mu_per_min": {"m": -1}}]})
    with pytest.raises(ConfigError, match="kind"):
        parse_config({"admission": {"store": {"kind": "etcd"}}})


def test_example_config_loads() -> None:
    c = load_config(EXAMPLE, {})
    names = {t.name: t for t in c.tenants}
    assert names["gold"].reserved_mu_per_min == {"fleetgate-sim": 100}
    assert names["gold"].priority == "interactive" and names["free"].priority == "best_effort"
    assert c.admission.admin_api_keys == ["sha256:" + hashlib.sha256(b"sk-admin-demo").hexdigest()]


# ---------------------------------------------------------------------------------------------- auth
def test_bearer_parsing() -> None:
    assert bearer_token("Bearer sk-x") == "sk-x"
    assert bearer_token("bearer   sk-x ") == "sk-x"
    assert bearer_token("Basic abc") is None
    assert bearer_token(None) is None and bearer_token("Bearer ") is None


async def test_authenticate() -> None:
    svc = service()
    assert svc.authenticate("Bearer sk-gold").name == "gold"
    assert svc.authenticate("Bearer sk-admin").admin
    with pytest.raises(AuthenticationError) as e:
        svc.authenticate(None)
    assert e.value.status == 401
    with pytest.raises(AuthenticationError) as e:
        svc.authenticate("Bearer sk-wrong-key-123")
    assert "sk-wrong-key-123" not in e.value.message
    # no tenants at all: anonymous and unlimited
    open_svc = AdmissionService.from_config(parse_config({}))
    t = open_svc.authenticate(None)
    assert t.name == "anonymous"
    for i in range(100):
        ticket = await open_svc.admit(t, req(f"a{i}", 1000.0))
        await open_svc.settle(ticket, 1000.0)


# ---------------------------------------------------------------------------------------------- admit
async def test_admit_settle_and_429_with_openai_headers() -> None:
    clock = FakeClock()
    svc = service(clock, deadline_s=0)
    gold = svc.authenticate("Bearer sk-gold")
    ticket = await svc.admit(gold, req("a", 5.0), clock())
    assert ticket.headers["x-ratelimit-limit-requests"] == "600"
    assert ticket.headers["x-ratelimit-remaining-mu"] == "55"
    assert "x-ratelimit-remaining-tokens" not in ticket.headers  # no TPM limit: no token headers
    assert ticket.headers["x-fleetgate-tier"] == "reserved"
    with pytest.raises(RateLimitError) as e:
        await svc.admit(gold, req("b", 1.0), clock())
    err = e.value
    assert err.status == 429 and err.retry_after_s == pytest.approx(5.0)
    http_headers = error_headers(err)  # where errors become HTTP
    assert http_headers["Retry-After"] == "5" and http_headers["retry-after-ms"] == "5000"
    assert err.headers["x-ratelimit-remaining-mu"] == "55"
    assert err.headers["x-ratelimit-reset-mu"] == "5s"
    assert "model units per min" in err.message
    # settle cheaper than estimated: the refund makes room at once
    await svc.settle(ticket, 1.0, clock(), usage=Usage(prompt_tokens=10, completion_tokens=3))
    clock.t += 1.0
    t2 = await svc.admit(gold, req("c", 0.5), clock())
    await svc.settle(t2, 0.5, clock())
    usage = await svc.usage("gold")
    assert usage["usage"]["requests"] == 2 and usage["usage"]["settled_mu"] == pytest.approx(1.5)
    assert usage["usage"]["prompt_tokens"] == 10 and usage["rejected_by_this_gateway"] == 1


async def test_best_effort_saturated_gets_503_and_probe_still_passes() -> None:
    clock = FakeClock()
    svc = service(clock, deadline_s=0, fleet_burst_s=0)  # fleet 120 MU/min x 0.8 = 96 MU/min = 1.6 MU/s
    free = svc.authenticate("Bearer sk-free")
    await svc.admit(free, req("f1", 16.0), clock())
    with pytest.raises(ServiceUnavailableError) as e:
        await svc.admit(free, req("f2", 1.0), clock())
    assert e.value.status == 503 and e.value.retry_after_s == pytest.approx(10.0)
    assert error_headers(e.value)["Retry-After"] == "10"
    probe = await svc.admit(free, req("p", 1.0, priority=Priority.PROBE), clock())
    assert probe.tier == "probe"


async def test_queued_request_waits_and_is_admitted_when_a_refund_frees_room() -> None:
    clock = FakeClock()
    svc = service(clock, deadline_s=30)
    gold = svc.authenticate("Bearer sk-gold")
    first = await svc.admit(gold, req("a", 20.0), clock())  # gold's bucket needs 20 s to drain
    waiter = asyncio.create_task(svc.admit(gold, req("b", 1.0), clock()))
    await asyncio.sleep(0.05)
    assert not waiter.done() and svc.queue_depth == 1
    clock.t += 0.2  # the RPM meter (600/min, no burst) needs 0.1 s; the MU meter would need 20 s
    await asyncio.sleep(0.6)
    assert not waiter.done()
    svc.release(first)  # never ran: the whole estimate comes back
    ticket = await asyncio.wait_for(waiter, 2.0)
    assert ticket.decision.allowed and ticket.waited_s >= 0
    await svc.aclose()


async def test_deadline_rejects_a_waiting_request() -> None:
    svc = service(None, deadline_s=0.2)  # real clock for the deadline (short)
    svc.clock = __import__("time").monotonic
    gold = svc.authenticate("Bearer sk-gold")
    await svc.admit(gold, req("a", 0.9))  # 0.9 s to drain; next estimate 0.9 s > deadline -> at once
    with pytest.raises(RateLimitError):
        await svc.admit(gold, req("b", 1.0))
    await svc.aclose()


async def test_cancelled_waiter_leaves_the_queue() -> None:
    clock = FakeClock()
    svc = service(clock, deadline_s=30)
    gold = svc.authenticate("Bearer sk-gold")
    await svc.admit(gold, req("a", 20.0), clock())
    waiter = asyncio.create_task(svc.admit(gold, req("b", 1.0), clock()))
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert svc.queue_depth == 0
    await svc.aclose()


# ---------------------------------------------------------------------------------------------- admin
async def test_admin_routes_isolate_tenants() -> None:
    svc = service()
    app = web.Application()
    add_admin_routes(app, svc)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    base = f"http://127.0.0.1:{port}"

    async def get(path: str, key: str | None) -> tuple[int, dict]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with session.get(base + path, headers=headers) as resp:
            return resp.status, await resp.json()

    try:
        async with aiohttp.ClientSession() as session:
            assert (await get("/admin/usage", None))[0] == 401
            assert (await get("/admin/usage", "sk-nope"))[0] == 401
            status, body = await get("/admin/usage", "sk-gold")
            assert status == 200 and body["tenant"]["name"] == "gold"
            assert "free" not in str(body)
            assert (await get("/admin/usage/free", "sk-gold"))[0] == 403
            assert (await get("/admin/usage/nobody", "sk-gold"))[0] == 403
            assert (await get("/admin/usage/gold", "sk-gold"))[0] == 200
            assert (await get("/admin/tenants", "sk-gold"))[0] == 403
            status, body = await get("/admin/tenants", "sk-admin")
            assert status == 200 and {t["name"] for t in body["tenants"]} == {"gold", "free"}
            assert "sha256" not in str(body)
            status, body = await get("/admin/usage", "sk-admin")
            assert status == 200 and len(body["tenants"]) == 2
            status, body = await get("/admin/capacity", "sk-admin")
            assert status == 200
            assert body["deployments"][0]["capacity_mu_per_min"] == 120
            assert body["deployments"][0]["sold_mu_per_min"] == 60
            assert (await get("/admin/usage/nobody", "sk-admin"))[0] == 404
    finally:
        await runner.cleanup()


def test_memory_store_is_the_default() -> None:
    assert isinstance(service().store, MemoryStore)


async def test_best_effort_is_held_while_every_engine_reports_a_queue() -> None:
    """The scraped engine queues feed admission: with a waiting queue on every routable replica there is no
    idle capacity, so best-effort gets a 503 (here: no time to wait), reserved traffic still passes, and
    best-effort resumes as soon as one replica shows a free slot (or is unknown)."""
    from fleetgate.admission.service import engines_saturated
    from fleetgate.core.types import HealthState, ReplicaSnapshot

    clock = FakeClock()
    svc = service(clock, deadline_s=0)
    replicas = [
        ReplicaSnapshot("r0", capacity_mu_per_min=60.0, engine_waiting=3),
        ReplicaSnapshot("r1", capacity_mu_per_min=60.0, engine_waiting=1),
        ReplicaSnapshot("r2", capacity_mu_per_min=60.0, health=HealthState.UNHEALTHY, engine_waiting=0),
    ]
    assert engines_saturated(replicas)  # an unroutable replica's free slots are no use
    assert not engines_saturated([ReplicaSnapshot("r0"), ReplicaSnapshot("r1", engine_waiting=2)])
    assert not engines_saturated([])
    svc.use_replica_capacity(lambda m: replicas if m == "m" else None)
    free = svc.authenticate("Bearer sk-free")
    gold = svc.authenticate("Bearer sk-gold")
    with pytest.raises(ServiceUnavailableError) as e:
        await svc.admit(free, req("f1", 0.1), clock())
    assert 0 < e.value.retry_after_s <= 1.0
    assert (await svc.admit(gold, req("g1", 0.1), clock())).tier == "reserved"
    replicas[1] = ReplicaSnapshot("r1", capacity_mu_per_min=60.0, engine_waiting=0)
    clock.t += 1.0
    assert (await svc.admit(free, req("f2", 0.1), clock())).tier == "best_effort"


async def test_best_effort_follows_live_replica_capacity() -> None:
    from fleetgate.core.types import HealthState, ReplicaSnapshot

    clock = FakeClock()
    svc = service(clock, deadline_s=0, fleet_burst_s=0)
    replicas = [
        ReplicaSnapshot("r0", capacity_mu_per_min=60.0),
        ReplicaSnapshot("r1", capacity_mu_per_min=60.0),
    ]
    svc.use_replica_capacity(lambda m: replicas if m == "m" else None)
    assert svc.capacity("m") is not None and svc.capacity("m").capacity_mu_per_min == 120.0  # type: ignore[union-attr]
    replicas[1] = ReplicaSnapshot("r1", health=HealthState.UNHEALTHY, capacity_mu_per_min=60.0)
    view = svc.capacity("m")
    assert view is not None and view.capacity_mu_per_min == 60.0 and view.sold_mu_per_min == 60.0
    free = svc.authenticate("Bearer sk-free")
    await svc.admit(free, req("f1", 8.0), clock())  # fleet meter now 48 MU/min = 0.8 MU/s
    with pytest.raises(ServiceUnavailableError) as e:
        await svc.admit(free, req("f2", 1.0), clock())
    assert e.value.retry_after_s == pytest.approx(10.0)
