"""Shared set-up of the security checks: one simulated engine and gateways with tenants, on 127.0.0.1 only.

Processes come from tests/integration/conftest.py's ``ServerProcess`` (loaded read-only); every gateway's
stdout/stderr is captured so the tests can search it for leaked keys.
"""

from __future__ import annotations

import sys
from typing import Any

from integration_tools import integration_tools

PY = sys.executable
MODEL = "sec-model"
KEYS = {
    "gold": "sk-sec-gold-5b1d9e0c",
    "free": "sk-sec-free-a8c2f713",
    "admin": "sk-sec-admin-40e6bb21",
}


ServerProcess = integration_tools().ServerProcess


def tenants_config(engine_url: str, **gateway: Any) -> dict[str, Any]:
    """Two tenants (gold: a big reservation; free: a tiny one, no best-effort) and an admin key."""
    return {
        "gateway": {"host": "127.0.0.1", "port": 0, "scrape_interval_s": 0.5, **gateway},
        "deployments": [
            {
                "model": MODEL,
                "capacity_mu_per_min": 6000.0,
                "routing": {"policy": "round_robin"},
                "replicas": [{"name": "r0", "url": engine_url}],
            }
        ],
        "tenants": [
            {"name": "gold", "api_keys": [KEYS["gold"]], "reserved_mu_per_min": {MODEL: 3000.0}},
            {
                "name": "free",
                "api_keys": [KEYS["free"]],
                "reserved_mu_per_min": {MODEL: 20.0},
                "best_effort_mu_per_min": 0.0,
            },
        ],
        "admission": {"admin_api_keys": [KEYS["admin"]], "deadline_s": 0.5, "burst_s": 0.0},
    }
