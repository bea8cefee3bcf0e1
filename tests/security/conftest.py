"""Fixtures for the security checks: one simulated engine and gateways with tenants, on 127.0.0.1 only.

Processes come from tests/integration/conftest.py's ``ServerProcess`` (loaded read-only); every gateway's
stdout/stderr is captured so the tests can search it for leaked keys.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
MODEL = "sec-model"
KEYS = {
    "gold": "sk-sec-gold-5b1d9e0c",
    "free": "sk-sec-free-a8c2f713",
    "admin": "sk-sec-admin-40e6bb21",
}


def _tools() -> Any:
    name = "fleetgate_integration_tools"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "integration" / "conftest.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


ServerProcess = _tools().ServerProcess


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
            {"name": "free", "api_keys": [KEYS["free"]], "reserved_mu_per_min": {MODEL: 20.0},
             "best_effort_mu_per_min": 0.0},
        ],  # fmt: skip
        "admission": {"admin_api_keys": [KEYS["admin"]], "deadline_s": 0.5, "burst_s": 0.0},
    }


@pytest.fixture
def engine() -> Iterator[Any]:
    proc = ServerProcess(
        [PY, "-m", "fleetgate.cli", "engine", "sim", "--port", "0", "--model", MODEL, "--time-scale", "0.01"],
        name="engine",
    )
    proc.wait_ready(30)
    yield proc
    proc.kill()


GatewayStarter = Callable[..., Any]


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[GatewayStarter]:
    """``start(config_dict)`` runs ``fleetgate serve`` with that config; killed at teardown."""
    procs: list[Any] = []

    def start(cfg: dict[str, Any]) -> Any:
        path = tmp_path / f"gateway-{len(procs)}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        proc = ServerProcess([PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], name="gateway")
        procs.append(proc)
        proc.wait_ready(30)
        return proc

    yield start
    for proc in procs:
        proc.kill()


@pytest.fixture
def gateway(engine: Any, start_gateway: GatewayStarter) -> Any:
    """A gateway with the two tenants in front of one engine, 64 KiB body limit."""
    return start_gateway(tenants_config(engine.url, max_body_bytes=65536))
