"""``fleetgate calibrate --quick`` end to end against a real simulated engine process on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetgate.core.units import load_profile

#: Small batch so that a quick ladder (up to 32 clients) saturates it; time-scaled to keep the test short.
SIM_TIME_SCALE = "0.5"
SIM_ARGS = ["--max-num-seqs", "8"]


def run_calibrate(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``fleetgate calibrate ARGS`` in a subprocess, output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "fleetgate.cli", "calibrate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def sim_engine(start_engine: Callable[..., Any]) -> str:
    """A simulated engine serving the default model name (``fleetgate-sim``); the conftest kills it."""
    url: str = start_engine("fleetgate-sim", *SIM_ARGS, time_scale=SIM_TIME_SCALE).wait_ready()
    return url


@pytest.mark.timeout(120)
def test_calibrate_quick_against_sim_engine(sim_engine: str, tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    png = tmp_path / "fit.png"
    t0 = time.monotonic()
    res = run_calibrate(
        "--engine",
        sim_engine,
        "--model",
        "fleetgate-sim",
        "--out",
        str(out),
        "--plot",
        str(png),
        "--quick",
        timeout=110,
    )
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stderr + res.stdout
    print(res.stdout.splitlines()[-2:], f"{elapsed:.1f} s")
    assert elapsed < 60, f"quick calibration took {elapsed:.1f} s"

    data = json.loads(out.read_text())
    for key in ("alpha", "beta", "gamma", "capacity_mu_per_min", "r2", "mape_holdout", "measurements"):
        assert key in data
    assert data["capacity_mu_per_min"] == 100.0
    assert len(data["measurements"]) == 9
    assert data["alpha"] > 0 and data["beta"] > 0
    # every shape climbed its ladder; the engine reported the requested output lengths
    for m, ladder in zip(data["measurements"], data["ladders"], strict=True):
        assert m["output_tokens"] == ladder["output_tokens"]
        assert m["replica_seconds"] > 0
        assert len(ladder["levels"]) >= 2
    # a linear MU model explains the simulated engine well, on shapes it was not fitted to
    assert data["r2"] > 0.9, data["fit"]
    assert data["mape_holdout"] < 0.2, data["fit"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the output is a loadable cost profile
    prof = load_profile(str(out))
    assert prof.alpha == pytest.approx(data["alpha"])
    assert prof.cost(100, 10) > 0


def test_calibrate_reports_unreachable_engine(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run_calibrate(
        "--engine",
        f"http://127.0.0.1:{port}",
        "--model",
        "m",
        "--out",
        str(tmp_path / "p.json"),
        "--quick",
        timeout=60,
    )
    assert res.returncode == 1
    assert "calibration failed" in res.stderr
    assert not (tmp_path / "p.json").exists()


def test_calibrate_rejects_unreadable_engine_pid(tmp_path: Path) -> None:
    res = run_calibrate(
        "--engine",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--out",
        str(tmp_path / "p.json"),
        "--engine-pid",
        "999999999",
        timeout=60,
    )
    assert res.returncode == 1
    assert "cannot read CPU time" in res.stderr
