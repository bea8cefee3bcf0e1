"""``fleetgate calibrate --quick`` end to end against a real simulated engine process on 127.0.0.1."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetgate.profiles import load_profile

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
    # stdout is a pipe, not a terminal: one progress line per shape, with an ETA
    progress = [line for line in res.stdout.splitlines() if line.startswith("calibrate: ")]
    assert progress[0] == "calibrate: 9 shapes planned"
    assert len(progress) == 10 and all(re.search(r"s elapsed, ETA \d+ s$", p) for p in progress[1:])
    assert progress[-1].startswith("calibrate: 9/9 ") and progress[-1].endswith("ETA 0 s")
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


def _no_engine_args(tmp_path: Path) -> list[str]:
    """``--engine``, ``--model`` and ``--out`` for a run refused before it sends anything."""
    return ["--engine", "http://127.0.0.1:9", "--model", "m", "--out", str(tmp_path / "p.json")]


def test_calibrate_rejects_unreadable_engine_pid(tmp_path: Path) -> None:
    res = run_calibrate(*_no_engine_args(tmp_path), "--engine-pid", "999999999", timeout=60)
    assert res.returncode == 1
    assert "cannot read CPU time" in res.stderr


def test_calibrate_rounds_need_the_engine_cpu_clock_and_no_budget(tmp_path: Path) -> None:
    """Later passes merge a shape's busy seconds, which only an engine CPU clock measures; a budget would
    cut the passes short of some shapes. Refused before any request is sent."""
    base = [*_no_engine_args(tmp_path), "--rounds", "2"]
    for extra in ([], ["--engine-pid", "1", "--budget-s", "30"]):
        res = run_calibrate(*base, *extra, timeout=60)
        assert res.returncode == 2, res.stderr
        assert "--rounds above 1 needs --engine-pid and no --budget-s" in res.stderr
    assert not (tmp_path / "p.json").exists()


@pytest.mark.timeout(120)
def test_calibrate_budget_plans_a_spread_subset(start_engine: Callable[..., Any], tmp_path: Path) -> None:
    """``--budget-s`` smaller than the sweep: the shapes that fit (at least the 6 a fit needs) are measured,
    spread over the design (the first shapes span the smallest and largest lengths)."""
    url = start_engine("fleetgate-sim", *SIM_ARGS, time_scale="0.05").wait_ready()
    out = tmp_path / "profile.json"
    res = run_calibrate(
        "--engine",
        url,
        "--model",
        "fleetgate-sim",
        "--out",
        str(out),
        "--quick",
        "--budget-s",
        "1",
        timeout=110,
    )
    assert res.returncode == 0, res.stderr + res.stdout
    assert "calibrate: 9 shapes planned; budget 1 s" in res.stdout
    assert "calibrate: budget reached: 6 of 9 shapes measured" in res.stdout
    data = json.loads(out.read_text())
    shapes = [(m["input_tokens"], m["output_tokens"]) for m in data["ladders"]]
    assert len(shapes) == 6
    assert {32, 1024} <= {i for i, _ in shapes} and {4, 96} <= {o for _, o in shapes}
