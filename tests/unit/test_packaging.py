"""Dependencies: matplotlib only as the ``plots`` extra, imported lazily; the README lists the extras."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_matplotlib_is_only_an_extra_and_the_readme_lists_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("matplotlib")]
    extras = project["optional-dependencies"]
    assert any(d.startswith("matplotlib") for d in extras["plots"])
    readme = (ROOT / "README.md").read_text()
    for name in extras:
        assert f"fleetgate[{name}]" in readme, name


def test_gateway_runs_and_plots_fail_clearly_without_matplotlib() -> None:
    """With matplotlib unimportable: the gateway, engine and CLI modules import, and asking for a plot
    is one clear error."""
    code = """
import sys
sys.modules["matplotlib"] = None  # as if not installed
import fleetgate.cli, fleetgate.runtime, fleetgate.simengine.server, fleetgate.engines.calibration
import fleetgate.sim.report
from fleetgate.plots import PlotsUnavailableError, pyplot
try:
    pyplot()
except PlotsUnavailableError as exc:
    print(exc)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "plots need matplotlib: pip install 'fleetgate[plots]'"
