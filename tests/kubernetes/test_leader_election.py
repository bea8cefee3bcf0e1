"""Three ``fleetgate serve`` gateways in front of the same engine Deployment act as one.

Real gateway processes (each with its own kubeconfig token, so the test API server can tell who made each
call) against tests/kubernetes/k8s_apiserver.py (test code, 127.0.0.1; its pods are real engine processes).
Exactly one holds the ``coordination.k8s.io/v1`` Lease and scales; the leader is SIGKILLed and another takes
over within 15 s with the default timing (10 s lease, 2 s retry); no two gateways ever scale in the same
term. The Redis variant elects through a lock in the real Redis (``FLEETGATE_TEST_REDIS_URL``).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from k8s_apiserver import ApiServer, FakeCluster
from k8s_gateways import gateway_files, leading, scalers, start_serve, watch_takeover

from fleetgate.providers.kubernetes_rbac import lease_name

pytestmark = pytest.mark.timeout(150)

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
LEASE = lease_name("engine")


def _gateway(server: ApiServer, tmp_path: Path, i: int, extra: dict[str, Any]) -> Any:
    """Gateway ``i`` (token ``gw<i>``; the static autoscaler wants 2 engine replicas)."""
    config, env = gateway_files(tmp_path, i, server.url, None, extra)
    return start_serve(config, env, name=f"gateway-{i}")


async def _demand(session: aiohttp.ClientSession, url: str) -> float | None:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    match = re.search(r'^fleetgate_autoscaler_demand_mu_per_minute\{deployment="m"\} (\S+)$', text, re.M)
    return None if match is None else float(match.group(1))


async def _follower_demand_reaches_the_leader(s: aiohttp.ClientSession, urls: list[str], leader: int) -> None:
    """Requests sent only to a follower show in the leader's autoscaler demand (shared through Redis)."""
    follower = next(i for i in range(len(urls)) if i != leader)
    assert await _demand(s, urls[follower]) is None  # a follower's autoscaler does not step
    for _ in range(6):
        async with s.post(urls[follower] + "/v1/chat/completions", json=BODY) as r:
            assert r.status == 200
    deadline = time.monotonic() + 8.0
    while not (await _demand(s, urls[leader]) or 0.0) > 0.0:
        assert time.monotonic() < deadline, "the leader never saw the follower's demand"
        await asyncio.sleep(0.2)


async def _run(
    tmp_path: Path, extra: dict[str, Any], takeover_limit_s: float, shared_demand: bool = False
) -> dict[str, float]:
    cluster = FakeCluster(replicas=1, bookmark_interval_s=0.3, termination_grace_s=0.3)
    cluster.token = "admin"
    cluster.tokens = {"gw0", "gw1", "gw2"}
    server = ApiServer(cluster)
    await cluster.start()
    await server.start_http()
    gws = [_gateway(server, tmp_path, i, extra) for i in range(3)]
    try:
        urls = await asyncio.gather(*(asyncio.to_thread(gw.wait_ready, 60.0) for gw in gws))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
            await cluster.wait_for(lambda: cluster.desired == 2, 30.0)
            leaders = [i for i, url in enumerate(urls) if await leading(s, url)]
            assert len(leaders) == 1, (leaders, [gw.output[-1500:] for gw in gws])
            (first,) = leaders
            assert scalers(cluster) == {f"gw{first}"}, "only the leader scaled"
            await asyncio.sleep(1.0)  # a few more renewals and autoscaler periods: still one leader
            assert [await leading(s, url) for url in urls].count(True) == 1
            assert scalers(cluster) == {f"gw{first}"}
            if shared_demand:
                await _follower_demand_reaches_the_leader(s, urls, first)

            gws[first].kill()  # SIGKILL: no release, the lease has to run out
            killed_at = time.monotonic()
            cluster.scale(1)  # the count drifts away while nobody leads; the next leader restores it
            survivors = [i for i in range(3) if i != first]
            second = None
            while second is None:
                assert time.monotonic() - killed_at < takeover_limit_s + 5, "no takeover"
                for i in survivors:
                    if await leading(s, urls[i]):
                        second = i
                await asyncio.sleep(0.1)
            takeover_s = time.monotonic() - killed_at
            await cluster.wait_for(lambda: cluster.desired == 2, 15.0)
            restored_s = time.monotonic() - killed_at
            assert scalers(cluster, killed_at) == {f"gw{second}"}, "only the new leader scaled"
            assert [await leading(s, urls[i]) for i in survivors].count(True) == 1
            # every gateway routes, leader or not
            for i in survivors:
                async with s.post(urls[i] + "/v1/chat/completions", json=BODY) as r:
                    assert r.status == 200, await r.text()
        assert takeover_s <= takeover_limit_s, f"takeover after {takeover_s:.1f} s"
        print(f"takeover {takeover_s:.1f} s, count restored {restored_s:.1f} s after the leader's SIGKILL")
        return {"takeover_s": takeover_s, "first": first, "second": float(second)}
    finally:
        for gw in gws:
            gw.kill()
        await server.stop_http()
        await cluster.close()


async def test_three_gateways_one_lease_holder_scales_and_a_survivor_takes_over(tmp_path: Path) -> None:
    """Default timing (lease 10 s, retry 2 s): takeover within 15 s of the leader's SIGKILL."""
    got = await _run(tmp_path, {}, takeover_limit_s=15.0)
    assert got["first"] != got["second"]


