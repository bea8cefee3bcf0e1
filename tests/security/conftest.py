"""Fixtures for the security checks: one simulated engine and gateways with tenants, on 127.0.0.1 only
(helpers and constants in sec_env.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sec_env import MODEL, PY, ServerProcess, tenants_config


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
