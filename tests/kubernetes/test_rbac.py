"""The RBAC list (providers/kubernetes_rbac.API_CALLS, which deploy/k8s's Role grants) is what the gateway
really calls: every request the test API server sees while the provider discovers, scales, drains and
remediates and while the leader elector creates, reads and renews its Lease maps onto an entry of the list,
and every entry is used."""

from __future__ import annotations

import asyncio
import re
from urllib.parse import parse_qs, urlsplit

from k8s_apiserver import ApiServer, FakeCluster

from fleetgate.core.leader import ElectionTiming, LeaderElection
from fleetgate.providers.base import ReplicaStatus
from fleetgate.providers.kubernetes import KubernetesProvider
from fleetgate.providers.kubernetes_rbac import API_CALLS, ApiCall, lease_name
from fleetgate.providers.kubernetes_replicas import KubernetesReplicaProvider
from fleetgate.providers.leader import LeaderElector
from fleetgate.providers.leader_lease import KubernetesLeaseStore

PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)/namespaces/[^/]+/(?P<res>[^/]+)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def rbac_call(method: str, path_qs: str) -> ApiCall:
    """A request as the API server's authorizer sees it: group, resource[/subresource], verb, named."""
    url = urlsplit(path_qs)
    m = PATH.match(url.path)
    assert m is not None, path_qs
    resource = m["res"] + (f"/{m['sub']}" if m["sub"] else "")
    named = m["name"] is not None
    if method == "GET":
        verb = (
            "get" if named else ("watch" if parse_qs(url.query).get("watch") in (["1"], ["true"]) else "list")
        )
    else:
        verb = VERBS[method]
    return ApiCall(m["group"] or "", resource, verb, named)


async def test_every_call_is_in_the_rbac_list_and_every_entry_is_used() -> None:
    cluster = FakeCluster(replicas=2, bookmark_interval_s=0.3, termination_grace_s=0.3)
    server = ApiServer(cluster)
    await cluster.start()
    await server.start_http()
    api = KubernetesProvider(
        api_base=server.url, namespace="llm", deployment="engine", service="engine", port_name="http"
    )
    provider = KubernetesReplicaProvider(api, drain_timeout_s=1.0)
    elector = LeaderElector(
        KubernetesLeaseStore(lambda: provider.api, lease_name("engine")),
        LeaderElection("me", ElectionTiming(3.0, 2.0, 0.5)),
        deployment="engine",
    )
    try:
        await cluster.wait_for(lambda: len(cluster.ready_urls()) == 2)
        await provider.start()
        await elector.step()  # create
        await elector.step()  # get + update (renew)
        assert elector.is_leader()
        running = [r for r in await provider.list() if r.status == ReplicaStatus.RUNNING]
        assert len(running) == 2
        await provider.drain(running[1].name)  # patch pod (deletion cost)
        await provider.restart(running[0].name)  # delete pod
        await provider.scale_to(1)  # get scale, patch scale
        await asyncio.sleep(0.5)  # the watch is open meanwhile
    finally:
        await elector.stop()
        await provider.stop()
        await server.stop_http()
        await cluster.close()
    seen = {rbac_call(method, path) for _t, method, path, _status in cluster.requests}
    assert seen <= set(API_CALLS), f"calls the Role does not grant: {sorted(seen - set(API_CALLS))}"
    assert set(API_CALLS) <= seen, f"listed but never made: {sorted(set(API_CALLS) - seen)}"
