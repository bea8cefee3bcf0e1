"""A gateway cut off from the Kubernetes API server by a network partition, not a stopped listener.

Hosts (conftest.py): the test's namespace runs the test API server (tests/kubernetes/k8s_apiserver.py) and
its pods (real ``fleetgate engine sim`` processes); ``gw`` runs ``fleetgate serve``. Two links join them:
the control link, on which the API server listens, and the data link, on which the pods and the gateway
listen. Only the control link fails, as when the gateway's node loses the control plane but not its peers.

Unlike ``stop_http`` in tests/kubernetes (the server closes the watch: the gateway sees the end at once),
the open watch connection now just goes silent: nothing tells the gateway it is cut off. Two endings:

* ``stalled``: the server keeps the connection and writes events into it; TCP delivers them once the link
  is back, on the same connection;
* ``forgotten``: the server forgets the connection during the partition (``ss -K`` destroys its socket;
  the reset it sends is lost on the downed link), as after an API server restart or a load balancer that
  dropped the flow. Nothing will ever arrive on the gateway's end again: only the watch's TCP keepalive
  probe, answered by a reset, tells it. Before keepalive the gateway saw no change for 86 s after the link
  came back (its 90 s idle timeout); now a few seconds.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from k8s_apiserver import ApiServer, FakeCluster
from netns import PY, Host, Net, NsProcess

pytestmark = pytest.mark.timeout(120)

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def serve(host: Host, tmp: Path, api_url: str, listen_ip: str) -> NsProcess:
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "c", "cluster": {"server": api_url}}],
        "users": [{"name": "u", "user": {"token": "serve-token"}}],
        "contexts": [{"name": "t", "context": {"cluster": "c", "user": "u", "namespace": "llm"}}],
    }))  # fmt: skip
    deployment = {
        "model": "m",
        "provider": {"kind": "kubernetes", "deployment": "engine", "service": "engine", "port": "http"},
        "leader_election": {"lease_duration_s": 2.0, "renew_deadline_s": 1.5, "retry_period_s": 0.5},
    }
    cfg = tmp / "serve.yaml"
    cfg.write_text(yaml.safe_dump({
        "gateway": {"host": listen_ip, "port": 8080, "metrics_auth": "none"}, "deployments": [deployment],
        "ops": {"access_log": False},
    }))  # fmt: skip
    env = {"KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": ""}
    return NsProcess(host, [PY, "-m", "fleetgate.cli", "serve", "--config", str(cfg)], "gateway", env)


def destroy_sockets(local: str) -> None:
    """Close this namespace's TCP sockets bound to ``local`` at once (``ss -K``: the kernel forgets them)."""
    subprocess.run(["ss", "-K", "-tn", "src", local], check=True, capture_output=True, timeout=10)


async def metrics(s: aiohttp.ClientSession, url: str) -> str:
    async with s.get(url + "/metrics") as r:
        return await r.text()


async def replicas(s: aiohttp.ClientSession, url: str) -> set[str]:
    return set(re.findall(r'replica="([^"]+)"', await metrics(s, url)))


async def leads(s: aiohttp.ClientSession, url: str) -> bool:
    return re.search(r'^fleetgate_leader\{deployment="m"\} 1\.0$', await metrics(s, url), re.M) is not None


def watch_connections(gw: Host, api_ip: str, port: int) -> set[str]:
    """Local ends of the gateway's established connections to the API server (``ss`` in its namespace)."""
    out = subprocess.run(
        gw.cmd(["ss", "-Htn", "state", "established", "dst", f"{api_ip}:{port}"]),
        capture_output=True, text=True, check=True, timeout=10,
    ).stdout  # fmt: skip
    return {line.split()[2] for line in out.splitlines() if line.strip()}


