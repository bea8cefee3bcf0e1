"""SliceCache, the sans-IO half of the EndpointSlice watcher: events in, replica changes out."""

from __future__ import annotations

from typing import Any

import pytest

from fleetgate.providers.base import ReplicaStatus
from fleetgate.providers.kubernetes import KubernetesError
from fleetgate.providers.kubernetes_watch import ResourceExpired, SliceCache, replica_infos


def eps(name: str, port: int, rv: str, **cond: bool) -> dict[str, Any]:
    return {
        "kind": "EndpointSlice",
        "metadata": {"name": f"s-{name}", "resourceVersion": rv},
        "addressType": "IPv4",
        "ports": [{"name": "metrics", "port": 9000}, {"name": "http", "port": port}],
        "endpoints": [
            {"addresses": ["10.0.0.1"], "conditions": cond, "targetRef": {"kind": "Pod", "name": name}}
        ],
    }


def test_list_then_events_track_conditions_and_resource_version() -> None:
    cache = SliceCache(port_name="http")
    assert cache.reset({"metadata": {"resourceVersion": "10"}, "items": [eps("a", 8000, "9")]})
    assert cache.resource_version == "10"
    assert [(r.name, r.url, r.ready) for r in cache.replicas] == [("a", "http://10.0.0.1:8000", True)]

    # not ready yet: known, not routable
    assert cache.apply({"type": "ADDED", "object": eps("b", 8001, "11", ready=False, serving=False)})
    assert [i.status for i in replica_infos(cache.replicas)] == [
        ReplicaStatus.RUNNING,
        ReplicaStatus.STARTING,
    ]
    # serving but terminating: draining
    assert cache.apply(
        {"type": "MODIFIED", "object": eps("a", 8000, "12", ready=False, serving=True, terminating=True)}
    )
    assert replica_infos(cache.replicas)[0].status == ReplicaStatus.DRAINING
    # a MODIFIED that changes nothing routable is not a change, but the version moves on
    assert not cache.apply(
        {"type": "MODIFIED", "object": eps("a", 8000, "13", ready=False, serving=True, terminating=True)}
    )
    assert cache.resource_version == "13"
    # bookmark: only the version
    assert not cache.apply(
        {"type": "BOOKMARK", "object": {"kind": "EndpointSlice", "metadata": {"resourceVersion": "20"}}}
    )
    assert cache.resource_version == "20"
    assert cache.apply({"type": "DELETED", "object": eps("a", 8000, "21")})
    assert [r.name for r in cache.replicas] == ["b"]


def test_numbered_port_and_errors() -> None:
    cache = SliceCache(port_name=8001)
    cache.reset({"metadata": {"resourceVersion": "1"}, "items": [eps("a", 8000, "1"), eps("b", 8001, "1")]})
    assert [r.name for r in cache.replicas] == ["b"]
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version: 1 (5)"}
    with pytest.raises(ResourceExpired):
        cache.apply({"type": "ERROR", "object": gone})
    with pytest.raises(KubernetesError) as exc:
        cache.apply({"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "boom"}})
    assert exc.value.status == 500
