"""``fleetgate serve`` with ``provider: {kind: kubernetes}``: the shipped path against the test API server.

The gateway is a real ``fleetgate serve`` process reading a kubeconfig (as outside a cluster); the API
server is tests/kubernetes/k8s_apiserver.py (test code, 127.0.0.1) and its pods are real engine processes.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from k8s_apiserver import ApiServer, FakeCluster

from fleetgate.providers.kubernetes import KubernetesProvider
from integration_tools import integration_tools

pytestmark = pytest.mark.timeout(120)

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _replicas(session: aiohttp.ClientSession, url: str) -> set[str]:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    return set(re.findall(r'replica="([^"]+)"', text))


async def test_serve_routes_to_watched_pods_and_follows_changes(
    k8s: tuple[FakeCluster, ApiServer, KubernetesProvider], tmp_path: Path
) -> None:
    cluster, server, _ = k8s
    cluster.token = "serve-token"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "c", "cluster": {"server": server.url}}],
        "users": [{"name": "u", "user": {"token": "serve-token"}}],
        "contexts": [{"name": "t", "context": {"cluster": "c", "user": "u", "namespace": "llm"}}],
    }))  # fmt: skip
    config = tmp_path / "serve.yaml"
    deployment = {
        "model": "m",
        "provider": {"kind": "kubernetes", "deployment": "engine", "service": "engine", "port": "http"},
    }
    config.write_text(yaml.safe_dump({
        "gateway": {"port": _free_port()}, "deployments": [deployment], "ops": {"access_log": False},
    }))  # fmt: skip
    await cluster.wait_for(lambda: len(cluster.ready_urls()) == 2)
    tools = integration_tools()
    gw = tools.ServerProcess(
        [tools.PY, "-m", "fleetgate.cli", "serve", "--config", str(config)],
        name="fleetgate-serve",
        env={"KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": ""},
    )
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
        assert all(st != 401 for _t, _m, _p, st in cluster.requests)
    finally:
        gw.kill()
