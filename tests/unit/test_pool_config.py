"""GPU pools in the config (issue 18 item 1, 3): a deployment names its pool and replica size, and a config
whose reservations need more GPUs than a pool has is refused at load, by ``fleetgate validate-config`` and
``fleetgate serve`` (one line naming the pool and the shortfall in GPUs and MU/min)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fleetgate.config import ConfigError, parse_config

REPLICA = [{"name": "r", "url": "http://127.0.0.1:9"}]


def _cfg(gpus: int, reserved: dict[str, float], **extra: object) -> dict[str, object]:
    return {
        "pools": [{"name": "h100", "gpus": gpus}],
        "deployments": [
            {"model": "chat", "pool": "h100", "replicas": REPLICA},
            {"model": "code", "pool": "h100", "gpus_per_replica": 2, "replicas": REPLICA},
            {"model": "free", "replicas": REPLICA},  # no pool: today's behaviour, never counted
        ],
        "tenants": [
            {"name": "a", "reserved_mu_per_min": reserved},
            {"name": "b", "reserved_mu_per_min": {"chat": 50.0, "free": 1e6}},
        ],
        **extra,
    }


def test_reservations_that_fit_load_and_default_to_one_gpu_per_replica() -> None:
    # chat: 750 MU/min at 100 MU/min per replica and target 0.7 -> 11 replicas; code: 200 -> 3 x 2 GPUs
    cfg = parse_config(_cfg(17, {"chat": 700.0, "code": 200.0}))
    assert [p.name for p in cfg.pools] == ["h100"]
    chat, code, free = cfg.deployments
    assert (chat.pool, chat.gpus_per_replica, code.gpus_per_replica, free.pool) == ("h100", 1, 2, None)


def test_an_oversold_pool_is_refused_with_its_shortfall() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_cfg(10, {"chat": 700.0, "code": 200.0}))
    lines = str(err.value).splitlines()
    assert lines == [
        "pools.0: pool 'h100' is oversold: the reservations on its deployments (950 MU/min) need 17 GPUs at "
        "target utilisation 0.7, it has 10: short by 7 GPUs and 371.7 MU/min"
    ]


def test_the_target_utilisation_is_the_configured_autoscalers() -> None:
    local = {"autoscaler": {"policy": "fleetgate", "target_utilisation": 1.0}}
    parse_config(_cfg(14, {"chat": 700.0, "code": 200.0}, local=local))  # 8 + 2 x 2 = 12 GPUs at 100 %
    with pytest.raises(ConfigError, match="need 12 GPUs at target utilisation 1, it has 11: short by 1 GPUs"):
        parse_config(_cfg(11, {"chat": 700.0, "code": 200.0}, local=local))
    # the deployment's own autoscaler (its provider must be able to scale), here on "chat" only
    own = _cfg(14, {"chat": 700.0, "code": 200.0})
    chat = own["deployments"][0]  # type: ignore[index]
    del chat["replicas"]
    chat.update(provider={"kind": "local"}, autoscaler={"policy": "fleetgate", "target_utilisation": 1.0})
    parse_config(own)  # chat 8 + code 3 x 2 = 14 GPUs
    own["pools"] = [{"name": "h100", "gpus": 13}]
    with pytest.raises(ConfigError, match=r"need 14 GPUs at target utilisation 0\.7/1, it has 13"):
        parse_config(own)


def test_unknown_and_duplicate_pools_and_replicas_too_large_are_each_reported() -> None:
    data = _cfg(4, {})
    data["pools"] = [{"name": "h100", "gpus": 4}, {"name": "h100", "gpus": 8}]
    deps = data["deployments"]
    assert isinstance(deps, list)
    deps[1]["gpus_per_replica"] = 8
    deps[2]["pool"] = "a100"
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert str(err.value).splitlines() == [
        "pools.1.name: pool 'h100' is already pools.0",
        "deployments.1.gpus_per_replica: 8 GPUs per replica do not fit pool 'h100' (4 GPUs)",
        "deployments.2.pool: no pool is called 'a100'",
    ]


def test_field_checks_on_pools() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(
            {"pools": [{"name": "", "gpus": 0}], "deployments": [{"model": "m", "gpus_per_replica": 0}]}
        )
    out = str(err.value)
    for path in ("pools.0.name", "pools.0.gpus", "deployments.0.gpus_per_replica"):
        assert path in out, out


@pytest.mark.parametrize("command", ["validate-config", "serve"])
def test_the_real_cli_refuses_an_oversold_pool(tmp_path: Path, command: str) -> None:
    path = tmp_path / "oversold.yaml"
    path.write_text(yaml.safe_dump(_cfg(10, {"chat": 700.0, "code": 200.0})))
    args = [str(path)] if command == "validate-config" else ["--config", str(path)]
    proc = subprocess.run(
        [sys.executable, "-m", "fleetgate.cli", command, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "pools.0: pool 'h100' is oversold" in proc.stderr
    assert "short by 7 GPUs and 371.7 MU/min" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_real_cli_accepts_a_pool_that_fits(tmp_path: Path) -> None:
    path = tmp_path / "fits.yaml"
    path.write_text(yaml.safe_dump(_cfg(17, {"chat": 700.0, "code": 200.0})))
    proc = subprocess.run(
        [sys.executable, "-m", "fleetgate.cli", "validate-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ok: 3 deployment(s)" in proc.stdout


def test_per_replica_capacity_falls_back_to_the_cost_profile(tmp_path: Path) -> None:
    """Without ``capacity_mu_per_min`` a deployment's replicas serve what its cost profile says (here 200
    MU/min per replica: half the replicas of the default profile's 100), with it the value written."""
    from fleetgate.gateway.fleet import build_deployment
    from fleetgate.profiles import replica_capacity_mu_per_min

    profile = tmp_path / "big.json"
    profile.write_text('{"name": "big", "alpha": 0.001, "beta": 0.01, "capacity_mu_per_min": 200}')
    doc = _cfg(17, {"chat": 700.0, "code": 200.0})
    chat = doc["deployments"][0]  # type: ignore[index]
    chat["cost_profile"] = str(profile)
    # chat: 750 MU/min at 200 per replica, target 0.7 -> 6 replicas; code 3 x 2 GPUs: 12 GPUs
    cfg = parse_config({**doc, "pools": [{"name": "h100", "gpus": 12}]})
    assert replica_capacity_mu_per_min(cfg.deployments[0]) == 200.0
    assert replica_capacity_mu_per_min(cfg.deployments[1]) == 100.0  # the default profile's
    assert build_deployment(cfg.deployments[0]).profile.capacity_mu_per_min == 200.0
    chat["capacity_mu_per_min"] = 150.0  # written: wins over the profile (750 / 105 -> 8, + 6 GPUs)
    with pytest.raises(ConfigError, match=r"need 14 GPUs at target utilisation 0\.7, it has 12"):
        parse_config({**doc, "pools": [{"name": "h100", "gpus": 12}]})
