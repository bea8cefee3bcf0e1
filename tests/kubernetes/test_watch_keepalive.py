"""The EndpointSlice watch's connection has TCP keepalive on (no root needed; tests/netfaults shows why).

A watch is a long GET on which the gateway never sends again: if the server forgets the connection while
the network is partitioned, only a keepalive probe, answered by a reset, ends the gateway's side before the
idle timeout. Checked on the socket itself, as the kernel reports it (``ss -o``: a ``keepalive`` timer).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

import pytest
from k8s_apiserver import ApiServer, FakeCluster

from fleetgate.providers.kubernetes import KubernetesProvider
from fleetgate.providers.kubernetes_watch import EndpointSliceWatcher

pytestmark = pytest.mark.timeout(60)


def watch_timers(port: int) -> list[str]:
    """``ss -o`` lines of the established connections to the API server's port."""
    out = subprocess.run(
        ["ss", "-Htno", "state", "established", "dst", f"127.0.0.1:{port}"],
        capture_output=True, text=True, check=True, timeout=10,
    ).stdout  # fmt: skip
    return [line for line in out.splitlines() if line.strip()]


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to read the socket's timers")
async def test_the_watch_connection_has_tcp_keepalive() -> None:
    cluster = FakeCluster(replicas=0, bookmark_interval_s=5.0)
    server = ApiServer(cluster)
    await cluster.start()
    await server.start_http()
    provider = KubernetesProvider(
        api_base=server.url, namespace="llm", deployment="engine", service="engine", port_name="http"
    )
    watcher = EndpointSliceWatcher(provider)
    watcher.start()
    try:
        await asyncio.wait_for(watcher.synced.wait(), 10.0)
        deadline = time.monotonic() + 10.0
        while True:
            lines = watch_timers(server.port)
            if any("keepalive" in line for line in lines):
                break
            assert time.monotonic() < deadline, lines
            await asyncio.sleep(0.05)
    finally:
        await watcher.stop()
        await provider.close()
        await server.stop_http()
        await cluster.close()
