"""deploy/k8s starts: every manifest validates against the official Kubernetes schemas, the Role grants
exactly the calls the gateway makes, and the files agree with each other and with the code.

Schemas: the ``kubernetes-validate`` package (the JSON schemas generated from Kubernetes' own OpenAPI, bundled
in the package: no network), in strict mode (unknown fields are errors, as ``kubectl apply
--validate=strict``), for Kubernetes :data:`K8S_VERSION`. KEDA's ``ScaledObject`` is a CRD, not in those
schemas: it is checked structurally below (the fields KEDA reads, its target and its metric), not against
KEDA's CRD schema. ``kustomization.yaml`` is kustomize's own file: its resources must exist and its patch
must name a container that exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import generate_latest

from fleetgate.config import parse_config
from fleetgate.providers.kubernetes_rbac import API_CALLS, lease_name
from fleetgate.runtime import build_gateway

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
#: The Kubernetes version the manifests are validated for (PodDisruptionBudget policy/v1, EndpointSlice
#: discovery.k8s.io/v1 and Lease coordination.k8s.io/v1 are GA well before it).
K8S_VERSION = "1.31"
KEDA_KIND = ("keda.sh/v1alpha1", "ScaledObject")
PATCHES = {"engine-sidecar-patch.yaml"}  # strategic-merge patches (kustomize), not whole objects
NOT_API_OBJECTS = {"kustomization.yaml"}  # kustomize's own file


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


def _objects(kind: str, file: str | None = None) -> list[dict[str, Any]]:
    return [d for n, _, d in DOCS if d["kind"] == kind and n not in PATCHES and (file is None or n == file)]


def _one(kind: str, name: str, file: str | None = None) -> dict[str, Any]:
    (obj,) = [d for d in _objects(kind, file) if d["metadata"]["name"] == name]
    return obj


def _config() -> dict[str, Any]:
    data = yaml.safe_load(_one("ConfigMap", "fleetgate-config")["data"]["fleetgate.yaml"])
    assert isinstance(data, dict)
    return data


def _sidecar_patch_as_object(doc: dict[str, Any]) -> dict[str, Any]:
    """The patch merged onto engine-vllm.yaml's Deployment by container name (what kustomize does)."""
    base = yaml.safe_load(yaml.safe_dump(_one("Deployment", "engine", "engine-vllm.yaml")))
    containers = {c["name"]: c for c in base["spec"]["template"]["spec"]["containers"]}
    for patch in doc["spec"]["template"]["spec"]["containers"]:
        containers.setdefault(patch["name"], {}).update(patch)
    base["spec"]["template"]["spec"]["containers"] = list(containers.values())
    return base


#: every document but KEDA's (a CRD outside the Kubernetes schemas: test_keda_* checks it structurally)
CORE_DOCS = [(n, i, d) for n, i, d in DOCS if (d.get("apiVersion"), d.get("kind")) != KEDA_KIND]


@pytest.mark.parametrize(
    ("name", "index", "doc"), CORE_DOCS, ids=[f"{n}#{i}-{d.get('kind')}" for n, i, d in CORE_DOCS]
)
def test_manifest_validates_against_the_schemas(name: str, index: int, doc: dict[str, Any]) -> None:
    target = _sidecar_patch_as_object(doc) if name in PATCHES else doc
    kubernetes_validate.validate(target, K8S_VERSION, strict=True)


