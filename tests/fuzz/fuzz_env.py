"""A live gateway (open admission, and one with tenants) in front of a simulated engine, for API fuzzing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from integration_tools import integration_tools

PY = sys.executable
MODEL = "fuzz-model"
ADMIN_KEY = "sk-fuzz-admin-77aa"
TENANT_KEY = "sk-fuzz-tenant-33bb"


ServerProcess = integration_tools().ServerProcess


def start_fleet(tmp: Path, *, tenants: bool) -> tuple[Any, Any]:
    """(engine, gateway) processes; the engine runs as fast as possible (time scale 0)."""
    engine = ServerProcess(
        [PY, "-m", "fleetgate.cli", "engine", "sim", "--port", "0", "--model", MODEL, "--time-scale", "0"],
        name="fuzz-engine",
    )
    engine.wait_ready(30)
    cfg: dict[str, Any] = {
        "gateway": {"host": "127.0.0.1", "port": 0, "max_body_bytes": 1 << 20, "first_byte_timeout_s": 10},
        "deployments": [
            {"model": MODEL, "capacity_mu_per_min": 1.0e6, "replicas": [{"name": "r0", "url": engine.url}]}
        ],
    }
    if tenants:
        cfg["tenants"] = [
            {"name": "t1", "api_keys": [TENANT_KEY], "reserved_mu_per_min": {MODEL: 1.0e5}},
        ]
        cfg["admission"] = {"admin_api_keys": [ADMIN_KEY], "deadline_s": 0.5}
    path = tmp / ("gateway-tenants.yaml" if tenants else "gateway.yaml")
    path.write_text(yaml.safe_dump(cfg))
    try:
        gateway = ServerProcess([PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], name="fuzz-gw")
        gateway.wait_ready(30)
    except Exception:
        engine.kill()
        raise
    return engine, gateway
