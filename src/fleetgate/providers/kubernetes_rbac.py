"""Every Kubernetes API call the gateway makes, as RBAC sees it (API group, resource, verb).

Kept next to the code that makes the calls (``kubernetes.KubernetesProvider``, the EndpointSlice watch, the
leader Lease): deploy/k8s/gateway.yaml's Role grants exactly these, tests/unit/test_k8s_manifests.py checks
the Role against this list, and tests/kubernetes/test_rbac.py checks this list against the calls the test API
server saw the provider and the leader election make.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class ApiCall:
    """One RBAC permission: ``verb`` on ``resource`` (``deployments/scale`` for a subresource) of ``group``
    (``""`` is the core group); ``named`` when every such call names the object, so that a Role can narrow it
    by ``resourceNames`` where the name is known ahead (the Deployment, the Lease; not pods)."""

    group: str
    resource: str
    verb: str
    named: bool


API_CALLS: tuple[ApiCall, ...] = (
    # discovery: the engine Service's EndpointSlices, listed then watched (kubernetes_watch.py)
    ApiCall("discovery.k8s.io", "endpointslices", "list", named=False),
    ApiCall("discovery.k8s.io", "endpointslices", "watch", named=False),
    # scaling: the engine Deployment's scale subresource, read and merge-patched
    ApiCall("apps", "deployments/scale", "get", named=True),
    ApiCall("apps", "deployments/scale", "patch", named=True),
    # drain (pod-deletion-cost annotation) and remediation (delete the hung pod)
    ApiCall("", "pods", "patch", named=True),
    ApiCall("", "pods", "delete", named=True),
    # leader election: the Lease `fleetgate-<deployment>` (leader_lease.py); create cannot name an object
    ApiCall("coordination.k8s.io", "leases", "create", named=False),
    ApiCall("coordination.k8s.io", "leases", "get", named=True),
    ApiCall("coordination.k8s.io", "leases", "update", named=True),
)


def lease_name(deployment: str) -> str:
    """The leader Lease of an engine Deployment (one leader per Deployment that the gateways scale)."""
    return f"fleetgate-{deployment}"