def test_the_validator_is_strict_and_offline() -> None:
    """The bundled schemas reject what a cluster would: a typo'd field, a wrong type, a missing field."""
    good = yaml.safe_load(yaml.safe_dump(_one("Deployment", "fleetgate")))
    kubernetes_validate.validate(good, K8S_VERSION, strict=True)
    typo = yaml.safe_load(yaml.safe_dump(good))
    typo["spec"]["replica"] = 2
    wrong_type = yaml.safe_load(yaml.safe_dump(good))
    wrong_type["spec"]["replicas"] = "2"
    no_containers = yaml.safe_load(yaml.safe_dump(good))
    del no_containers["spec"]["template"]["spec"]["containers"]
    bad_probe = yaml.safe_load(yaml.safe_dump(good))
    bad_probe["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] = 5
    for bad in (typo, wrong_type, no_containers, bad_probe):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_role_grants_exactly_the_calls_the_gateway_makes() -> None:
    role = _one("Role", "fleetgate")
    config = _config()
    (dep,) = config["deployments"]
    provider = dep["provider"]
    names = {"deployments/scale": provider["deployment"], "leases": lease_name(provider["deployment"])}
    granted: set[tuple[str, str, str, str | None]] = set()
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for rn in rule.get("resourceNames") or [None]:
                        granted.add((group, resource, verb, rn))
    wanted = {(c.group, c.resource, c.verb, names.get(c.resource) if c.named else None) for c in API_CALLS}
    assert granted == wanted, f"missing {sorted(wanted - granted)}; extra {sorted(granted - wanted)}"
    binding = _one("RoleBinding", "fleetgate")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (subject,) = binding["subjects"]
    gateway = _one("Deployment", "fleetgate")
    account = gateway["spec"]["template"]["spec"]["serviceAccountName"]
    assert subject == {"kind": "ServiceAccount", "name": account}
    _one("ServiceAccount", subject["name"])


def test_configmap_names_the_shipped_engine_objects_and_a_bundled_profile() -> None:
    (dep,) = _config()["deployments"]
    provider = dep["provider"]
    assert provider["kind"] == "kubernetes"
    for file in ("engine-vllm.yaml", "engine-sglang.yaml"):
        engine = _one("Deployment", provider["deployment"], file)
        service = _one("Service", provider["service"], file)
        assert provider["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert service["spec"]["selector"] == engine["spec"]["selector"]["matchLabels"]
        (container,) = engine["spec"]["template"]["spec"]["containers"]
        args = " ".join(container.get("args", []))
        assert f"--served-model-name={dep['model']}" in args, file
    assert (ROOT / "src" / "fleetgate" / "profiles" / f"{dep['cost_profile']}.json").is_file()
    # the gateway reads the file the ConfigMap mounts
    gateway = _one("Deployment", "fleetgate")
    spec = gateway["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert container["args"] == ["serve", "--config", f"{mount['mountPath']}/fleetgate.yaml"]
    volume = next(v for v in spec["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == "fleetgate-config"


def test_probes_pdbs_and_omp_threads_from_the_cpu_limit() -> None:
    gateway = _one("Deployment", "fleetgate")
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for file in ("engine-vllm.yaml", "engine-sglang.yaml"):
        engine = _one("Deployment", "engine", file)
        (c,) = engine["spec"]["template"]["spec"]["containers"]
        assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(c), file
        startup = c["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # weights take minutes
        omp = next(e for e in c["env"] if e["name"] == "OMP_NUM_THREADS")
        assert omp["valueFrom"]["resourceFieldRef"]["resource"] == "limits.cpu"
        assert "cpu" in c["resources"]["limits"], f"{file}: OMP_NUM_THREADS needs a CPU limit to read"
    pdbs = {p["metadata"]["name"]: p for p in _objects("PodDisruptionBudget")}
    for deployment in (gateway, _one("Deployment", "engine", "engine-vllm.yaml")):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        covering = [
            p
            for p in pdbs.values()
            if all(labels.get(k) == v for k, v in p["spec"]["selector"]["matchLabels"].items())
        ]
        assert covering, f"no PodDisruptionBudget selects {deployment['metadata']['name']}"
    for deployment in _objects("Deployment"):
        name = deployment["metadata"]["name"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        for key, value in deployment["spec"]["selector"]["matchLabels"].items():
            assert labels.get(key) == value, f"{name}: selector does not match the pod template"


def test_keda_scaled_object_reads_a_gauge_serve_exports() -> None:
    """Structural check (no CRD schema here): the fields KEDA requires, its target is the engine Deployment,
    and its query names a gauge that `fleetgate serve` exports for the ConfigMap's deployment."""
    (so,) = [d for n, _, d in DOCS if (d["apiVersion"], d["kind"]) == KEDA_KIND]
    assert set(so) == {"apiVersion", "kind", "metadata", "spec"}
    spec = so["spec"]
    assert set(spec) <= {
        "scaleTargetRef", "pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount",
        "advanced", "triggers", "fallback", "idleReplicaCount", "initialCooldownPeriod",
    }  # fmt: skip
    ref = spec["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"]) == ("apps/v1", "Deployment")
    _one("Deployment", ref["name"], "engine-vllm.yaml")
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] in {"AverageValue", "Value"}
    meta = trigger["metadata"]
    assert {"serverAddress", "query", "threshold"} <= set(meta)
    float(meta["threshold"])
    # what a gateway with the ConfigMap's deployment exports (static replica: no API server needed)
    (dep,) = _config()["deployments"]
    cfg = parse_config(
        {"deployments": [{"model": dep["model"], "replicas": [{"name": "r0", "url": "http://127.0.0.1:9"}]}]}
    )
    text = generate_latest(build_gateway(cfg).proxy.metrics.registry).decode()
    metric = meta["query"].split("(", 1)[1].split("{", 1)[0]
    assert f'{metric}{{deployment="{dep["model"]}"' in text, metric
    assert f'deployment="{dep["model"]}"' in meta["query"]


def test_kustomization_and_the_sidecar_patch() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    listed = set(kustomization["resources"])
    for resource in listed:
        assert (K8S / resource).is_file(), resource
    assert {"namespace.yaml", "redis.yaml", "gateway.yaml"} <= listed
    assert listed & {"engine-vllm.yaml", "engine-sglang.yaml"}
    namespace = next(d for d in _objects("Namespace"))
    assert kustomization["namespace"] == namespace["metadata"]["name"]
    # the patch targets a container of engine-vllm.yaml and runs `fleetgate health sidecar` with its options
    ((_, _, patch),) = [(n, i, d) for n, i, d in DOCS if n in PATCHES]
    engine = _one("Deployment", patch["metadata"]["name"], "engine-vllm.yaml")
    names = {c["name"] for c in engine["spec"]["template"]["spec"]["containers"]}
    patched = patch["spec"]["template"]["spec"]["containers"]
    assert patched[0]["name"] in names
    sidecar = next(c for c in patched if c["name"] not in names)
    assert sidecar["args"][:2] == ["health", "sidecar"]
    options = {a.split("=", 1)[0] for a in sidecar["args"][2:]}
    assert options <= {"--engine", "--model", "--host", "--port", "--probe-path"}
    (dep,) = _config()["deployments"]
    assert f"--model={dep['model']}" in sidecar["args"]
    # the patch's header tells users to set a key that exists
    text = (K8S / "engine-sidecar-patch.yaml").read_text()
    assert "remediation: none" in text
    from fleetgate.config_control import Remediation

    assert "none" in Remediation.__args__
