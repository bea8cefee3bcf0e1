"""Schemathesis against the gateway's own /openapi.json: generated valid and invalid requests for every
operation (coverage and fuzzing phases); any 5xx caused by input is a bug.

Runs the schemathesis CLI against a live gateway process (its pytest plugin does not load under this
pytest). CI: ``-n 25`` (a few hundred cases). Long run: ``FLEETGATE_FUZZ_EXAMPLES=1000`` (>= 10,000 cases),
see docs/reliability.md.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fuzz_env import ADMIN_KEY, TENANT_KEY

EXAMPLES = int(os.environ.get("FLEETGATE_FUZZ_EXAMPLES", "25"))
CLI = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")

pytestmark = [
    pytest.mark.skipif(CLI is None, reason="schemathesis not installed (pip install -e '.[dev]')"),
    pytest.mark.timeout(3600),
]


def run_schemathesis(url: str, examples: int, tmp: Path, *headers: str) -> tuple[int, int]:
    """Run it; returns (generated, passed) and fails the test with the report's tail on any failure."""
    assert CLI is not None
    args = [
        CLI,
        "run",
        url + "/openapi.json",
        "-n",
        str(examples),
        "--checks",
        "not_a_server_error",
        "--seed",
        "20261130",
        "--report",
        "junit",
        "--report-dir",
        str(tmp),
    ]
    for header in headers:
        args += ["-H", header]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=3500)
    out = proc.stdout + proc.stderr
    match = re.search(r"(\d+) generated, (\d+) passed", out)
    assert proc.returncode == 0, out[-6000:]
    assert match is not None, out[-3000:]
    generated, passed = int(match.group(1)), int(match.group(2))
    print(f"schemathesis {url}: {generated} generated, {passed} passed")
    return generated, passed


def test_open_gateway_never_answers_5xx(open_gateway: Any, tmp_path: Path) -> None:
    generated, passed = run_schemathesis(open_gateway.url, EXAMPLES, tmp_path)
    assert generated >= 100 and passed == generated


@pytest.mark.parametrize("key", [ADMIN_KEY, TENANT_KEY, "sk-wrong"])
def test_tenant_gateway_never_answers_5xx(tenant_gateway: Any, tmp_path: Path, key: str) -> None:
    generated, passed = run_schemathesis(
        tenant_gateway.url, max(5, EXAMPLES // 3), tmp_path, f"Authorization: Bearer {key}"
    )
    assert generated >= 50 and passed == generated
