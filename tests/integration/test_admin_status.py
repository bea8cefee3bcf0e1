"""``GET /admin/status``, the SLO gauges and the structured request log, through a real ``fleetgate serve``
in front of two simulated engines, with three tenants (one rate-limited until it is rejected)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import yaml

MODEL = "sim-model"
SECRET_PROMPT = "my-very-private-prompt-text"


def test_admin_status_slo_metrics_and_logs(start_engine: Any, tools: Any, tmp_path: Path) -> None:
    engines = [start_engine(MODEL, wait=False) for _ in range(2)]
    for engine in engines:
        engine.wait_ready()
    cfg = {
        "gateway": {"host": "127.0.0.1", "port": 0, "scrape_interval_s": 0.5},
        "deployments": [
            {
                "model": MODEL,
                "capacity_mu_per_min": 1000,
                "replicas": [{"name": f"engine-{i}", "url": e.url} for i, e in enumerate(engines)],
            }
        ],
        "tenants": [
            {"name": "gold", "api_keys": ["sk-gold-t"], "reserved_mu_per_min": {MODEL: 300}},
            {"name": "silver", "api_keys": ["sk-silver-t"], "reserved_mu_per_min": {MODEL: 200}},
            {"name": "tiny", "api_keys": ["sk-tiny-t"], "priority": "best_effort", "requests_per_minute": 1},
        ],
        "admission": {"admin_api_keys": ["sk-admin-t"]},
        "ops": {"slo": {"max_tenant_labels": 1, "tenant_ttft_target_s": {"gold": 0.5}}},
    }
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    gateway = tools.ServerProcess(
        [tools.PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], name="gw"
    )
    try:
        url = gateway.wait_ready()
        body = {"model": MODEL, "messages": [{"role": "user", "content": SECRET_PROMPT}], "max_tokens": 8}
        with httpx.Client(timeout=30) as client:
            for key in ("sk-gold-t", "sk-gold-t", "sk-silver-t"):
                r = client.post(
                    f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
                )
                assert r.status_code == 200, r.text
            r = client.post(
                f"{url}/v1/chat/completions",
                json={**body, "stream": True},
                headers={"Authorization": "Bearer sk-gold-t", "x-request-id": "ops-test-req-1"},
            )
            assert r.status_code == 200 and r.headers["x-request-id"] == "ops-test-req-1"
            statuses = [
                client.post(
                    f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-tiny-t"}
                ).status_code
                for _ in range(3)
            ]
            assert 429 in statuses, statuses

            assert client.get(f"{url}/admin/status").status_code == 401
            denied = client.get(f"{url}/admin/status", headers={"Authorization": "Bearer sk-gold-t"})
            assert denied.status_code == 403 and denied.json()["error"]["type"] == "permission_error"
            status = client.get(f"{url}/admin/status", headers={"Authorization": "Bearer sk-admin-t"}).json()
            metrics = client.get(f"{url}/metrics", headers={"Authorization": "Bearer sk-admin-t"}).text
            ui = client.get(f"{url}/ui")
            assert ui.status_code == 200 and "/ui/app.js" in ui.text
            assert client.get(f"{url}/ui/app.js").status_code == 200

        replicas = {r["name"]: r for r in status["replicas"]}
        assert set(replicas) == {"engine-0", "engine-1"}
        for name, engine in zip(("engine-0", "engine-1"), engines, strict=True):
            row = replicas[name]
            assert row["url"] == engine.url and row["health"] == "healthy"
            assert row["mu_load"] is not None and row["mu_load"] >= 0
        assert sum(r["completed"] for r in replicas.values()) >= 4
        assert sum(r["mu_load"] for r in replicas.values()) > 0

        tenants = {t["name"]: t for t in status["tenants"]}
        assert set(tenants) == {"gold", "silver", "tiny"}
        gold = tenants["gold"]
        assert gold["reserved_mu_per_min"] == 300 and gold["requests"] == 3 and gold["ok"] == 3
        assert gold["used_mu_per_min"] > 0 and gold["ttft_p95_s"] is not None and gold["ttft_p95_s"] > 0
        assert gold["ttft_target_s"] == 0.5 and 0 <= gold["slo_attainment"] <= 1
        assert tenants["silver"]["ttft_target_s"] == 2.0
        tiny = tenants["tiny"]
        assert tiny["rejected"] >= 1 and tiny["rejection_rate"] > 0 and tiny["reserved_mu_per_min"] == 0
        assert status["deployments"][0]["reserved_mu_per_min"] == 500

        # bounded labels: one named tenant (the largest reservation first), everyone else is "other"
        tenant_labels = set(re.findall(r'fleetgate_slo_requests\{[^}]*tenant="([^"]+)"', metrics))
        assert tenant_labels == {"gold", "other"}, tenant_labels
        assert re.search(
            r'fleetgate_slo_ttft_seconds\{deployment="sim-model",quantile="0.95",tenant="gold"\}', metrics
        )
        assert re.search(
            r'fleetgate_slo_rejection_ratio\{deployment="sim-model",tenant="other"\} 0\.[1-9]', metrics
        )
        assert (
            'fleetgate_tenant_reserved_mu_per_minute{deployment="sim-model",tenant="other"} 200.0' in metrics
        )

        # structured logs: JSON lines with the request id; no prompt text, no keys
        gateway.wait_line(r'"request_id":"ops-test-req-1"', timeout=5)
        log_lines = [json.loads(line) for line in gateway.lines if line.startswith("{")]
        mine = [rec for rec in log_lines if rec.get("request_id") == "ops-test-req-1"]
        assert mine and mine[0]["tenant"] == "gold" and mine[0]["status"] == 200 and mine[0]["ttft_s"] > 0
        assert SECRET_PROMPT not in gateway.output
        assert "sk-gold-t" not in gateway.output and "sk-admin-t" not in gateway.output
    finally:
        gateway.kill()


async def test_open_mode_status_and_ui_switch() -> None:
    """No tenants and no admin keys: no key exists, so the status is open like the rest; `ops.ui: false`
    removes the page but keeps the JSON."""
    import aiohttp

    from fleetgate.config import parse_config
    from fleetgate.runtime import build_gateway

    cfg = parse_config(
        {
            "gateway": {"host": "127.0.0.1", "port": 0},
            "deployments": [{"model": "m", "replicas": [{"name": "r0", "url": "http://127.0.0.1:9"}]}],
            "ops": {"ui": False},
        }
    )
    server = build_gateway(cfg)
    url = await server.start(0)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/admin/status") as resp:
                assert resp.status == 200
                doc = await resp.json()
            async with session.get(f"{url}/ui") as resp:
                assert resp.status == 404
    finally:
        await server.stop(0)
    assert [r["name"] for r in doc["replicas"]] == ["r0"] and doc["tenants"] == []
    assert doc["replicas"][0]["url"] == "http://127.0.0.1:9" and doc["autoscalers"] == []
