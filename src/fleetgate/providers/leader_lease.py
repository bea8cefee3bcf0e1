"""The leader lease as a Kubernetes ``coordination.k8s.io/v1`` Lease (``leader.LeaseStore``).

``spec``: ``holderIdentity``, ``leaseDurationSeconds`` (whole seconds, rounded up), ``acquireTime`` and
``renewTime`` (MicroTime: RFC 3339 with microseconds, UTC), ``leaseTransitions``. Writes are compare-and-swap
on ``metadata.resourceVersion``: ``PUT`` of the object last read, which the API server refuses with 409
Conflict when another candidate wrote in between; ``POST`` answers 409 AlreadyExists when another created
it first. The API calls are the ``leases`` entries of ``kubernetes_rbac.API_CALLS``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fleetgate.core.leader import LeaseRecord
from fleetgate.providers.kubernetes import KubernetesError, KubernetesProvider
from fleetgate.providers.leader import LeaseConflict


def micro_time(t: float | None) -> str | None:
    """Wall-clock seconds as a Kubernetes MicroTime."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def lease_record(obj: dict[str, Any]) -> LeaseRecord:
    """A Lease object's spec as a record (absent fields: no holder, zero transitions)."""
    spec = obj.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_s=float(spec.get("leaseDurationSeconds") or 0),
        acquired_at=parse_micro_time(spec.get("acquireTime")),
        renewed_at=parse_micro_time(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
    )


def lease_spec(record: LeaseRecord) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "holderIdentity": record.holder,
        "leaseDurationSeconds": max(1, math.ceil(record.duration_s)),
        "leaseTransitions": record.transitions,
    }
    for key, value in (("acquireTime", record.acquired_at), ("renewTime", record.renewed_at)):
        if value is not None:
            spec[key] = micro_time(value)
    return spec


class KubernetesLeaseStore:
    """One Lease in the provider's namespace; ``api`` returns the provider's API client (connected when
    the replica provider started)."""

    def __init__(self, api: Callable[[], KubernetesProvider], name: str) -> None:
        self._api = api
        self.name = name
        self.description = f"Lease {name}"
        self._last: dict[str, Any] | None = None

    async def read(self) -> tuple[LeaseRecord | None, str | None]:
        obj = await self._api().get_lease(self.name)
        self._last = obj
        if obj is None:
            return None, None
        return lease_record(obj), str(obj["metadata"]["resourceVersion"])

    async def create(self, record: LeaseRecord) -> str:
        api = self._api()
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": api.namespace},
            "spec": lease_spec(record),
        }
        try:
            obj = await api.create_lease(body)
        except KubernetesError as exc:
            if exc.status == 409:
                raise LeaseConflict(str(exc)) from exc
            raise
        self._last = obj
        return str(obj["metadata"]["resourceVersion"])

    async def update(self, record: LeaseRecord, version: str) -> str:
        api = self._api()
        body: dict[str, Any] = copy.deepcopy(self._last) if self._last is not None else {}
        body.setdefault("apiVersion", "coordination.k8s.io/v1")
        body.setdefault("kind", "Lease")
        meta: dict[str, Any] = body.setdefault("metadata", {"name": self.name, "namespace": api.namespace})
        meta["resourceVersion"] = version
        spec: dict[str, Any] = dict(body.get("spec") or {})
        spec.update(lease_spec(record))
        body["spec"] = spec
        try:
            obj = await api.replace_lease(body)
        except KubernetesError as exc:
            if exc.status in (404, 409):
                raise LeaseConflict(str(exc)) from exc
            raise
        self._last = obj
        return str(obj["metadata"]["resourceVersion"])

    async def close(self) -> None:
        """Nothing of its own: the replica provider owns and closes the API client."""
