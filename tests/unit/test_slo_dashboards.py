"""deploy/grafana and deploy/prometheus only use metrics the gateway really exports, and are well formed."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from fleetgate.autoscaler.loop import AutoscalerMetrics
from fleetgate.capacity_loop import PoolMetrics
from fleetgate.config import parse_config
from fleetgate.health.monitor import HealthMetrics
from fleetgate.runtime import build_gateway

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "fleetgate-dashboard.json"
PROMETHEUS = ROOT / "deploy" / "prometheus"
METRIC = re.compile(r"\bfleetgate_[a-z_]+\b")
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count", "_created")


def exported_names() -> set[str]:
    """Every series name a gateway with tenants, an autoscaler and health checks can export."""
    cfg = parse_config(
        {
            "deployments": [{"model": "m", "replicas": [{"name": "r0", "url": "http://127.0.0.1:9"}]}],
            "tenants": [{"name": "gold", "api_keys": ["k1"], "reserved_mu_per_min": {"m": 10}}],
            "admission": {"admin_api_keys": ["k2"]},
        }
    )
    server = build_gateway(cfg)
    registry: CollectorRegistry = server.proxy.metrics.registry
    AutoscalerMetrics(registry)
    PoolMetrics(registry)
    HealthMetrics(registry)
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES)
    return names


def test_dashboard_uses_real_metrics() -> None:
    dash: dict[str, Any] = json.loads(DASHBOARD.read_text())
    names = exported_names()
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    assert len(exprs) >= 20
    used = {m for e in exprs for m in METRIC.findall(e)}
    assert used - names == set(), f"dashboard metrics the gateway does not export: {sorted(used - names)}"
    for needed in (
        "fleetgate_slo_ttft_seconds",
        "fleetgate_slo_attainment_ratio",
        "fleetgate_autoscaler_desired_replicas",
    ):
        assert needed in used
    for p in panels:
        if p["type"] != "row":
            assert p["targets"] and p["datasource"]["uid"] == "${datasource}"
        grid = p["gridPos"]
        assert grid["x"] + grid["w"] <= 24
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "deployment", "tenant"}


def test_prometheus_config_and_rules() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert {"fleetgate-gateway", "fleetgate-engines", "fleetgate-local"} <= set(jobs)
    for rule_file in config["rule_files"]:
        assert (PROMETHEUS / rule_file).is_file()
    rules = yaml.safe_load((PROMETHEUS / "fleetgate-rules.yml").read_text())
    names = exported_names()
    alerts = [r for group in rules["groups"] for r in group["rules"]]
    assert len(alerts) >= 4
    for alert in alerts:
        assert alert["alert"] and alert["expr"] and "summary" in alert["annotations"]
        assert set(METRIC.findall(alert["expr"])) <= names, alert["expr"]
    # the k8s pods the scrape jobs keep are the ones deploy/k8s annotates
    for manifest, label in (("gateway.yaml", "fleetgate"), ("engine-vllm.yaml", "engine")):
        docs = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / manifest).read_text()))
        (dep,) = [d for d in docs if d and d["kind"] == "Deployment"]
        meta = dep["spec"]["template"]["metadata"]
        assert meta["labels"]["app.kubernetes.io/name"] == label
        assert meta["annotations"]["prometheus.io/scrape"] == "true"
    # the gateway is scraped on its metrics-only port (GET /metrics on the API port needs the admin key)
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / "gateway.yaml").read_text()))
    (cm,) = [d for d in docs if d and d["kind"] == "ConfigMap"]
    gateway_cfg = yaml.safe_load(cm["data"]["fleetgate.yaml"])["gateway"]
    (dep,) = [d for d in docs if d and d["kind"] == "Deployment"]
    port = dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"]
    assert int(port) == gateway_cfg["metrics_port"] != gateway_cfg["port"]
    (svc,) = [d for d in docs if d and d["kind"] == "Service"]
    assert all(p["targetPort"] != "metrics" for p in svc["spec"]["ports"])
    assert jobs["fleetgate-local"]["authorization"]["type"] == "Bearer"
