"""Keys from the environment (list items) and from mounted key files, rotated without a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fleetgate.config import ConfigError, hash_api_key, load_config, parse_config
from fleetgate.runtime import build_gateway


def test_env_overrides_reach_list_items(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "deployments": [{"model": "m", "replicas": [{"name": "r0", "url": "http://127.0.0.1:9"}]}],
                "tenants": [{"name": "a", "reserved_mu_per_min": {"m": 10}}],
            }
        )
    )
    env = {
        "FLEETGATE__TENANTS__0__API_KEYS": "sk-from-secret",  # one key, as a Secret's value
        "FLEETGATE__TENANTS__1__API_KEYS__1": "sk-b2",  # applied after __0 whatever the env order
        "FLEETGATE__TENANTS__1__API_KEYS__0": "sk-b1",
        "FLEETGATE__TENANTS__1__NAME": "b",
        "FLEETGATE__DEPLOYMENTS__0__UPSTREAM_API_KEY": "engine-key",
        "FLEETGATE__DEPLOYMENTS__0__REPLICAS__1__NAME": "r1",
        "FLEETGATE__DEPLOYMENTS__0__REPLICAS__1__URL": "http://127.0.0.1:10",
    }
    cfg = load_config(path, env)
    assert cfg.tenants[0].api_keys == [hash_api_key("sk-from-secret")]
    assert cfg.tenants[0].reserved_mu_per_min == {"m": 10}  # the YAML's other fields stay
    assert cfg.tenants[1].name == "b" and cfg.tenants[1].api_keys == [
        hash_api_key("sk-b1"),
        hash_api_key("sk-b2"),
    ]
    assert cfg.deployments[0].upstream_api_key == "engine-key"
    assert [r.name for r in cfg.deployments[0].replicas] == ["r0", "r1"]
    with pytest.raises(ConfigError, match="index 3 skips items"):
        parse_config({"tenants": [{"name": "a"}]}, {"FLEETGATE__TENANTS__3__NAME": "x"})
    with pytest.raises(ConfigError, match="is not a list"):
        parse_config({"gateway": {"port": 1}}, {"FLEETGATE__GATEWAY__0": "x"})


async def _wait_status(client: httpx.AsyncClient, url: str, key: str, status: int, body: Any) -> None:
    got = None
    for _ in range(100):
        resp = await client.post(url, json=body, headers={"Authorization": f"Bearer {key}"})
        got = resp.status_code
        if got == status:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{key}: status {got}, wanted {status}")


async def test_key_files_rotate_without_restart(tmp_path: Path, start_engine: Any) -> None:
    engine = start_engine("m")
    keys = tmp_path / "keys"
    keys.write_text("# tenant a\nsk-file-1\n\n")
    admin = tmp_path / "admin"
    admin.write_text("admin-1\n")
    upstream = tmp_path / "upstream"
    upstream.write_text("engine-key-1\n")
    cfg = parse_config(
        {
            "gateway": {"port": 0, "secret_files_interval_s": 0.1, "health_checks": False},
            "deployments": [
                {
                    "model": "m",
                    "replicas": [{"name": "r0", "url": engine.url}],
                    "upstream_api_key_file": str(upstream),
                }
            ],
            "tenants": [
                {
                    "name": "a",
                    "api_keys": ["sk-inline"],
                    "api_keys_file": str(keys),
                    "reserved_mu_per_min": {"m": 10_000},
                }
            ],
            "admission": {"admin_api_keys_file": str(admin), "burst_s": 10},
        }
    )
    server = build_gateway(cfg)
    headers = server.fleet.deployments["m"].upstream_headers
    assert headers["Authorization"] == "Bearer engine-key-1"
    url = await server.start(0)
    body = {"model": "m", "prompt": "hi", "max_tokens": 1}
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            for key in ("sk-inline", "sk-file-1"):
                await _wait_status(client, "/v1/completions", key, 200, body)
            await _wait_status(client, "/v1/completions", "sk-file-2", 401, body)
            keys.write_text("sk-file-2\n")  # rotated: the old file key goes, the new one works
            admin.write_text("admin-2\n")
            upstream.write_text("engine-key-2")
            await _wait_status(client, "/v1/completions", "sk-file-2", 200, body)
            await _wait_status(client, "/v1/completions", "sk-file-1", 401, body)
            await _wait_status(client, "/v1/completions", "sk-inline", 200, body)
            for _ in range(100):
                if headers["Authorization"] == "Bearer engine-key-2":
                    break
                await asyncio.sleep(0.05)
            assert headers["Authorization"] == "Bearer engine-key-2"
            resp = await client.get("/admin/tenants", headers={"Authorization": "Bearer admin-2"})
            assert resp.status_code == 200
            keys.unlink()  # a vanished file keeps the keys in force (logged), never opens the gateway
            await asyncio.sleep(0.3)
            await _wait_status(client, "/v1/completions", "sk-file-2", 200, body)
            await _wait_status(client, "/v1/completions", "nobody", 401, body)
    finally:
        await server.stop(grace_s=1)


def test_missing_key_file_is_a_start_up_error(tmp_path: Path) -> None:
    cfg = parse_config(
        {
            "deployments": [{"model": "m", "replicas": [{"name": "r0", "url": "http://127.0.0.1:9"}]}],
            "tenants": [{"name": "a", "api_keys_file": str(tmp_path / "absent")}],
        }
    )
    with pytest.raises(ConfigError, match=r"tenants\[0\]\.api_keys_file: cannot use .*absent"):
        build_gateway(cfg)
