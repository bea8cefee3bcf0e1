"""The test API server (k8s_apiserver.py, 127.0.0.1 only) with two engine pods, and a provider on it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from k8s_apiserver import ApiServer, FakeCluster

from fleetgate.providers.kubernetes import KubernetesProvider


@pytest.fixture
async def k8s() -> AsyncIterator[tuple[FakeCluster, ApiServer, KubernetesProvider]]:
    cluster = FakeCluster(replicas=2, bookmark_interval_s=0.3, termination_grace_s=0.5)
    server = ApiServer(cluster)
    await cluster.start()
    await server.start_http()
    provider = KubernetesProvider(
        api_base=server.url, namespace="llm", deployment="engine", service="engine", port_name="http"
    )
    try:
        yield cluster, server, provider
    finally:
        await provider.close()
        await server.stop_http()
        await cluster.close()
