"""The capacity ledger's ``used``, fleet-wide (issue 18 item 6): two ``fleetgate serve`` processes sharing a
real Redis (FLEETGATE_TEST_REDIS_URL) in front of one simulated engine. Requests go through gateway A (tenant
gold) and gateway B (tenant silver); afterwards both report in ``/admin/capacity`` the same used MU, the sum
of what each settled (the tenants' settled MU totals, which the store also keeps), with ``used_scope:
fleet``, while each gateway's own ledger counts only its share; ``fleetgate_tenant_used_mu_per_minute`` is
the same fleet-wide figure per tenant on both.
"""

from __future__ import annotations

import math
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

REDIS_URL = os.environ.get("FLEETGATE_TEST_REDIS_URL")
pytestmark = [
    pytest.mark.skipif(not REDIS_URL, reason="FLEETGATE_TEST_REDIS_URL not set (scripts/test.sh starts one)"),
    pytest.mark.timeout(120),
]
ADMIN = {"Authorization": "Bearer sk-admin"}
KEYS = {"gold": "sk-gold", "silver": "sk-silver"}


def _config(engine_url: str, namespace: str) -> dict[str, Any]:
    return {
        "gateway": {"host": "127.0.0.1", "port": 0, "scrape_interval_s": 0.5},
        "deployments": [{"model": "sim-model", "replicas": [{"name": "e0", "url": engine_url}]}],
        "tenants": [
            {
                "name": "gold",
                "api_keys": [KEYS["gold"]],
                "reserved_mu_per_min": {"sim-model": 50},
                "best_effort_mu_per_min": None,
            },
            {"name": "silver", "api_keys": [KEYS["silver"]], "best_effort_mu_per_min": None},
        ],
        "admission": {
            "admin_api_keys": ["sk-admin"],
            "store": {"kind": "redis", "url": REDIS_URL, "namespace": namespace},
        },
        "ops": {"access_log": False},
    }


def _send(client: httpx.Client, url: str, tenant: str, n: int) -> None:
    for i in range(n):
        body = {
            "model": "sim-model",
            "messages": [{"role": "user", "content": f"{tenant} question {i}: " + "word " * (20 + 7 * i)}],
            "max_tokens": 8 + i,
            "stream": i % 2 == 0,
        }
        r = client.post(
            f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEYS[tenant]}"}
        )
        r.read()
        assert r.status_code == 200, r.text


