"""Every manifest in deploy/k8s validates against the Kubernetes OpenAPI schema (no cluster, no network).

Schemas: tests/fixtures/k8s_openapi_excerpt.json (ObjectMeta, Scale, EndpointSlice: the provider's API) and
tests/fixtures/k8s_openapi_workloads.json (Deployment, Service, RBAC, ConfigMap, Namespace, KEDA
ScaledObject), both excerpts written from the official field lists. Validation is strict like
``kubectl apply --validate=strict``: unknown fields, wrong types, out-of-range int32, bad enums and missing
required fields are errors. Strategic-merge patches are checked without the required lists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
FIXTURES = ROOT / "tests" / "fixtures"
DEFS: dict[str, Any] = {}
for _name in ("k8s_openapi_excerpt.json", "k8s_openapi_workloads.json"):
    DEFS.update(json.loads((FIXTURES / _name).read_text())["schemas"])

KINDS: dict[tuple[str, str], str] = {}
for _def_name, _schema in DEFS.items():
    for _gvk in _schema.get("x-kubernetes-group-version-kind", []):
        _api = f"{_gvk['group']}/{_gvk['version']}" if _gvk["group"] else _gvk["version"]
        KINDS[(_api, _gvk["kind"])] = _def_name

PATCHES = {"engine-sidecar-patch.yaml"}  # strategic-merge patches (kustomize), not whole objects
NOT_API_OBJECTS = {"kustomization.yaml"}  # kustomize's own file


def validate(value: Any, schema: dict[str, Any] | str, *, patch: bool = False, path: str = "$") -> None:
    """Types, int32/int64 ranges, enums, int-or-string, required fields (not for patches), unknown fields."""
    node: dict[str, Any] = DEFS[schema] if isinstance(schema, str) else schema
    if "$ref" in schema:
        validate(value, DEFS[node["$ref"]], patch=patch, path=path)
        return
    if node.get("x-kubernetes-int-or-string"):
        assert isinstance(value, str | int) and not isinstance(value, bool), (
            f"{path}: int or string, got {value!r}"
        )
        return
    typ = node.get("type")
    if typ == "object":
        assert isinstance(value, dict), f"{path}: expected object, got {type(value).__name__}"
        if not patch:
            for req in node.get("required", []):
                assert req in value, f"{path}: missing required field {req!r}"
        props = node.get("properties")
        extra = node.get("additionalProperties")
        for key, val in value.items():
            if props is not None and key in props:
                validate(val, props[key], patch=patch, path=f"{path}.{key}")
            elif extra is not None:
                validate(val, extra, patch=patch, path=f"{path}.{key}")
            elif props is not None:
                raise AssertionError(f"{path}: unknown field {key!r}")
    elif typ == "array":
        assert isinstance(value, list), f"{path}: expected array, got {type(value).__name__}"
        for i, item in enumerate(value):
            validate(item, node.get("items", {}), patch=patch, path=f"{path}[{i}]")
    elif typ == "string":
        assert isinstance(value, str), f"{path}: expected string, got {value!r}"
        if "enum" in node:
            assert value in node["enum"], f"{path}: {value!r} not in {node['enum']}"
    elif typ == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), (
            f"{path}: expected integer, got {value!r}"
        )
        if node.get("format") == "int32":
            assert -(2**31) <= value < 2**31, f"{path}: out of int32 range"
    elif typ == "boolean":
        assert isinstance(value, bool), f"{path}: expected boolean, got {value!r}"


def documents() -> list[tuple[str, int, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name in NOT_API_OBJECTS:
            continue
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                out.append((path.name, i, doc))
    return out


DOCS = documents()


@pytest.mark.parametrize(("name", "index", "doc"), DOCS, ids=[f"{n}#{i}-{d.get('kind')}" for n, i, d in DOCS])
def test_manifest_validates(name: str, index: int, doc: dict[str, Any]) -> None:
    key = (str(doc.get("apiVersion")), str(doc.get("kind")))
    assert key in KINDS, f"{name}: no schema for {key}"
    assert doc.get("metadata", {}).get("name"), f"{name}: metadata.name is required"
    validate(doc, KINDS[key], patch=name in PATCHES)


def test_validator_rejects_mistakes() -> None:
    good: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80}]}]}},
        },
    }
    validate(good, KINDS[("apps/v1", "Deployment")])
    bad_docs = [
        {**good, "spec": {**good["spec"], "replica": 2}},  # unknown field (typo)
        {**good, "spec": {**good["spec"], "replicas": "2"}},  # wrong type
        {**good, "spec": {"selector": {}}},  # template missing
        {**good, "spec": {**good["spec"], "replicas": 2**31}},  # int32 overflow
        {
            **good,
            "spec": {
                **good["spec"],
                "template": {
                    "spec": {
                        "containers": [{"name": "c", "ports": [{"containerPort": 80, "protocol": "tcp"}]}]
                    }
                },
            },
        },  # enum is case-sensitive
        {**good, "spec": {**good["spec"], "template": {"spec": {"containers": [{"image": "x"}]}}}},  # no name
    ]
    for bad in bad_docs:
        with pytest.raises(AssertionError):
            validate(bad, KINDS[("apps/v1", "Deployment")])


def _deployments() -> dict[str, dict[str, Any]]:
    return {
        f"{n}:{d['metadata']['name']}": d
        for n, _, d in DOCS
        if d["kind"] == "Deployment" and n not in PATCHES
    }


@pytest.mark.parametrize("file", ["engine-vllm.yaml", "engine-sglang.yaml"])
def test_engines_have_all_three_probes_and_gpus(file: str) -> None:
    (deployment,) = [d for n, _, d in DOCS if n == file and d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert probe in container, f"{file}: {probe} missing"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # weights take minutes to load
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    port_names = {p["name"] for p in container["ports"]}
    assert container["readinessProbe"]["httpGet"]["port"] in port_names
    services = [d for n, _, d in DOCS if n == file and d["kind"] == "Service"]
    assert services and services[0]["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_selectors_match_templates_and_gateway_has_probes() -> None:
    for name, deployment in _deployments().items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        for key, value in deployment["spec"]["selector"]["matchLabels"].items():
            assert labels.get(key) == value, f"{name}: selector does not match the pod template"
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            assert "resources" in container, f"{name}: container {container['name']} has no resources"
    gateway = _deployments()["gateway.yaml:fleetgate"]
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_kustomization_lists_existing_files() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file(), resource
    kinds = {d["kind"] for n, _, d in DOCS}
    assert {"Deployment", "Service", "ScaledObject", "ConfigMap", "Role", "RoleBinding"} <= kinds
