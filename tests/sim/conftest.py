"""Shared fixtures: where the real traces are (skip clearly when they are not on this machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgate.sim.traces import default_traces_dir


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    path = default_traces_dir()
    if not path.is_dir():
        pytest.skip(f"shared traces not found at {path} (set FLEETGATE_TRACES_DIR to the traces folder)")
    return path


@pytest.fixture(scope="session")
def mooncake_path(traces_dir: Path) -> Path:
    path = traces_dir / "mooncake" / "conversation_trace.jsonl"
    if not path.is_file():
        pytest.skip(f"Mooncake trace missing: {path}")
    return path


@pytest.fixture(scope="session")
def azure_path(traces_dir: Path) -> Path:
    path = traces_dir / "azure-2023" / "AzureLLMInferenceTrace_conv.csv"
    if not path.is_file():
        pytest.skip(f"Azure trace missing: {path}")
    return path


@pytest.fixture(scope="session")
def servegen_path(traces_dir: Path) -> Path:
    path = traces_dir / "servegen" / "rates_language_m-large.csv"
    if not path.is_file():
        pytest.skip(f"ServeGen rate table missing: {path}")
    return path
