"""``fleetgate validate-config`` and start-up errors: every problem at once, each with its path, one line
each, never a traceback; the shipped Kubernetes ConfigMap passes."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from fleetgate.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _validate(tmp_path: Path, cfg: object | str) -> tuple[int, str]:
    path = tmp_path / "c.yaml"
    path.write_text(cfg if isinstance(cfg, str) else yaml.safe_dump(cfg))
    result = runner.invoke(app, ["validate-config", str(path)])
    return result.exit_code, result.output


def test_all_cross_field_problems_at_once_with_paths(tmp_path: Path) -> None:
    code, out = _validate(
        tmp_path,
        {
            "deployments": [
                {"model": "m", "cost_profile": "no-such-profile"},
                {"model": "m"},
            ],
            "tenants": [
                {"name": "a", "api_keys": ["k1"], "reserved_mu_per_min": {"ghost": 5}},
                {"name": "a", "api_keys": ["k1"]},
            ],
            "admission": {"store": {"kind": "redis", "url": "http://127.0.0.1:6379"}},
        },
    )
    assert code == 2
    for line in (
        "deployments.0.cost_profile: unknown cost profile 'no-such-profile'",
        "deployments.1.model: 'm' is already deployments.0",
        "tenants.1.name: tenant 'a' is already tenants.0",
        "tenants.1.api_keys.0: an API key used twice (also tenants.0.api_keys.0)",
        "admission.store.url: unsupported scheme 'http'",
    ):
        assert line in out, out
    assert "<root>" not in out and "Traceback" not in out


def test_serve_needs_served_models_and_something_to_serve(tmp_path: Path) -> None:
    code, out = _validate(
        tmp_path,
        {
            "deployments": [{"model": "m", "tokenizer": "/nonexistent/tokenizer.json"}],
            "tenants": [{"name": "a", "reserved_mu_per_min": {"m": 1, "ghost": 5}}],
            "ops": {"slo": {"tenant_ttft_target_s": {"nobody": 1.0}}},
        },
    )
    assert code == 2
    assert "tenants.0.reserved_mu_per_min.ghost: no deployment serves 'ghost'" in out
    assert "ops.slo.tenant_ttft_target_s.nobody: no tenant is called 'nobody'" in out
    assert "deployments.0.tokenizer: no tokenizer.json at /nonexistent/tokenizer.json" in out
    assert "reserved_mu_per_min.m:" not in out
    code, out = _validate(tmp_path, "")
    assert code == 2 and "the file is empty" in out
    code, out = _validate(tmp_path, {"gateway": {"port": 9000}})
    assert code == 2 and "deployments: none configured" in out


def test_shipped_configmap_validates(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / "gateway.yaml").read_text()))
    configmap = next(d for d in docs if d and d.get("kind") == "ConfigMap")
    code, out = _validate(tmp_path, configmap["data"]["fleetgate.yaml"])
    assert code == 0 and out.startswith("ok: 1 deployment(s)"), out


def test_serve_start_up_errors_are_one_line(tmp_path: Path) -> None:
    """No deployments: refused before anything starts (no 'ready'); a bad key file: one line naming it."""
    cases = [
        ({"gateway": {"port": 0}}, "deployments: none configured"),
        (
            {
                "gateway": {"port": 0},
                "deployments": [{"model": "m", "upstream_api_key_file": str(tmp_path / "absent")}],
            },
            "deployments.0.upstream_api_key_file: cannot read",
        ),
    ]
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    replica = {"name": "r0", "url": "http://127.0.0.1:9"}
    cases.append(
        (
            {
                "gateway": {"port": port, "health_checks": False},
                "deployments": [{"model": "m", "replicas": [replica]}],
            },
            f"fleetgate: cannot start: gateway.port: cannot listen on 127.0.0.1:{port}",
        )
    )
    for cfg, expected in cases:
        path = tmp_path / "serve.yaml"
        path.write_text(yaml.safe_dump(cfg))
        proc = subprocess.run(
            [sys.executable, "-m", "fleetgate.cli", "serve", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert "ready" not in proc.stdout and "Traceback" not in proc.stderr
        assert expected in proc.stderr
        assert len(proc.stderr.strip().splitlines()) <= 2  # "invalid config: PATH" + the problem
    busy.close()


def test_version_flag() -> None:
    from fleetgate import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"fleetgate {__version__}"
