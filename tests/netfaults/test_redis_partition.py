"""Gateways cut off from their Redis by a network partition (a veth link brought down), not a killed Redis.

Hosts (network namespaces, see conftest.py): the test's own namespace runs the client and a simulated
engine; ``gw`` runs ``fleetgate serve`` processes; ``redis`` runs a real redis-server. The gateway reaches
Redis over one link and is reached by the client (and reaches its engine) over another, so only the path to
Redis fails. A partition drops packets in silence: every Redis call waits for its timeout instead of being
refused at once, which is what the store's short timeouts and fail-fast interval are for
(docs/admission.md, "When Redis is unreachable").
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
import yaml
from k8s_apiserver import ApiServer, FakeCluster
from k8s_gateways import gateway_files, leading, scalers, watch_takeover
from netns import PY, Host, Net, NsProcess, redis_server

pytestmark = pytest.mark.timeout(120)

KEY = "sk-net"
ADMIN = "sk-net-admin"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
HEADERS = {"Authorization": f"Bearer {KEY}"}


def gateway_config(tmp: Path, name: str, host_ip: str, port: int, **extra: Any) -> Path:
    cfg = {
        "gateway": {"host": host_ip, "port": port, "metrics_auth": "none"},
        "ops": {"access_log": False},
        "tenants": [{"name": "net", "api_keys": [KEY], "reserved_mu_per_min": {"m": 1.0e6}}],
        **extra,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def serve(host: Host, config: Path, name: str) -> NsProcess:
    return NsProcess(host, [PY, "-m", "fleetgate.cli", "serve", "--config", str(config)], name)


async def metric(s: aiohttp.ClientSession, url: str, name: str, labels: str = "") -> float | None:
    async with s.get(url + "/metrics") as r:
        text = await r.text()
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    return None if match is None else float(match.group(1))


async def chat(s: aiohttp.ClientSession, url: str) -> tuple[int, float, dict[str, str], str]:
    """Status, seconds to the full answer, headers, body."""
    t0 = time.monotonic()
    async with s.post(url + "/v1/chat/completions", json=BODY, headers=HEADERS) as r:
        body = await r.text()
        return r.status, time.monotonic() - t0, dict(r.headers), body


async def stream_all(s: aiohttp.ClientSession, url: str, max_tokens: int) -> tuple[int, str]:
    body = {**BODY, "max_tokens": max_tokens, "stream": True}
    async with s.post(url + "/v1/chat/completions", json=body, headers=HEADERS) as r:
        return r.status, await r.text()


async def test_gateway_cut_off_from_redis_answers_within_bounds_and_resumes(net: Net, tmp_path: Path) -> None:
    """fail_open false: 503 with Retry-After, each within a bound (no hang); fail_open true: admitted
    unmetered; a stream admitted before the cut completes; after the link is back both gateways use Redis
    again (the shared usage counters in Redis move) without a restart."""
    gw, rds = net.host("gw"), net.host("redis")
    front = net.link(net.root, gw)  # client and engine <-> gateway
    store_link = net.link(gw, rds)  # gateway <-> Redis: the one that fails
    watch = net.link(net.root, rds)  # the test's own view of Redis, never cut
    redis_proc, port = redis_server(rds, [store_link.b_ip, watch.b_ip], tmp_path)
    engine = NsProcess(
        net.root,
        [PY, "-m", "fleetgate.cli", "engine", "sim", "--host", front.a_ip, "--port", "0", "--model", "m"],
        "engine",
    )
    url = engine.wait_ready(30.0)
    deployments = [{"model": "m", "capacity_mu_per_min": 1.0e6, "replicas": [{"name": "e0", "url": url}]}]
    gateways = {}
    for name, fail_open in (("closed", False), ("open", True)):
        store = {
            "kind": "redis", "url": f"redis://{store_link.b_ip}:{port}/0", "namespace": name,
            "fail_open": fail_open, "timeout_s": 0.25,
        }  # fmt: skip
        cfg = gateway_config(
            tmp_path, name, front.b_ip, 8080 if fail_open else 8081, deployments=deployments,
            admission={"admin_api_keys": [ADMIN], "store": store},
        )  # fmt: skip
        gateways[name] = serve(gw, cfg, f"gateway-{name}")
    r = aioredis.Redis.from_url(f"redis://{watch.b_ip}:{port}/0", decode_responses=True)
    procs = [redis_proc, engine, *gateways.values()]
    try:
        urls = {n: await asyncio.to_thread(p.wait_ready, 60.0) for n, p in gateways.items()}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
            for gurl in urls.values():
                status, _, _, body = await chat(s, gurl)
                assert status == 200, body
            before = {n: int(await r.hget(f"{n}:usage:net", "requests") or 0) for n in urls}
            assert before == {"closed": 1, "open": 1}

            # a stream admitted before the cut runs on; its settle fails in silence, the answer completes
            streaming = asyncio.create_task(stream_all(s, urls["closed"], 40))
            deadline = time.monotonic() + 10.0
            while int(await r.hget("closed:usage:net", "requests") or 0) < 2:  # admitted (through Redis)
                assert time.monotonic() < deadline and not streaming.done(), "the stream was not admitted"
                await asyncio.sleep(0.02)
            before["closed"] += 1
            store_link.cut(far=rds)
            cut = time.monotonic()
            assert not streaming.done(), "the stream ended before the cut"

            closed, opened = [], []
            while time.monotonic() - cut < 4.0:
                closed.append(await chat(s, urls["closed"]))
                opened.append(await chat(s, urls["open"]))
            status, text = await asyncio.wait_for(streaming, 20.0)
            assert status == 200 and text.rstrip().endswith("data: [DONE]"), text[-300:]

            assert {c[0] for c in closed} == {503}, [c[:2] for c in closed]
            assert all(float(c[2]["Retry-After"]) >= 1 for c in closed)
            assert all('"error"' in c[3] for c in closed)
            # a silent link costs at most the 0.25 s timeout per try (then 1 s of failing fast); 2 s of
            # margin for a loaded 2-core machine
            assert max(c[1] for c in closed + opened) < 2.0, [round(c[1], 2) for c in closed + opened]
            assert {o[0] for o in opened} == {200}, [o[:2] for o in opened]
            for gurl in urls.values():
                assert await metric(s, gurl, "fleetgate_admission_store_up") == 0.0
            assert (await metric(s, urls["open"], "fleetgate_admission_fail_open_total") or 0) >= len(opened)
            # nothing reached Redis meanwhile
            assert {n: int(await r.hget(f"{n}:usage:net", "requests") or 0) for n in urls} == before

            store_link.heal(far=rds)
            healed = time.monotonic()
            while True:
                status, _, _, _ = await chat(s, urls["closed"])
                if status == 200:
                    break
                assert time.monotonic() - healed < 10.0, "the gateway did not use Redis again"
                await asyncio.sleep(0.1)
            back_s = time.monotonic() - healed
            # The fail-open gateway answers 200 either way and retries the store on its own timer (the
            # fail-fast interval after its own last failure), so it may be a moment behind: the same bound.
            while True:
                status, _, _, _ = await chat(s, urls["open"])
                assert status == 200
                if await metric(s, urls["open"], "fleetgate_admission_store_up") == 1.0:
                    break
                assert time.monotonic() - healed < 10.0, "the fail-open gateway did not use Redis again"
                await asyncio.sleep(0.1)
            for gurl in urls.values():
                assert await metric(s, gurl, "fleetgate_admission_store_up") == 1.0
            after = {n: int(await r.hget(f"{n}:usage:net", "requests") or 0) for n in urls}
            assert after["closed"] > before["closed"] and after["open"] > before["open"], (before, after)
        print(
            f"cut: {len(closed)} fail-closed answers (max {max(c[1] for c in closed):.2f} s), "
            f"{len(opened)} fail-open; Redis used again {back_s:.2f} s after the link came back"
        )
    finally:
        await r.aclose()
        for p in procs:
            p.kill()


def k8s_gateway(
    host: Host, tmp: Path, i: int, api_url: str, listen_ip: str, extra: dict[str, Any]
) -> NsProcess:
    """Gateway ``i`` on ``host`` (token ``gw<i>``) for the Deployment ``engine``; the static autoscaler wants
    2 replicas, so whoever leads patches the scale back to 2 when it drifts."""
    gateway = {"host": listen_ip, "port": 8080, "metrics_auth": "none"}
    cfg, env = gateway_files(tmp, i, api_url, gateway, extra)
    return NsProcess(host, [PY, "-m", "fleetgate.cli", "serve", "--config", str(cfg)], f"gateway-{i}", env)


async def test_redis_lock_leader_cut_off_from_redis_stops_before_the_other_side_leads(
    net: Net, tmp_path: Path
) -> None:
    """Two gateways elect through a Redis lock (lease 3 s, renew deadline 2 s); both reach the API server
    (the test's namespace), each reaches Redis over its own link. The leader's link to Redis goes down: it
    stops leading by its renew deadline although it could still scale, the gateway on the other side of the
    partition takes over once the lock lapses, never two leaders at a 50 ms poll, and only the new leader
    patches the scale afterwards; the cut-off gateway keeps routing, and does not lead again when the link
    comes back while the other holds the lock."""
    gws = [net.host(f"g{i}") for i in range(2)]
    rds = net.host("redis")
    fronts = [net.link(net.root, g) for g in gws]  # API server, pods, client <-> gateway i
    stores = [net.link(g, rds) for g in gws]  # gateway i <-> Redis
    node_ip = fronts[0].a_ip  # the API server and the pods listen here; g1 reaches it through its link
    net.route(gws[1], node_ip, fronts[1].a_ip)
    redis_proc, port = redis_server(rds, [link.b_ip for link in stores], tmp_path)
    engine = [PY, "-m", "fleetgate.cli", "engine", "sim", "--host", node_ip, "--port", "0", "--model", "m"]
    cluster = FakeCluster(
        replicas=1, bookmark_interval_s=0.3, termination_grace_s=0.3, pod_ip=node_ip, engine_command=engine
    )
    cluster.token = "admin"
    cluster.tokens = {"gw0", "gw1"}
    server = ApiServer(cluster, host=node_ip)
    await cluster.start()
    await server.start_http()
    election = {"kind": "redis", "lease_duration_s": 3, "renew_deadline_s": 2, "retry_period_s": 0.5}
    procs = [redis_proc]
    for i, g in enumerate(gws):
        store = {"kind": "redis", "url": f"redis://{stores[i].b_ip}:{port}/0", "namespace": "lead"}
        extra = {"top": {"admission": {"store": store}}, "deployment": {"leader_election": election}}
        procs.append(k8s_gateway(g, tmp_path, i, server.url, fronts[i].b_ip, extra))
    try:
        urls = await asyncio.gather(*(asyncio.to_thread(p.wait_ready, 60.0) for p in procs[1:]))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
            await cluster.wait_for(lambda: cluster.desired == 2, 30.0)
            leaders = [i for i, url in enumerate(urls) if await leading(s, url)]
            assert len(leaders) == 1, (leaders, [p.output[-1500:] for p in procs[1:]])
            (first,) = leaders
            other = 1 - first
            stores[first].cut(far=rds)
            cut = time.monotonic()
            # drift while nobody may lead: only the next leader restores it
            stepped_down, took_over = await watch_takeover(
                s, urls[first], urls[other], on_step_down=lambda: cluster.scale(1)
            )
            assert stepped_down is not None and stepped_down <= 2.5 and stepped_down < took_over
            await cluster.wait_for(lambda: cluster.desired == 2, 10.0)
            assert scalers(cluster, cut + stepped_down) == {f"gw{other}"}
            # the cut-off gateway still routes (its replicas come from the API server, reachable)
            async with s.post(urls[first] + "/v1/chat/completions", json=BODY) as r:
                assert r.status == 200, await r.text()

            stores[first].heal(far=rds)
            healed = time.monotonic()
            while time.monotonic() - healed < 2.0:  # four retry periods with Redis reachable again
                assert [await leading(s, url) for url in urls] == [i == other for i in range(2)]
                await asyncio.sleep(0.1)
        print(f"cut-off leader stopped after {stepped_down:.2f} s, the other led after {took_over:.2f} s")
    finally:
        for p in procs:
            p.kill()
        await server.stop_http()
        await cluster.close()