@pytest.mark.parametrize("server_side", ["stalled", "forgotten"])
async def test_cut_from_the_api_server_keeps_routing_and_catches_up_after(
    net: Net, tmp_path: Path, server_side: str
) -> None:
    """During a 3 s partition: every request is answered 200 over the last known pods, the gateway stops
    leading (its Lease renewals go unanswered); a pod added meanwhile reaches the gateway after the link is
    back (within 15 s), it is routed to, and the gateway leads again."""
    gw = net.host("gw")
    data, ctl = net.link(net.root, gw), net.link(net.root, gw)
    engine = [PY, "-m", "fleetgate.cli", "engine", "sim", "--host", data.a_ip, "--port", "0", "--model", "m"]
    cluster = FakeCluster(
        replicas=2, bookmark_interval_s=0.3, termination_grace_s=0.3, pod_ip=data.a_ip, engine_command=engine
    )
    cluster.token = "serve-token"
    server = ApiServer(cluster, host=ctl.a_ip)
    await cluster.start()
    await server.start_http()
    proc = serve(gw, tmp_path, server.url, data.b_ip)
    try:
        await cluster.wait_for(lambda: len(cluster.ready_urls()) == 2, 30.0)
        url = await asyncio.to_thread(proc.wait_ready, 60.0)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
            sent = iter(range(10**6))

            async def ok() -> bool:
                # a different prompt each time: the router's prefix affinity would send repeats to one pod
                body = {**BODY, "messages": [{"role": "user", "content": f"hello {next(sent)} " * 8}]}
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    return r.status == 200 and bool((await r.json())["choices"])

            deadline = time.monotonic() + 15
            while not set(cluster.pods) <= await replicas(s, url) or not await leads(s, url):
                assert time.monotonic() < deadline, proc.output[-2000:]
                await asyncio.sleep(0.1)
            assert all(await asyncio.gather(*(ok() for _ in range(4))))
            before = watch_connections(gw, ctl.a_ip, server.port)
            assert before, "no open watch"
            known = set(cluster.pods)

            ctl.cut(far=net.root)
            cut = time.monotonic()
            during: list[bool] = []
            while time.monotonic() - cut < 3.0:
                during += await asyncio.gather(*(ok() for _ in range(2)))
            assert during and all(during)
            assert not await leads(s, url), "a gateway cut off from its Lease went on leading"
            cluster.scale(3)  # events the server writes into the silent watch
            await cluster.wait_for(lambda: len(cluster.ready_urls()) == 3, 20.0)
            assert not set(cluster.pods) <= await replicas(s, url), "news crossed a downed link"

            if server_side == "forgotten":
                destroy_sockets(f"{ctl.a_ip}:{server.port}")
            ctl.heal(far=net.root)
            healed = time.monotonic()
            while not set(cluster.pods) <= await replicas(s, url):
                assert time.monotonic() - healed < 15.0, "the gateway did not catch up after the partition"
                await asyncio.sleep(0.1)
            caught_up = time.monotonic() - healed
            after = watch_connections(gw, ctl.a_ip, server.port)
            if server_side == "stalled":
                assert before & after, "the stalled watch connection did not survive the partition"
            else:
                assert not before & after, "a forgotten connection still counted as open"
            while not await leads(s, url):
                assert time.monotonic() - healed < 20.0, "the gateway did not lead again"
                await asyncio.sleep(0.1)
            (new,) = set(cluster.pods) - known
            served_before = await served(s, url, new)
            assert all(await asyncio.gather(*(ok() for _ in range(12))))
            assert await served(s, url, new) > served_before, "the new pod got no request"
        print(f"{server_side}: {len(during)} requests answered; caught up {caught_up:.2f} s after the heal")
    finally:
        proc.kill()
        await server.stop_http()
        await cluster.close()


async def served(s: aiohttp.ClientSession, url: str, replica: str) -> float:
    """Requests the gateway sent to ``replica`` (a pod name), by its request counter."""
    total = 0.0
    for line in (await metrics(s, url)).splitlines():
        if line.startswith("fleetgate_requests_total{") and f'replica="{replica}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total