def _tenant_used(text: str) -> dict[str, float]:
    """``fleetgate_tenant_used_mu_per_minute`` of sim-model by tenant label."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.fullmatch(r"fleetgate_tenant_used_mu_per_minute\{(.*)\} (\S+)", line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            if labels["deployment"] == "sim-model":
                out[labels["tenant"]] = float(m.group(2))
    return out


def _row(client: httpx.Client, url: str) -> dict[str, Any]:
    (row,) = client.get(f"{url}/admin/capacity", headers=ADMIN).json()["deployments"]
    return dict(row)


def test_both_gateways_report_the_fleet_sum(tools: Any, start_engine: Any, tmp_path: Path) -> None:
    engine = start_engine("sim-model")
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(_config(engine.url, f"t{uuid.uuid4().hex}")))
    gateways = [
        tools.ServerProcess([tools.PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], name=f"gw-{i}")
        for i in range(2)
    ]
    try:
        url_a, url_b = (g.wait_ready(60) for g in gateways)
        with httpx.Client(timeout=30) as client:
            _send(client, url_a, "gold", 6)
            _send(client, url_b, "silver", 4)
            settled = {
                t: client.get(f"{url_a}/admin/usage/{t}", headers=ADMIN).json()["usage"]
                for t in ("gold", "silver")
            }
            assert (settled["gold"]["settled"], settled["silver"]["settled"]) == (6, 4)
            total = settled["gold"]["settled_mu"] + settled["silver"]["settled_mu"]
            assert total > 0
            rows: list[dict[str, Any]] = []
            deadline = time.monotonic() + 10.0  # each gateway sends and reads the window every second
            while time.monotonic() < deadline:
                rows = [_row(client, url) for url in (url_a, url_b)]
                if all(math.isclose(r["used_mu"], total, rel_tol=1e-9) for r in rows):
                    break
                time.sleep(0.2)
            for row in rows:
                assert row["used_scope"] == "fleet", rows
                assert math.isclose(row["used_mu"], total, rel_tol=1e-9), (rows, total)
                assert math.isclose(row["used_mu_per_min"], total * 60.0 / row["used_window_s"], rel_tol=1e-9)
                assert row["settled_requests_in_window"] == pytest.approx(10.0)
                assert math.isclose(
                    row["headroom_mu_per_min"], row["capacity_mu_per_min"] - row["used_mu_per_min"]
                )
            # each gateway's own ledger still counts only what it settled itself: the requests did split
            assert [r["settled_requests_total"] for r in rows] == [6, 4]
            # fleetgate_tenant_used_mu_per_minute is the ledger's figure too: fleet-wide on both gateways
            # (gold is reserved, so named on B although B never served it; silver, neither reserved nor
            # seen by A, is A's ``other``)
            per_min = {t: settled[t]["settled_mu"] * 60.0 / rows[0]["used_window_s"] for t in settled}
            for url, names in (
                (url_a, {"gold": "gold", "other": "silver"}),
                (url_b, {"gold": "gold", "silver": "silver"}),
            ):
                used = _tenant_used(client.get(f"{url}/metrics", headers=ADMIN).text)
                assert set(used) == set(names), (url, used)
                for label, tenant in names.items():
                    assert math.isclose(used[label], per_min[tenant], rel_tol=1e-9), (url, used, per_min)
    finally:
        for g in gateways:
            g.kill()


def test_a_follower_shows_the_pool_leaders_decisions_and_history(tools: Any, tmp_path: Path) -> None:
    """Issue 18's pool picture on every gateway: two ``fleetgate serve`` on one Redis, a pool of 2 GPUs with
    one deployment of local simulated replicas and a Redis leader election. Only the leader allocates; the
    follower's ``/admin/capacity`` shows the leader's last decision and history (``from_leader``), not
    ``decided: false``."""
    doc = {
        "gateway": {"host": "127.0.0.1", "port": 0},
        "pools": [{"name": "gpus", "gpus": 2}],
        "deployments": [
            {
                "model": "sim-model",
                "pool": "gpus",
                "engine": "sim",
                "provider": {"kind": "local", "replicas": 1},
                "autoscaler": {"policy": "static", "replicas": 1},
                "leader_election": {"kind": "redis"},
            }
        ],
        "tenants": [{"name": "gold", "api_keys": [KEYS["gold"]], "reserved_mu_per_min": {"sim-model": 10}}],
        "admission": {
            "admin_api_keys": ["sk-admin"],
            "store": {"kind": "redis", "url": REDIS_URL, "namespace": f"t{uuid.uuid4().hex}"},
        },
        "ops": {"access_log": False},
    }
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(doc))
    gateways = [
        tools.ServerProcess(
            [tools.PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], name=f"pool-{i}"
        )
        for i in range(2)
    ]
    try:
        urls = [g.wait_ready(90) for g in gateways]
        pools: list[dict[str, Any]] = []
        with httpx.Client(timeout=30) as client:
            deadline = time.monotonic() + 40.0  # the election, the first decisions, one ledger round
            while time.monotonic() < deadline:
                pools = [client.get(f"{u}/admin/capacity", headers=ADMIN).json()["pools"][0] for u in urls]
                if all(p["decided"] for p in pools) and any(p.get("from_leader") for p in pools):
                    break
                time.sleep(0.5)
        assert all(p["decided"] for p in pools), pools
        leader, follower = sorted(pools, key=lambda p: bool(p.get("from_leader")))
        assert "from_leader" not in leader and follower["from_leader"] is True, pools
        assert follower["published_s_ago"] < 10.0
        for key in ("pool", "gpus", "floor_gpus", "floors_fit", "sold_mu_per_min"):
            assert follower[key] == leader[key], (key, pools)
        (dep_l,), (dep_f,) = leader["deployments"], follower["deployments"]
        assert (
            dep_f["deployment"] == "sim-model" and dep_f["allocated_replicas"] == dep_l["allocated_replicas"]
        )
        assert [t["tenant"] for t in dep_f["tenants"]] == ["gold"]
        assert dep_f["tenants"][0]["reserved_mu_per_min"] == 10
        # the history, as the leader remembers it, seen from the follower: oldest first, ending about now
        assert follower["history"] and len(follower["history"]) <= len(leader["history"]) + 5
        ts = [h["t"] for h in follower["history"]]
        assert ts == sorted(ts) and -10.0 < ts[-1] <= 0.0, ts[-5:]
        assert set(follower["history"][-1]) == set(leader["history"][-1])
    finally:
        for g in gateways:
            g.kill()