async def test_lease_records_the_holders_and_transitions(tmp_path: Path) -> None:
    """Two gateways, a short lease: the Lease object names the holder, counts the hand-over, and a gateway
    stopped with SIGTERM hands the lease back (empty holder) so the other takes over at once."""
    cluster = FakeCluster(replicas=1, bookmark_interval_s=0.3, termination_grace_s=0.3)
    cluster.tokens = {"gw0", "gw1"}
    cluster.token = "admin"
    server = ApiServer(cluster)
    await cluster.start()
    await server.start_http()
    fast = {"deployment": {"leader_election": {"lease_duration_s": 30, "renew_deadline_s": 20}}}
    gws = [_gateway(server, tmp_path, i, fast) for i in range(2)]
    try:
        urls = await asyncio.gather(*(asyncio.to_thread(gw.wait_ready, 60.0) for gw in gws))
        await cluster.wait_for(lambda: cluster.get("leases", LEASE) is not None, 15.0)
        spec = cluster.get("leases", LEASE)["spec"]  # type: ignore[index]
        assert spec["leaseDurationSeconds"] == 30 and spec["leaseTransitions"] == 0
        assert spec["acquireTime"].endswith("Z") and spec["renewTime"] >= spec["acquireTime"]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
            (first,) = [i for i, url in enumerate(urls) if await leading(s, url)]
            holder = spec["holderIdentity"]
            gws[first].signal(15)  # SIGTERM: drains, releases the lease
            await asyncio.to_thread(gws[first].wait, 30.0)
            stopped = time.monotonic()
            other = 1 - first
            while not await leading(s, urls[other]):
                assert time.monotonic() - stopped < 10.0, "a released lease was not taken at once"
                await asyncio.sleep(0.1)
        spec = cluster.get("leases", LEASE)["spec"]  # type: ignore[index]
        assert spec["holderIdentity"] not in ("", holder) and spec["leaseTransitions"] == 1
        # within the 30 s lease: only the release made this possible
        assert time.monotonic() - stopped < 10.0
    finally:
        for gw in gws:
            gw.kill()
        await server.stop_http()
        await cluster.close()


async def test_a_leader_cut_off_from_the_api_server_stops_before_another_takes_over(tmp_path: Path) -> None:
    """The leader's requests to the API server go unanswered (a black-holed link, not an error): it stops
    leading at its renew deadline, before the other gateway may take the lease, and never acts again while
    cut off; the other takes over once the lease runs out (short timing: lease 3 s, renew 2 s)."""
    cluster = FakeCluster(replicas=1, bookmark_interval_s=0.3, termination_grace_s=0.3)
    cluster.token = "admin"
    cluster.tokens = {"gw0", "gw1"}
    server = ApiServer(cluster)
    await cluster.start()
    await server.start_http()
    short = {
        "deployment": {
            "leader_election": {"lease_duration_s": 3, "renew_deadline_s": 2, "retry_period_s": 0.5}
        }
    }
    gws = [_gateway(server, tmp_path, i, short) for i in range(2)]
    try:
        urls = await asyncio.gather(*(asyncio.to_thread(gw.wait_ready, 60.0) for gw in gws))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
            await cluster.wait_for(lambda: cluster.desired == 2, 30.0)
            (first,) = [i for i, url in enumerate(urls) if await leading(s, url)]
            other = 1 - first
            cluster.partitioned.add(f"gw{first}")
            cut = time.monotonic()
            stepped_down, took_over = await watch_takeover(s, urls[first], urls[other])
            assert stepped_down is not None and stepped_down <= 2.5 and stepped_down < took_over
            cluster.scale(1)
            await cluster.wait_for(lambda: cluster.desired == 2, 10.0)
            assert scalers(cluster, cut) == {f"gw{other}"}
            # the cut-off gateway still routes to the replicas it knows
            async with s.post(urls[first] + "/v1/chat/completions", json=BODY) as r:
                assert r.status == 200
        print(f"partitioned leader stopped after {stepped_down:.1f} s, the other led after {took_over:.1f} s")
    finally:
        for gw in gws:
            gw.kill()
        await server.stop_http()
        await cluster.close()


@pytest.mark.skipif(not os.environ.get("FLEETGATE_TEST_REDIS_URL"), reason="needs FLEETGATE_TEST_REDIS_URL")
async def test_three_gateways_elect_through_a_redis_lock(tmp_path: Path) -> None:
    """``leader_election: {kind: redis}`` (the admission store's Redis): as above, with a shorter lease; and
    the leader's autoscaler reads the demand of requests only a follower admitted."""
    import redis.asyncio as aioredis

    url = os.environ["FLEETGATE_TEST_REDIS_URL"]
    namespace = f"fg-leader-test-{os.getpid()}"
    extra = {
        "top": {"admission": {"store": {"kind": "redis", "url": url, "namespace": namespace}}},
        "deployment": {
            "leader_election": {
                "kind": "redis", "lease_duration_s": 4, "renew_deadline_s": 3, "retry_period_s": 0.5,
            }
        },
    }  # fmt: skip
    r = aioredis.Redis.from_url(url)
    try:
        await _run(tmp_path, extra, takeover_limit_s=6.0, shared_demand=True)
        assert await r.exists(f"{namespace}:leader:m")
    finally:
        keys = [k async for k in r.scan_iter(f"{namespace}:*")]
        if keys:
            await r.delete(*keys)
        await r.aclose()
