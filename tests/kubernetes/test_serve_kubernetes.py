"""``fleetgate serve`` with ``provider: {kind: kubernetes}``: the shipped path against the test API server.

The gateway is a real ``fleetgate serve`` process reading a kubeconfig (as outside a cluster); the API
server is tests/kubernetes/k8s_apiserver.py (test code, 127.0.0.1) and its pods are real engine processes.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from k8s_apiserver import ApiServer, FakeCluster
from k8s_gateways import serve_files, start_serve

from fleetgate.providers.kubernetes import KubernetesProvider

pytestmark = pytest.mark.timeout(120)

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


async def _replicas(session: aiohttp.ClientSession, url: str) -> set[str]:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    return set(re.findall(r'replica="([^"]+)"', text))


def _start_serve(cluster: FakeCluster, server: ApiServer, tmp_path: Path) -> Any:
    cluster.token = "serve-token"
    # short enough that the 3 s outage below outlasts the renew deadline
    election = {"lease_duration_s": 2.0, "renew_deadline_s": 1.5, "retry_period_s": 0.5}
    config, env = serve_files(
        tmp_path, server.url, token="serve-token", deployment={"leader_election": election}
    )
    return start_serve(config, env)


async def _metrics(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as r:
        return await r.text()


async def _healthy(session: aiohttp.ClientSession, url: str, replica: str) -> bool:
    """The gateway's prober holds ``replica`` healthy (its ``fleetgate_health_state`` gauge)."""
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    return any(
        line.startswith("fleetgate_health_state{")
        and f'replica="{replica}"' in line
        and 'state="healthy"' in line
        and float(line.rsplit(" ", 1)[1]) == 1.0
        for line in text.splitlines()
    )


async def test_serve_routes_to_watched_pods_and_follows_changes(
    k8s: tuple[FakeCluster, ApiServer, KubernetesProvider], tmp_path: Path
) -> None:
    cluster, server, _ = k8s
    await cluster.wait_for(lambda: len(cluster.ready_urls()) == 2)
    gw = _start_serve(cluster, server, tmp_path)
    try:
        url = await asyncio.to_thread(gw.wait_ready, 60.0)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:

            async def ok() -> bool:
                async with s.post(url + "/v1/chat/completions", json=BODY) as r:
                    return r.status == 200 and bool((await r.json())["choices"])

            assert all(await asyncio.gather(*(ok() for _ in range(8)))), gw.output[-2000:]
            pods = set(cluster.pods)
            assert pods <= await _replicas(s, url)

            # a pod deleted (and replaced) while requests keep coming: none of them fails
            doomed = sorted(pods)[0]
            cluster.delete_pod(doomed)
            results: list[bool] = []
            deadline = time.monotonic() + 30
            while (
                not (len(cluster.ready_urls()) == 2 and doomed not in cluster.pods)
                and time.monotonic() < deadline
            ):
                results += await asyncio.gather(*(ok() for _ in range(2)))
            assert results and all(results)
            new = set(cluster.pods) - pods
            assert new
            deadline = time.monotonic() + 10
            while not new <= await _replicas(s, url):
                assert time.monotonic() < deadline, "the replacement pod never reached the gateway"
                await asyncio.sleep(0.1)
            assert all(await asyncio.gather(*(ok() for _ in range(8))))

            # the API server away for a few seconds: routing goes on over the last known pods ...
            await server.stop_http()
            t_end = time.monotonic() + 3.0
            during: list[bool] = []
            while time.monotonic() < t_end:
                during += await asyncio.gather(*(ok() for _ in range(2)))
            assert during and all(during)
            # the gateway could not renew its Lease: it no longer leads (no scaling, no pod deletion) ...
            assert re.search(r'^fleetgate_leader\{deployment="m"\} 0\.0$', await _metrics(s, url), re.M)
            # ... and what changed meanwhile reaches the gateway once it is back
            cluster.scale(3)
            await cluster.wait_for(lambda: len(cluster.ready_urls()) == 3)
            await server.start_http()
            deadline = time.monotonic() + 15
            while not set(cluster.pods) <= await _replicas(s, url):
                assert time.monotonic() < deadline, "the gateway did not resync after the outage"
                await asyncio.sleep(0.1)
            assert all(await asyncio.gather(*(ok() for _ in range(8))))
            # and it leads again (its Lease re-taken): it may scale and heal after the outage
            while not re.search(r'^fleetgate_leader\{deployment="m"\} 1\.0$', await _metrics(s, url), re.M):
                assert time.monotonic() < deadline + 5, "the gateway did not lead again after the outage"
                await asyncio.sleep(0.1)
        assert all(st != 401 for _t, _m, _p, st in cluster.requests)
    finally:
        gw.kill()


async def test_serve_deletes_a_hung_pod_and_routes_to_its_replacement(
    k8s: tuple[FakeCluster, ApiServer, KubernetesProvider], tmp_path: Path
) -> None:
    """A pod that hangs (its /health still 200, so its readiness stays true) is found by the gateway's
    prober with the real health defaults, its pod deleted (remediation: delete_pod, the kubernetes default),
    the ReplicaSet's replacement routed to within 30 s; the healthy pod is never deleted and requests keep
    succeeding."""
    cluster, server, _ = k8s
    await cluster.wait_for(lambda: len(cluster.ready_urls()) == 2)
    gw = _start_serve(cluster, server, tmp_path)
    try:
        url = await asyncio.to_thread(gw.wait_ready, 60.0)
        victim, other = sorted(cluster.pods)
        victim_port = cluster.pods[victim].port
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            async with s.post(f"http://127.0.0.1:{victim_port}/admin/fault", json={"kind": "hang"}) as r:
                assert r.status == 200
            t0 = time.monotonic()
            results: list[int] = []

            async def one() -> None:
                async with s.post(url + "/v1/chat/completions", json=BODY) as r:
                    await r.read()
                    results.append(r.status)

            traffic: list[asyncio.Task[None]] = []
            served = None
            while time.monotonic() - t0 < 35.0:
                traffic.append(asyncio.create_task(one()))
                new = set(cluster.pods) - {victim, other}
                if victim in cluster.deleted_pods and new and all([await _healthy(s, url, n) for n in new]):
                    served = time.monotonic() - t0
                    break
                await asyncio.sleep(0.5)
            await asyncio.gather(*traffic)
            assert served is not None and served <= 30.0, gw.output[-3000:]
            assert cluster.deleted_pods == [victim], "only the hung pod was deleted"
            assert results and all(st == 200 for st in results), results
        print(f"hung pod: deleted and replacement routable after {served:.1f} s")
    finally:
        gw.kill()
