"""Kubernetes replica provider on the maintained client (``kubernetes_asyncio``'s ``ApiClient``).

* scale: the Deployment's ``scale`` subresource (``GET``/``PATCH
  /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale``, body ``autoscaling/v1 Scale``; the patch is a JSON
  merge patch ``{"spec": {"replicas": N}}``), so only the replica count is touched, never the pod template;
* discovery: the Service's EndpointSlices (``discovery.k8s.io/v1``, label ``kubernetes.io/service-name``),
  honouring ``conditions.ready`` (nil means ready, as the API documents) and ``terminating``;
* remediation: ``DELETE /api/v1/namespaces/{ns}/pods/{pod}`` (the ReplicaSet replaces the pod);
* drain: the pod gets ``controller.kubernetes.io/pod-deletion-cost: "-1000"`` so that the next scale-down
  removes it first (the gateway has already stopped routing to it).

In a pod, :meth:`KubernetesProvider.in_cluster` reads the service-account token (re-read periodically: bound
tokens rotate), the cluster CA and the namespace from ``/var/run/secrets/kubernetes.io/serviceaccount``.
RBAC needed: exactly ``kubernetes_rbac.API_CALLS`` (scale get+patch, EndpointSlices list+watch, pods
patch+delete, the leader Lease create/get/update; deploy/k8s/gateway.yaml has the Role). Discovery by
watch (``kubernetes_watch.EndpointSliceWatcher``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp
import orjson

from fleetgate.providers.base import ReplicaCounts

# imported where used: the client takes ~0.3 s to import, which a gateway without kubernetes never pays
if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s_client

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
FIELD_MANAGER = "fleetgate"


class KubernetesError(Exception):
    """The API server refused a request; ``status`` is its HTTP status, ``reason`` the Status reason.

    ``retry_after_s`` is the server's ``Retry-After`` (a 429 from API priority and fairness, a 503), if any.
    """

    def __init__(
        self, message: str, *, status: int, reason: str = "", retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s


def _set_token(cfg: k8s_client.Configuration, token: str | None) -> None:
    cfg.api_key["BearerToken"] = token or ""
    cfg.api_key_prefix["BearerToken"] = "Bearer"


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` in seconds (the API server sends delta-seconds); None when absent or not a number."""
    if not value:
        return None
    try:
        return max(0.0, float(value.strip()))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class KubeReplica:
    """One endpoint of the engine Service: a pod with its address and readiness."""

    name: str
    url: str
    ready: bool
    serving: bool
    terminating: bool
    node: str | None = None
    zone: str | None = None


@dataclass(frozen=True, slots=True)
class ScaleInfo:
    """The Deployment's scale subresource: desired (``spec``) and observed (``status``) replicas."""

    spec_replicas: int
    status_replicas: int
    selector: str | None


def scale_patch(replicas: int) -> dict[str, Any]:
    """The JSON merge patch that sets ``spec.replicas`` of an ``autoscaling/v1`` Scale."""
    if replicas < 0:
        raise ValueError("replicas must be >= 0")
    return {"spec": {"replicas": int(replicas)}}


def parse_scale(obj: Mapping[str, Any]) -> ScaleInfo:
    """Read an ``autoscaling/v1`` Scale (``spec.replicas`` is optional in the schema: absent means 0)."""
    if obj.get("kind") not in (None, "Scale"):
        raise ValueError(f"expected a Scale, got kind {obj.get('kind')!r}")
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return ScaleInfo(
        spec_replicas=int(spec.get("replicas") or 0),
        status_replicas=int(status.get("replicas") or 0),
        selector=status.get("selector"),
    )


