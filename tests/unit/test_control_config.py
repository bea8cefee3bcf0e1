"""Per-deployment control in config (``provider``, ``autoscaler``, ``remediation``): validation of wrong
combinations, what ``serve`` builds from it, ``up`` as ``serve`` with a local provider, and the deprecated
top-level ``local:`` section."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fleetgate.cli import app
from fleetgate.config import ConfigError, parse_config
from fleetgate.config_control import KubernetesProviderConfig, LocalProviderConfig
from fleetgate.control import SIM_COST_PROFILE, control_plane, local_section_warning, remediation, up_config

STATIC = {"model": "m", "replicas": [{"name": "a", "url": "http://127.0.0.1:9000"}]}
SCALER = {"policy": "fleetgate", "min_replicas": 1, "max_replicas": 16}


def _problems(dep: dict[str, object]) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config({"deployments": [dep]})
    return str(err.value).splitlines()


def test_the_issue_schema_parses() -> None:
    cfg = parse_config(
        {
            "deployments": [
                {
                    "model": "qwen3-8b",
                    "engine": "vllm",
                    "provider": {
                        "kind": "kubernetes",
                        "namespace": "llm",
                        "deployment": "qwen3-8b",
                        "service": "qwen3-8b",
                        "port": "http",
                    },
                    "autoscaler": SCALER,
                    "remediation": "delete_pod",
                },
                {"model": "local", "provider": {"kind": "local", "replicas": 3}, "autoscaler": "none"},
                STATIC,
            ]
        }
    )
    k8s, local, static = cfg.deployments
    assert isinstance(k8s.provider, KubernetesProviderConfig) and k8s.provider.port == "http"
    assert k8s.autoscaler is not None and k8s.autoscaler.max_replicas == 16
    assert isinstance(local.provider, LocalProviderConfig) and local.autoscaler is None
    assert static.provider.kind == "static"
    assert [remediation(d) for d in cfg.deployments] == ["delete_pod", "restart", "none"]


@pytest.mark.parametrize(
    ("dep", "expected"),
    [
        ({**STATIC, "remediation": "delete_pod"}, "deployments.0.remediation: delete_pod needs"),
        ({**STATIC, "remediation": "restart"}, "deployments.0.remediation: restart needs"),
        (
            {"model": "m", "provider": {"kind": "local"}, "remediation": "delete_pod"},
            "deployments.0.remediation: delete_pod",
        ),
        (
            {**STATIC, "autoscaler": SCALER},
            "deployments.0.autoscaler: a static replica list cannot be scaled",
        ),
        ({**STATIC, "provider": {"kind": "local"}}, "deployments.0.replicas: the local provider"),
        (
            {"model": "m", "provider": {"kind": "kubernetes", "service": "s"}},
            "deployments.0.provider.kubernetes",
        ),
        ({"model": "m", "provider": {"kind": "ec2"}}, "deployments.0.provider: Input tag 'ec2'"),
    ],
)
def test_wrong_combinations_are_one_clear_line_each(dep: dict[str, object], expected: str) -> None:
    problems = _problems(dep)
    assert any(line.startswith(expected) for line in problems), problems


def test_serve_builds_providers_autoscalers_and_remediation_from_config() -> None:
    cfg = parse_config(
        {
            "deployments": [
                {"model": "a", "provider": {"kind": "local", "replicas": 3}, "autoscaler": SCALER},
                {"model": "b", "provider": {"kind": "local", "replicas": 1}, "remediation": "none"},
                STATIC,
            ]
        }
    )
    plane = control_plane(cfg)
    assert set(plane.providers) == {"a", "b"} and plane.initial == {"a": 3, "b": 1}
    assert set(plane.autoscalers) == {"a"}
    assert plane.remediate == {"a"}
    k8s = parse_config(
        {
            "deployments": [
                {"model": "k", "provider": {"kind": "kubernetes", "deployment": "d", "service": "s"}}
            ]
        }
    )
    plane = control_plane(k8s)  # the watched Kubernetes provider; the Deployment owns the count
    assert set(plane.providers) == {"k"} and plane.initial == {} and plane.remediate == {"k"}


def test_up_is_serve_with_a_local_provider() -> None:
    cfg = up_config(parse_config({}), "fleetgate-sim", 2)
    (dep,) = cfg.deployments
    assert isinstance(dep.provider, LocalProviderConfig) and dep.provider.replicas == 2
    assert dep.engine == "sim" and dep.cost_profile == SIM_COST_PROFILE
    assert control_plane(cfg).initial == {"fleetgate-sim": 2}
    # a deployment that already names a local provider keeps it; --replicas only overrides the count
    own = parse_config(
        {"deployments": [{"model": "fleetgate-sim", "provider": {"kind": "local", "replicas": 5}}]}
    )
    assert control_plane(up_config(own, "fleetgate-sim")).initial == {"fleetgate-sim": 5}
    assert control_plane(up_config(own, "fleetgate-sim", 1)).initial == {"fleetgate-sim": 1}


def test_the_local_section_still_works_and_says_what_to_write_instead() -> None:
    old = parse_config(
        {
            "local": {
                "engine_args": ["--time-scale", "0.1"],
                "autoscaler": {"policy": "kpa", "max_replicas": 3},
            }
        }
    )
    dep = up_config(old, "fleetgate-sim", 2).deployments[0]
    assert isinstance(dep.provider, LocalProviderConfig) and dep.provider.engine_args == [
        "--time-scale",
        "0.1",
    ]
    assert dep.autoscaler is not None and dep.autoscaler.policy == "kpa"
    warning = local_section_warning(old)
    assert warning is not None and "\n" not in warning and "deprecated" in warning
    # what it says to write is a config that means the same
    suggested = yaml.safe_load(warning.split("write ", 1)[1].rsplit(" instead", 1)[0])
    new = parse_config(suggested)
    assert up_config(new, "fleetgate-sim", 2).deployments[0] == dep
    assert local_section_warning(new) is None


def test_validate_config_cli_accepts_the_keys_and_names_wrong_pairings(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    k8s = {"kind": "kubernetes", "namespace": "llm", "deployment": "d", "service": "s", "port": "http"}
    path.write_text(
        yaml.safe_dump(
            {
                "deployments": [
                    {"model": "a", "provider": k8s, "autoscaler": SCALER, "remediation": "delete_pod"},
                    {"model": "b", "provider": {"kind": "local", "command": ["eng", "--port", "{port}"]}},
                    STATIC,
                ]
            }
        )
    )
    ok = CliRunner().invoke(app, ["validate-config", str(path)])
    assert ok.exit_code == 0 and "ok: 3 deployment(s)" in ok.output, ok.output
    path.write_text(yaml.safe_dump({"deployments": [{**STATIC, "remediation": "restart"}]}))
    bad = CliRunner().invoke(app, ["validate-config", str(path)])
    assert bad.exit_code == 2 and "deployments.0.remediation: restart needs" in bad.output, bad.output
    path.write_text(yaml.safe_dump({**{"deployments": [STATIC]}, "local": {"engine_args": ["--x"]}}))
    old = CliRunner().invoke(app, ["validate-config", str(path)])
    assert old.exit_code == 0 and "the top-level `local:` section is deprecated" in old.output, old.output
