"""Settle is exact, end to end: after a run through the gateway, the MU the gateway booked as used per tenant
(``GET /admin/usage/{tenant}``: settled MU, settled requests, token counts) equals the sum of the costs
settled from the usage the engine reported for each request, and the capacity ledger's used MU
(``GET /admin/capacity``) equals that sum exactly. (The sliding-window ``CapacityLedger`` is
checked bit for bit in tests/unit/test_capacity.py.)"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fleetgate.core.openai import usage_from_mapping
from fleetgate.profiles import load_profile

MODEL = "sim-model"
PROFILE = "fleetgate-sim"


def test_ledger_used_mu_equals_sum_of_settled_costs(start_engine: Any, tools: Any, tmp_path: Path) -> None:
    engine = start_engine(MODEL)
    cfg = {
        "gateway": {"host": "127.0.0.1", "port": 0},
        "deployments": [
            {"model": MODEL, "cost_profile": PROFILE, "replicas": [{"name": "r0", "url": engine.url}]}
        ],
        "tenants": [
            {"name": "gold", "api_keys": ["sk-gold-settle"], "reserved_mu_per_min": {MODEL: 100}},
            {"name": "blue", "api_keys": ["sk-blue-settle"], "reserved_mu_per_min": {MODEL: 50}},
        ],
        "admission": {"admin_api_keys": ["sk-admin-settle"]},
    }
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    gateway = tools.ServerProcess(
        [tools.PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], name="gw"
    )
    profile = load_profile(PROFILE)
    settled: dict[str, list[float]] = {"gold": [], "blue": []}
    tokens: dict[str, list[int]] = {"gold": [0, 0], "blue": [0, 0]}
    try:
        url = gateway.wait_ready()
        with httpx.Client(timeout=30) as client:
            for k in range(24):
                tenant = "gold" if k % 3 else "blue"
                key = f"sk-{tenant}-settle"
                words = " ".join(["token"] * (5 + 37 * k))
                # prompts that share prefixes, so the engine's prefix cache reports cached tokens too
                content = f"request {k % 8}: {words if k % 8 else 'short'}"
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": content}],
                    "max_tokens": 1 + (k * 7) % 40,
                }
                r = client.post(
                    url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
                )
                assert r.status_code == 200, r.text
                usage = usage_from_mapping(r.json()["usage"])
                assert usage is not None and usage.prompt_tokens > 0
                settled[tenant].append(profile.settle(usage))
                tokens[tenant][0] += usage.prompt_tokens
                tokens[tenant][1] += usage.completion_tokens
            admin = {"Authorization": "Bearer sk-admin-settle"}
            report = {
                t: client.get(url + f"/admin/usage/{t}", headers=admin).json() for t in ("gold", "blue")
            }
            capacity = client.get(url + "/admin/capacity", headers=admin).json()
        # the capacity ledger (GET /admin/capacity): used MU over its window is the exact sum of the settled
        # costs (the run is far shorter than the 60 s window, so every request is still inside it)
        (ledger,) = [d for d in capacity["deployments"] if d["deployment"] == MODEL]
        every_cost = settled["gold"] + settled["blue"]
        assert ledger["settled_requests_in_window"] == ledger["settled_requests_total"] == len(every_cost)
        assert ledger["used_mu"] == math.fsum(every_cost)
        assert ledger["used_mu_per_min"] == pytest.approx(ledger["used_mu"] * 60.0 / ledger["used_window_s"])
        assert ledger["headroom_mu_per_min"] == pytest.approx(
            ledger["capacity_mu_per_min"] - ledger["used_mu_per_min"]
        )
        for tenant, costs in settled.items():
            booked = report[tenant]["usage"]
            assert booked["settled"] == len(costs)
            assert (booked["prompt_tokens"], booked["completion_tokens"]) == tuple(tokens[tenant])
            # the store adds as requests settle; the exact sum differs from that only by float rounding
            assert booked["settled_mu"] == pytest.approx(math.fsum(costs), rel=1e-12, abs=0.0)
            assert booked["settled_mu"] > 0
    finally:
        gateway.kill()
