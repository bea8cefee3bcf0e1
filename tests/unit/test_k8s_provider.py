"""Kubernetes provider: request and response shapes checked against the Kubernetes API schema.

No cluster runs on this machine, so the API server here is a FAKE: a small aiohttp app on 127.0.0.1 that
implements only the operations the provider uses and validates every request body, query parameter and
content type against tests/fixtures/k8s_openapi_excerpt.json (an excerpt of the official OpenAPI definitions,
written from the spec's field lists) in strict mode (unknown fields are an error, as with
``fieldValidation=Strict``). Its own responses are validated against the same schema, so the parsers are
tested on shapes the real API returns.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from fleetgate.providers.kubernetes import (
    DELETION_COST_ANNOTATION,
    KubernetesError,
    KubernetesProvider,
    parse_endpoint_slices,
    parse_scale,
    scale_patch,
)

SCHEMA = json.loads((Path(__file__).parent.parent / "fixtures" / "k8s_openapi_excerpt.json").read_text())
DEFS: dict[str, Any] = SCHEMA["schemas"]
TOKEN = "test-token"


def validate(value: Any, schema: dict[str, Any] | str, *, strict: bool = True, path: str = "$") -> None:
    """A tiny OpenAPI-subset validator: types, int32/int64 ranges, enums, required, unknown fields."""
    if isinstance(schema, str):
        schema = DEFS[schema]
    if "$ref" in schema:
        validate(value, DEFS[schema["$ref"]], strict=strict, path=path)
        return
    typ = schema.get("type")
    if typ == "object":
        assert isinstance(value, dict), f"{path}: expected object, got {type(value).__name__}"
        for req in schema.get("required", []):
            assert req in value, f"{path}: missing required field {req!r}"
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, val in value.items():
            if props is not None and key in props:
                validate(val, props[key], strict=strict, path=f"{path}.{key}")
            elif extra is not None:
                validate(val, extra, strict=strict, path=f"{path}.{key}")
            elif props is not None and strict:
                raise AssertionError(f"{path}: unknown field {key!r}")
    elif typ == "array":
        assert isinstance(value, list), f"{path}: expected array"
        for i, item in enumerate(value):
            validate(item, schema.get("items", {}), strict=strict, path=f"{path}[{i}]")
    elif typ == "string":
        assert isinstance(value, str), f"{path}: expected string, got {value!r}"
        if "enum" in schema:
            assert value in schema["enum"], f"{path}: {value!r} not in {schema['enum']}"
    elif typ == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), (
            f"{path}: expected integer, got {value!r}"
        )
        if schema.get("format") == "int32":
            assert -(2**31) <= value < 2**31, f"{path}: out of int32 range"
    elif typ == "boolean":
        assert isinstance(value, bool), f"{path}: expected boolean, got {value!r}"


def test_validator_catches_wrong_shapes() -> None:
    validate({"spec": {"replicas": 3}}, "io.k8s.api.autoscaling.v1.Scale")
    for bad in ({"spec": {"replicas": "3"}}, {"spec": {"replica": 3}}, {"replicas": 3}):
        with pytest.raises(AssertionError):
            validate(bad, "io.k8s.api.autoscaling.v1.Scale")
    with pytest.raises(AssertionError, match="required"):
        validate({"status": {"selector": "a=b"}}, "io.k8s.api.autoscaling.v1.Scale")


class FakeApiServer:
    """A fake API server: one Deployment ``engine`` (namespace ``llm``) behind Service ``engine``."""

    def __init__(self) -> None:
        self.replicas = 2
        self.pods: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.next_id = 0
        for _ in range(2):
            self._add_pod(ready=True)

    def _add_pod(self, ready: bool) -> str:
        self.next_id += 1
        name = f"engine-7d4b9c-{self.next_id:05d}"
        self.pods[name] = {"ip": f"10.1.0.{self.next_id}", "ready": ready, "annotations": {}}
        return name

    def _check(self, request: web.Request, op: dict[str, Any], body: Any) -> None:
        assert request.headers.get("Authorization") == f"Bearer {TOKEN}", "missing bearer token"
        for q in request.query:
            assert q in op.get("queryParameters", []), f"unknown query parameter {q}"
        if "requestContentTypes" in op:
            assert request.content_type in op["requestContentTypes"], request.content_type

    def _scale_obj(self) -> dict[str, Any]:
        obj = {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {"name": "engine", "namespace": "llm", "resourceVersion": "42", "uid": "u-1"},
            "spec": {"replicas": self.replicas},
            "status": {"replicas": len(self.pods), "selector": "app=engine"},
        }
        validate(obj, "io.k8s.api.autoscaling.v1.Scale")
        return obj

    def _slices(self) -> dict[str, Any]:
        eps = []
        for name, pod in self.pods.items():
            cond: dict[str, bool] = {"ready": pod["ready"], "serving": pod["ready"], "terminating": False}
            eps.append(
                {
                    "addresses": [pod["ip"]],
                    "conditions": cond,
                    "nodeName": "node-a",
                    "targetRef": {"kind": "Pod", "namespace": "llm", "name": name, "uid": f"uid-{name}"},
                    "zone": "z1",
                }
            )
        obj = {
            "kind": "EndpointSliceList",
            "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"resourceVersion": "77"},
            "items": [
                {
                    "kind": "EndpointSlice",
                    "apiVersion": "discovery.k8s.io/v1",
                    "metadata": {
                        "name": "engine-abcde",
                        "namespace": "llm",
                        "labels": {"kubernetes.io/service-name": "engine"},
                    },
                    "addressType": "IPv4",
                    "endpoints": eps,
                    "ports": [
                        {"name": "metrics", "port": 9090, "protocol": "TCP"},
                        {"name": "http", "port": 8000, "protocol": "TCP", "appProtocol": "http"},
                    ],
                }
            ],
        }
        validate(obj, "io.k8s.api.discovery.v1.EndpointSliceList")
        return obj

    async def scale(self, request: web.Request) -> web.Response:
        path = "/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"
        assert request.match_info["namespace"] == "llm" and request.match_info["name"] == "engine"
        body = await request.json() if request.can_read_body else None
        op = SCHEMA["paths"][path][request.method.lower()]
        self._check(request, op, body)
        self.requests.append((request.method, request.path, dict(request.query), body))
        if request.method == "PATCH":
            assert request.content_type == "application/merge-patch+json"
            validate(body, "io.k8s.api.autoscaling.v1.Scale")
            self.replicas = body["spec"]["replicas"]
            while len(self.pods) < self.replicas:
                self._add_pod(ready=False)
        return web.json_response(self._scale_obj())

    async def slices(self, request: web.Request) -> web.Response:
        op = SCHEMA["paths"]["/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"]["get"]
        self._check(request, op, None)
        self.requests.append((request.method, request.path, dict(request.query), None))
        assert request.query["labelSelector"] == "kubernetes.io/service-name=engine"
        return web.json_response(self._slices())

    async def pod(self, request: web.Request) -> web.Response:
        op = SCHEMA["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"][request.method.lower()]
        body = await request.json() if request.can_read_body else None
        self._check(request, op, body)
        self.requests.append((request.method, request.path, dict(request.query), body))
        name = request.match_info["name"]
        if name not in self.pods:
            status = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f'pods "{name}" not found',
                "reason": "NotFound",
                "code": 404,
            }
            validate(status, "io.k8s.apimachinery.pkg.apis.meta.v1.Status")
            return web.json_response(status, status=404)
        if request.method == "DELETE":
            if body is not None:
                validate(body, "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions")
            del self.pods[name]
            self._add_pod(ready=False)  # the ReplicaSet replaces it
            return web.json_response({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name}})
        validate(body, "_pod_metadata_patch")
        self.pods[name]["annotations"].update(body["metadata"]["annotations"])
        return web.json_response({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name}})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale", self.scale)
        app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices", self.slices)
        app.router.add_route("*", "/api/v1/namespaces/{namespace}/pods/{name}", self.pod)
        return app


async def _serve(
    app: web.Application, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeApiServer, KubernetesProvider]]:
    server = FakeApiServer()
    runner, port = await _serve(server.app())
    prov = KubernetesProvider(
        api_base=f"http://127.0.0.1:{port}",
        namespace="llm",
        deployment="engine",
        service="engine",
        port_name="http",
        token=TOKEN,
        delete_grace_period_s=5,
    )
    try:
        yield server, prov
    finally:
        await prov.close()
        await runner.cleanup()


async def test_scale_subresource_round_trip(fake: tuple[FakeApiServer, KubernetesProvider]) -> None:
    server, prov = fake
    info = await prov.get_scale()
    assert (info.spec_replicas, info.status_replicas, info.selector) == (2, 2, "app=engine")
    info = await prov.scale_to(4)
    assert info.spec_replicas == 4 and server.replicas == 4
    method, path, query, body = server.requests[-1]
    assert (method, path) == ("PATCH", "/apis/apps/v1/namespaces/llm/deployments/engine/scale")
    assert body == {"spec": {"replicas": 4}} and query == {"fieldManager": "fleetgate"}


async def test_discovery_honours_readiness_and_counts(fake: tuple[FakeApiServer, KubernetesProvider]) -> None:
    _, prov = fake
    await prov.scale_to(3)
    eps = await prov.endpoints()
    assert len(eps) == 3
    ready = await prov.list()
    assert len(ready) == 2 and all(
        r.url.endswith(":8000") and r.url.startswith("http://10.1.0.") for r in ready
    )
    counts = await prov.counts()
    assert (counts.current, counts.ready, counts.starting) == (3, 2, 1)


async def test_restart_deletes_the_pod_and_drain_sets_deletion_cost(
    fake: tuple[FakeApiServer, KubernetesProvider],
) -> None:
    server, prov = fake
    victim = (await prov.list())[0].name
    await prov.restart(victim)
    assert victim not in server.pods
    method, path, _, body = server.requests[-1]
    assert method == "DELETE" and path == f"/api/v1/namespaces/llm/pods/{victim}"
    assert body == {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 5}
    await prov.restart(victim)  # already gone: not an error
    other = (await prov.list())[0].name
    await prov.drain(other)
    assert server.pods[other]["annotations"] == {DELETION_COST_ANNOTATION: "-1000"}


async def test_api_errors_carry_status_and_reason(fake: tuple[FakeApiServer, KubernetesProvider]) -> None:
    _, prov = fake
    with pytest.raises(KubernetesError) as info:
        await prov.drain("no-such-pod")
    assert info.value.status == 404 and info.value.reason == "NotFound"


def test_parse_slices_nil_conditions_terminating_ipv6_fqdn_and_duplicates() -> None:
    doc = {
        "kind": "EndpointSliceList",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {},
        "items": [
            {
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8000}],
                "endpoints": [
                    {"addresses": ["10.0.0.1"], "targetRef": {"kind": "Pod", "name": "a"}},  # nil: ready
                    {"addresses": ["10.0.0.2"], "conditions": {"ready": False}, "targetRef": {"name": "b"}},
                    {
                        "addresses": ["10.0.0.3"],
                        "conditions": {"ready": False, "serving": True, "terminating": True},
                        "targetRef": {"kind": "Pod", "name": "c"},
                    },
                ],
            },
            {
                "addressType": "IPv6",
                "ports": [{"name": "http", "port": 8000}],
                "endpoints": [{"addresses": ["fd00::5"], "conditions": {"ready": True}}],
            },
            {
                "addressType": "FQDN",
                "ports": [{"name": "http", "port": 80}],
                "endpoints": [{"addresses": ["x.y"]}],
            },
            {  # the same pod listed in a second slice (slices may overlap during updates)
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8000}],
                "endpoints": [
                    {"addresses": ["10.0.0.2"], "conditions": {"ready": True}, "targetRef": {"name": "b"}}
                ],
            },
        ],
    }
    validate(doc, "io.k8s.api.discovery.v1.EndpointSliceList")
    reps = {r.name: r for r in parse_endpoint_slices(doc, port_name="http")}
    assert set(reps) == {"a", "b", "c", "fd00::5"}
    assert reps["a"].ready and reps["b"].ready
    assert not reps["c"].ready and reps["c"].serving and reps["c"].terminating
    assert reps["fd00::5"].url == "http://[fd00::5]:8000"
    assert parse_endpoint_slices(doc, port_name="grpc") == []


def test_bodies_match_schema() -> None:
    validate(scale_patch(7), "io.k8s.api.autoscaling.v1.Scale")
    with pytest.raises(ValueError):
        scale_patch(-1)
    with pytest.raises(ValueError):
        parse_scale({"kind": "Deployment"})
    assert parse_scale({"kind": "Scale", "spec": {}, "status": {"replicas": 0}}).spec_replicas == 0


@pytest.fixture
def service_account(tmp_path: Path) -> Path:
    """A service-account directory as mounted in a pod, with a self-signed CA for 127.0.0.1."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI to make a test CA")
    key, crt = tmp_path / "tls.key", tmp_path / "ca.crt"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(crt), "-subj", "/CN=kubernetes",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return tmp_path


async def test_in_cluster_config_over_tls(service_account: Path) -> None:
    """Service-account files and env as in a pod; TLS verified against the mounted CA (self-signed here)."""
    tmp_path = service_account
    key, crt = tmp_path / "tls.key", tmp_path / "ca.crt"
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "namespace").write_text("llm")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(str(crt), str(key))
    server = FakeApiServer()
    runner, port = await _serve(server.app(), server_ctx)
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)}
    prov = KubernetesProvider.in_cluster(
        deployment="engine", service="engine", port_name="http", sa_dir=tmp_path, env=env
    )
    try:
        assert prov.namespace == "llm" and prov.api_base == f"https://127.0.0.1:{port}"
        assert (await prov.get_scale()).spec_replicas == 2
    finally:
        await prov.close()
        await runner.cleanup()
    with pytest.raises(RuntimeError, match="KUBERNETES_SERVICE_HOST"):
        KubernetesProvider.in_cluster(deployment="e", service="e", sa_dir=tmp_path, env={})