def _host_for_url(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def parse_endpoint_slices(
    obj: Mapping[str, Any], *, port_name: str | int | None = None, scheme: str = "http"
) -> list[KubeReplica]:
    """Replicas from an ``EndpointSliceList`` (or one ``EndpointSlice``), deduplicated by pod.

    ``conditions.ready``/``serving`` nil means true and ``terminating`` nil means false (API documentation);
    FQDN slices are skipped (deprecated, no defined semantics); the port is the one named ``port_name`` (the
    one with that number, given an int), else the slice's first port.
    """
    slices = obj.get("items") if obj.get("kind") != "EndpointSlice" else [obj]
    out: dict[str, KubeReplica] = {}
    for sl in slices or []:
        if sl.get("addressType") not in ("IPv4", "IPv6"):
            continue
        ports = sl.get("ports") or []
        port: int | None = None
        for p in ports:
            if port_name is None or p.get("name" if isinstance(port_name, str) else "port") == port_name:
                port = p.get("port")
                break
        if port is None:
            continue
        for ep in sl.get("endpoints") or []:
            addresses = ep.get("addresses") or []
            if not addresses:
                continue
            cond = ep.get("conditions") or {}
            ready = cond.get("ready")
            serving = cond.get("serving")
            terminating = cond.get("terminating")
            ready_b = True if ready is None else bool(ready)
            serving_b = ready_b if serving is None else bool(serving)
            term_b = False if terminating is None else bool(terminating)
            ref = ep.get("targetRef") or {}
            ref_name = ref.get("name")
            name = str(ref_name) if ref.get("kind", "Pod") == "Pod" and ref_name else str(addresses[0])
            replica = KubeReplica(
                name=name,
                url=f"{scheme}://{_host_for_url(addresses[0])}:{port}",
                ready=ready_b and not term_b,
                serving=serving_b,
                terminating=term_b,
                node=ep.get("nodeName"),
                zone=ep.get("zone"),
            )
            prev = out.get(name)
            if prev is None or (replica.ready and not prev.ready):
                out[name] = replica
    return sorted(out.values(), key=lambda r: r.name)


class KubernetesProvider:
    """Scales one Deployment and discovers its pods through the Service's EndpointSlices.

    Requests go through the maintained client, ``kubernetes_asyncio`` (its ``ApiClient``: authentication,
    token refresh hooks, TLS, kubeconfig-built configurations); responses are read as JSON and parsed here,
    so the watch loop sees the API server's own events and statuses.
    """

    def __init__(
        self,
        *,
        api_base: str | None = None,
        namespace: str,
        deployment: str,
        service: str,
        port_name: str | int | None = None,
        token: str | Callable[[], str | None] | None = None,
        ca_file: str | Path | None = None,
        verify_tls: bool = True,
        configuration: k8s_client.Configuration | None = None,
        request_timeout_s: float = 10.0,
        scheme: str = "http",
        delete_grace_period_s: int | None = None,
    ) -> None:
        """``configuration`` (e.g. from a kubeconfig) wins; else ``api_base`` with ``token`` (a string or a
        callable re-read before each request) and ``ca_file`` (PEM bundle) / ``verify_tls``."""
        if configuration is None:
            if api_base is None:
                raise ValueError("KubernetesProvider needs api_base or a client configuration")
            from kubernetes_asyncio import client as k8s_client

            configuration = k8s_client.Configuration(host=api_base.rstrip("/"))
            if callable(token):
                read = token
                # the client asks the hook before each request, but only once a key is present
                _set_token(configuration, "")
                configuration.refresh_api_key_hook = lambda cfg: _set_token(cfg, read())
            elif token:
                _set_token(configuration, token)
            if ca_file is not None:
                configuration.ssl_ca_cert = str(ca_file)
            configuration.verify_ssl = verify_tls
        self.configuration = configuration
        self.api_base = str(configuration.host).rstrip("/")
        self.namespace = namespace
        self.deployment = deployment
        self.service = service
        self.port_name = port_name
        self.request_timeout_s = request_timeout_s
        self.scheme = scheme
        self.delete_grace_period_s = delete_grace_period_s
        self._client: k8s_client.ApiClient | None = None

    @classmethod
    def in_cluster(
        cls,
        *,
        deployment: str,
        service: str,
        port_name: str | int | None = None,
        namespace: str | None = None,
        sa_dir: Path = SERVICE_ACCOUNT_DIR,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> KubernetesProvider:
        """Configure from the pod's service account and the ``KUBERNETES_SERVICE_*`` environment."""
        env = os.environ if env is None else env
        host = env.get("KUBERNETES_SERVICE_HOST")
        port = env.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise RuntimeError("not running in a Kubernetes pod: KUBERNETES_SERVICE_HOST is not set")
        ns = namespace or (sa_dir / "namespace").read_text().strip()
        token_file = sa_dir / "token"
        cache: dict[str, Any] = {"at": -1e18, "token": None}

        def token() -> str | None:
            # Bound service-account tokens rotate (about hourly): re-read at most once a minute.
            now = time.monotonic()
            if now - cache["at"] > 60.0:
                cache["token"] = token_file.read_text().strip()
                cache["at"] = now
            tok: str | None = cache["token"]
            return tok

        return cls(
            api_base=f"https://{_host_for_url(host)}:{port}",
            namespace=ns,
            deployment=deployment,
            service=service,
            port_name=port_name,
            token=token,
            ca_file=sa_dir / "ca.crt",
            **kwargs,
        )

    # -- HTTP ----------------------------------------------------------------------------------------------

    @property
    def api_client(self) -> k8s_client.ApiClient:
        if self._client is None:
            from kubernetes_asyncio import client as k8s_client

            self._client = k8s_client.ApiClient(self.configuration)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
        self._client = None

    async def _response(self, method: str, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        """One call through the client's ``call_api`` (auth settings applied), the raw response back."""
        headers = {"Accept": "application/json"}
        ctype = kwargs.pop("content_type", None)
        if ctype:
            headers["Content-Type"] = ctype
        resp: aiohttp.ClientResponse = await self.api_client.call_api(
            path,
            method,
            query_params=list((kwargs.pop("params", None) or {}).items()),
            header_params=headers,
            body=kwargs.pop("body", None),
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=kwargs.pop("timeout", None),
        )
        return resp

    @staticmethod
    async def _raise_for_status(method: str, path: str, resp: aiohttp.ClientResponse) -> bytes:
        raw = await resp.read()
        if resp.status >= 400:
            reason, message = "", raw.decode(errors="replace")[:300]
            try:
                st = orjson.loads(raw)
                reason, message = st.get("reason", ""), st.get("message", message)
            except (orjson.JSONDecodeError, AttributeError):
                pass
            raise KubernetesError(
                f"{method} {path}: HTTP {resp.status} {reason}: {message}",
                status=resp.status,
                reason=reason,
                retry_after_s=retry_after_seconds(resp.headers.get("Retry-After")),
            )
        return raw

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
    ) -> Any:
        async with asyncio.timeout(self.request_timeout_s):
            resp = await self._response(method, path, params=params, body=body, content_type=content_type)
            try:
                raw = await self._raise_for_status(method, path, resp)
            finally:
                resp.release()
        return orjson.loads(raw) if raw else None

    @contextlib.asynccontextmanager
    async def open_stream(
        self, path: str, *, params: Mapping[str, str], idle_timeout_s: float
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """``async with provider.open_stream(path, ...) as resp``: a long-lived GET (a watch).

        No total timeout (a watch lasts its ``timeoutSeconds``); silence longer than ``idle_timeout_s``
        fails the read, so a half-open connection is noticed.
        """
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.request_timeout_s, sock_read=idle_timeout_s
        )
        resp = await self._response("GET", path, params=params, timeout=timeout)
        try:
            yield resp
        finally:
            resp.close()

    async def list_slices(self) -> Any:
        """The Service's ``EndpointSliceList`` (with ``metadata.resourceVersion``, where a watch starts)."""
        return await self._request("GET", self.slices_path, params={"labelSelector": self.slice_selector})

    # -- paths ---------------------------------------------------------------------------------------------

    @property
    def scale_path(self) -> str:
        return f"/apis/apps/v1/namespaces/{quote(self.namespace)}/deployments/{quote(self.deployment)}/scale"

    @property
    def slice_selector(self) -> str:
        return f"{SERVICE_NAME_LABEL}={self.service}"

    @property
    def slices_path(self) -> str:
        return f"/apis/discovery.k8s.io/v1/namespaces/{quote(self.namespace)}/endpointslices"

    def pod_path(self, pod: str) -> str:
        return f"/api/v1/namespaces/{quote(self.namespace)}/pods/{quote(pod)}"

    # -- provider API --------------------------------------------------------------------------------------

    async def get_scale(self) -> ScaleInfo:
        return parse_scale(await self._request("GET", self.scale_path))

    async def scale_to(self, replicas: int) -> ScaleInfo:
        """Set the Deployment's desired replicas through the scale subresource (JSON merge patch)."""
        obj = await self._request(
            "PATCH",
            self.scale_path,
            params={"fieldManager": FIELD_MANAGER},
            body=scale_patch(replicas),
            content_type="application/merge-patch+json",
        )
        return parse_scale(obj)

    async def endpoints(self) -> list[KubeReplica]:
        """Every endpoint of the Service, ready or not."""
        obj = await self._request(
            "GET", self.slices_path, params={"labelSelector": f"{SERVICE_NAME_LABEL}={self.service}"}
        )
        return parse_endpoint_slices(obj or {}, port_name=self.port_name, scheme=self.scheme)

    async def list(self) -> list[KubeReplica]:
        """Replicas ready to receive traffic (``conditions.ready``, not terminating)."""
        return [r for r in await self.endpoints() if r.ready]

    async def counts(self) -> ReplicaCounts:
        """Target, ready and starting replicas for the autoscaler loop."""
        scale, eps = await asyncio.gather(self.get_scale(), self.endpoints())
        ready = sum(1 for r in eps if r.ready)
        return ReplicaCounts(
            current=scale.spec_replicas, ready=ready, starting=max(0, scale.spec_replicas - ready)
        )

    async def restart(self, name: str) -> None:
        """Delete the pod; its ReplicaSet creates a fresh one (a 404 means it is already gone)."""
        body: dict[str, Any] | None = None
        if self.delete_grace_period_s is not None:
            body = {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "gracePeriodSeconds": self.delete_grace_period_s,
            }
        try:
            await self._request("DELETE", self.pod_path(name), body=body)
        except KubernetesError as exc:
            if exc.status != 404:
                raise

    async def drain(self, name: str) -> None:
        """Mark the pod cheapest to remove, so the next scale-down takes it (routing already stopped)."""
        patch = {"metadata": {"annotations": {DELETION_COST_ANNOTATION: "-1000"}}}
        await self._request(
            "PATCH",
            self.pod_path(name),
            params={"fieldManager": FIELD_MANAGER},
            body=patch,
            content_type="application/merge-patch+json",
        )

    # -- leader Lease (coordination.k8s.io/v1; leader_lease.py) ---------------------------------------------

    def lease_path(self, name: str | None = None) -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(self.namespace)}/leases"
        return base if name is None else f"{base}/{quote(name)}"

    async def get_lease(self, name: str) -> dict[str, Any] | None:
        """The Lease object, or None when there is none (404)."""
        try:
            obj: dict[str, Any] = await self._request("GET", self.lease_path(name))
        except KubernetesError as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def create_lease(self, lease: Mapping[str, Any]) -> dict[str, Any]:
        """``POST`` the Lease (409 AlreadyExists when another candidate created it first)."""
        obj: dict[str, Any] = await self._request(
            "POST", self.lease_path(), params={"fieldManager": FIELD_MANAGER}, body=dict(lease)
        )
        return obj

    async def replace_lease(self, lease: Mapping[str, Any]) -> dict[str, Any]:
        """``PUT`` the Lease; its ``metadata.resourceVersion`` must be the stored one (else 409 Conflict)."""
        name = str(lease["metadata"]["name"])
        obj: dict[str, Any] = await self._request(
            "PUT", self.lease_path(name), params={"fieldManager": FIELD_MANAGER}, body=dict(lease)
        )
        return obj
