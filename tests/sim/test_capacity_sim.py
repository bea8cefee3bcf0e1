"""``fleetgate simulate --scenario --capacity``: a small synthetic pool through the CLI, and the JSON's
invariants (pool never exceeded, floors held, reserved never shed while the floors fit, every mode's
schema)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml
from typer.testing import CliRunner

from fleetgate.cli import app

WINDOW_S = 600
HOURS = 3


def _rates(path: Path) -> None:
    """Three hours of 10-minute windows: a steady reserved tenant and a best-effort tenant that bursts in hour
    two on deployment ``a``; a heavy steady best-effort tenant and a small reserved one on ``b``."""
    cols = ["client_1", "client_2", "client_3", "client_4"]
    lines = ["t_s,total_rps,active_clients," + ",".join(cols)]
    for w in range(HOURS * 3600 // WINDOW_S):
        burst = 3600 <= w * WINDOW_S < 7200
        rates = [4.0, 30.0 if burst else 2.0, 14.0, 2.0]
        lines.append(f"{w * WINDOW_S},{sum(rates)},4," + ",".join(f"{r}" for r in rates))
    path.write_text("\n".join(lines) + "\n")


def _scenario(tmp_path: Path) -> Path:
    _rates(tmp_path / "rates.csv")
    dep = {"trace": "rates.csv", "profile": "llama2-70b-h100-tp4", "gpus_per_replica": 1, "max_replicas": 16}
    sc = {
        "pool": {"name": "h100", "gpus": 10},
        "cold_start_s": 120,
        "slo_ttft_p95_s": 1.0,
        "deployments": [
            {"name": "a", "tenants": ["client_1", "client_2"], "reservations": {"client_1": 140}, **dep},
            {"name": "b", "tenants": ["client_3", "client_4"], "reservations": {"client_4": 70}, **dep},
        ],
    }
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path


def _run(path: Path, mode: str, out: Path) -> dict:
    r = CliRunner().invoke(
        app, ["simulate", "--scenario", str(path), "--capacity", mode, "--json", str(out), "--no-progress"]
    )
    assert r.exit_code == 0, r.output
    data = orjson.loads(out.read_bytes())
    assert data == orjson.loads(r.stdout)
    return data


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("capacity")
    path = _scenario(tmp)
    return {m: _run(path, m, tmp / f"{m}.json") for m in ("fleetgate", "independent", "static")}


@pytest.mark.parametrize("mode", ["fleetgate", "independent", "static"])
def test_every_mode_reports_the_schema_and_stays_in_the_pool(runs: dict[str, dict], mode: str) -> None:
    s = runs[mode]
    assert s["capacity"] == mode and s["mode"] == "fluid"
    assert 0 < s["max_gpus_in_use"] <= s["pool"]["gpus"] == 10
    assert s["pool_gpu_hours_available"] == 10 * HOURS
    assert 0 < s["pool_gpu_hours"] <= s["pool_gpu_hours_available"] + 1e-9
    assert 0 < s["useful_gpu_hours"] <= s["pool_gpu_hours"]
    assert set(s["deployments"]) == {"a", "b"}
    for d in s["deployments"].values():
        assert {"replica_hours", "peak_replicas", "slo_attainment"} <= set(d)
        assert d["replica_hours"] > 0 and d["peak_replicas"] >= 1
    assert set(s["tiers"]) == {"reserved", "best_effort"}
    for t in s["tiers"].values():
        assert {"requests", "served", "shed", "slo_attainment"} <= set(t)
        assert abs(t["requests"] - t["served"] - t["shed"]) <= 1
    assert set(s["tenants"]) == {"client_1", "client_2", "client_3", "client_4"}
    keys = {"deployment", "tier", "requests", "served", "shed", "peak_mu_per_min", "mean_mu_per_min"}
    for name, t in s["tenants"].items():
        assert keys <= set(t)
        assert t["tier"] == ("reserved" if name in ("client_1", "client_4") else "best_effort")
        assert t["peak_mu_per_min"] >= t["mean_mu_per_min"] > 0
    # Every replayed request is counted once: the tenants' requests are the tiers' requests.
    tenants_total = sum(t["requests"] for t in s["tenants"].values())
    tiers_total = sum(t["requests"] for t in s["tiers"].values())
    assert abs(tenants_total - tiers_total) <= 4
    # The same draw in every mode (only capacity management differs).
    assert tiers_total == sum(t["requests"] for t in runs["static"]["tiers"].values())


def test_fleetgate_holds_the_floors_and_never_sheds_reserved_work(runs: dict[str, dict]) -> None:
    s = runs["fleetgate"]
    a, b = s["deployments"]["a"], s["deployments"]["b"]
    assert (a["floor_replicas"], b["floor_replicas"]) == (2, 1)  # ceil(140 / 70), ceil(70 / 70)
    for d in (a, b):
        assert d["min_ready_replicas"] >= d["floor_replicas"]
    assert s["tiers"]["reserved"]["shed"] == 0
    assert s["tiers"]["reserved"]["slo_attainment"] >= 0.99
    # The burst on ``a`` makes the pool short: best-effort is shed (counted), and a's replicas were moved.
    assert s["tiers"]["best_effort"]["shed"] > 0
    assert a["peak_replicas"] > runs["static"]["deployments"]["a"]["peak_replicas"]


def test_static_is_a_fixed_split_by_mean_demand(runs: dict[str, dict]) -> None:
    s = runs["static"]
    a, b = s["deployments"]["a"], s["deployments"]["b"]
    assert a["peak_replicas"] + b["peak_replicas"] == 10
    assert a["replica_hours"] == pytest.approx(a["peak_replicas"] * HOURS)
    # b's mean offered load (16 req/s) is above a's (4 + 30/3 + 2*2/3 = 15.3 req/s) -> at least as many.
    assert b["peak_replicas"] >= a["peak_replicas"]


def test_bad_scenarios_exit_2_with_the_field(tmp_path: Path) -> None:
    path = _scenario(tmp_path)
    r = CliRunner().invoke(
        app, ["simulate", "--scenario", str(path), "--capacity", "greedy", "--no-progress"]
    )
    assert r.exit_code == 2 and "one of fleetgate, static, independent" in r.output
    sc = yaml.safe_load(path.read_text())
    sc["deployments"][0]["reservations"] = {"client_9": 10}
    path.write_text(yaml.safe_dump(sc))
    r = CliRunner().invoke(app, ["simulate", "--scenario", str(path), "--no-progress"])
    assert r.exit_code == 2 and "client_9" in r.output
    sc["deployments"][0]["reservations"] = {}
    sc["pool"]["gpuz"] = 3
    path.write_text(yaml.safe_dump(sc))
    r = CliRunner().invoke(app, ["simulate", "--scenario", str(path), "--no-progress"])
    assert r.exit_code == 2 and "pool.gpuz" in r.output


def test_options_that_do_not_apply_to_a_scenario_exit_2(tmp_path: Path) -> None:
    path = _scenario(tmp_path)
    args = ["simulate", "--scenario", str(path), "--no-progress"]
    r = CliRunner().invoke(app, [*args, "--trace", "x.csv", "--replicas", "4"])
    assert r.exit_code == 2
    assert "--trace, --replicas cannot be used with --scenario" in r.output
    r = CliRunner().invoke(app, [*args, "--cold-start-s", "60"])
    assert r.exit_code == 2 and "--cold-start-s" in r.output
    r = CliRunner().invoke(app, ["simulate", "--trace", "synthetic:n=10", "--capacity", "static"])
    assert r.exit_code == 2 and "--capacity needs --scenario" in r.output


def test_lending_idle_gpus_serves_best_effort_at_least_as_well(tmp_path: Path, runs: dict[str, dict]) -> None:
    """The same scenario with ``lend_idle_gpus: false``: nothing lent; with lending (the default) GPUs are
    lent, best-effort is served at least as well, and the reserved tier is no worse."""
    path = _scenario(tmp_path)
    sc = yaml.safe_load(path.read_text())
    sc["lend_idle_gpus"] = False
    path.write_text(yaml.safe_dump(sc))
    off, on = _run(path, "fleetgate", tmp_path / "off.json"), runs["fleetgate"]
    assert off["lent_gpu_hours"] == 0 and on["lent_gpu_hours"] > 0
    assert on["pool_gpu_hours"] >= off["pool_gpu_hours"] and on["pool_gpu_hours"] <= 10 * HOURS + 1e-6
    assert on["tiers"]["best_effort"]["served"] >= off["tiers"]["best_effort"]["served"]
    assert on["tiers"]["reserved"]["shed"] == 0 and off["tiers"]["reserved"]["shed"] == 0
