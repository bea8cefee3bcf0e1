"""Live gateways for API fuzzing (set-up in fuzz_env.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fuzz_env import start_fleet


@pytest.fixture(scope="module")
def open_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    engine, gateway = start_fleet(tmp_path_factory.mktemp("fuzz"), tenants=False)
    yield gateway
    gateway.kill()
    engine.kill()


@pytest.fixture(scope="module")
def tenant_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    engine, gateway = start_fleet(tmp_path_factory.mktemp("fuzz-t"), tenants=True)
    yield gateway
    gateway.kill()
    engine.kill()
