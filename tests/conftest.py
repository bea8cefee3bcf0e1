"""Shared test configuration. Integration fixtures (real processes) live in tests/integration/conftest.py."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Integration tests start real processes: give each a generous default timeout if none is set."""
    for item in items:
        if "integration" in item.path.parts and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(120))
