"""The gateway with tenants: authenticate -> admit -> dispatch -> settle, through real processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

MODEL = "sim-model"


def test_tenant_keys_and_rate_limit_headers(start_engine: Any, tools: Any, tmp_path: Path) -> None:
    engine = start_engine(MODEL)
    cfg = {
        "gateway": {"host": "127.0.0.1", "port": 0},
        "deployments": [{"model": MODEL, "replicas": [{"name": "r0", "url": engine.url}]}],
        "tenants": [
            {"name": "gold", "api_keys": ["sk-gold-test"], "reserved_mu_per_min": {MODEL: 100}},
        ],
        "admission": {"admin_api_keys": ["sk-admin-test"]},
    }
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    gateway = tools.ServerProcess(
        [tools.PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], name="gw"
    )
    try:
        url = gateway.wait_ready()
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        r = httpx.post(url + "/v1/chat/completions", json=body)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        c = openai.OpenAI(base_url=url + "/v1", api_key="sk-gold-test", max_retries=0, timeout=30)
        raw = c.chat.completions.with_raw_response.create(**body)
        assert raw.parse().usage is not None
        assert "x-ratelimit-remaining-mu" in raw.headers  # MU meter; no TPM limit, so no token headers
        assert "x-ratelimit-remaining-tokens" not in raw.headers
        chunks = list(c.chat.completions.create(**body, stream=True))
        assert chunks[-1].choices[0].finish_reason == "length"
        admin = httpx.get(url + "/admin/tenants", headers={"Authorization": "Bearer sk-admin-test"})
        assert admin.status_code == 200 and "gold" in admin.text
        denied = httpx.get(url + "/admin/tenants", headers={"Authorization": "Bearer sk-gold-test"})
        assert denied.status_code == 403 and "error" in denied.json()
    finally:
        gateway.kill()
