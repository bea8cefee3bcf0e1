"""The test API server's own semantics that later consumers rely on (Lease optimistic concurrency, scale
subresource errors), checked over HTTP as a client would see them. Test code against test code: it pins
what tests/kubernetes/k8s_apiserver.py promises, written from the Kubernetes API documentation."""

from __future__ import annotations

import aiohttp
from k8s_apiserver import ApiServer, FakeCluster

from fleetgate.providers.kubernetes import KubernetesProvider

LEASES = "/apis/coordination.k8s.io/v1/namespaces/llm/leases"
SCALE = "/apis/apps/v1/namespaces/llm/deployments/engine/scale"


async def test_lease_optimistic_concurrency_and_scale_errors(
    k8s: tuple[FakeCluster, ApiServer, KubernetesProvider],
) -> None:
    _cluster, server, _ = k8s
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "fleetgate-m"},
        "spec": {"holderIdentity": "gw-a", "leaseDurationSeconds": 15},
    }
    async with aiohttp.ClientSession(base_url=server.url) as s:
        async with s.post(LEASES, json=lease) as r:
            assert r.status == 201
            created = await r.json()
        async with s.post(LEASES, json=lease) as r:
            assert r.status == 409 and (await r.json())["reason"] == "AlreadyExists"
        # two gateways read the same version; the first replace wins, the second gets a Conflict
        a = {**created, "spec": {**created["spec"], "holderIdentity": "gw-a"}}
        b = {**created, "spec": {**created["spec"], "holderIdentity": "gw-b"}}
        async with s.put(f"{LEASES}/fleetgate-m", json=a) as r:
            assert r.status == 200
            renewed = await r.json()
        assert int(renewed["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
        async with s.put(f"{LEASES}/fleetgate-m", json=b) as r:
            assert r.status == 409 and (await r.json())["reason"] == "Conflict"
        async with s.get(f"{LEASES}/fleetgate-m") as r:
            assert (await r.json())["spec"]["holderIdentity"] == "gw-a"

        async with s.patch(SCALE, json={"spec": {"replicas": 3}}) as r:  # application/json: not a merge patch
            assert r.status == 415
        headers = {"Content-Type": "application/merge-patch+json"}
        async with s.patch(SCALE, data=b'{"spec": {"replicas": -1}}', headers=headers) as r:
            assert r.status == 422 and (await r.json())["reason"] == "Invalid"
