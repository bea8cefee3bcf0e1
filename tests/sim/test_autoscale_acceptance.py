"""CI-sized version of the ServeGen autoscaling acceptance (bench/autoscale_servegen.py, docs/benchmarks.md).

The full benchmark replays 14 days for 17 deployments (minutes of CPU); here one 8-hour slice of one tenant
(client_142 ramping from ~16 to ~220 req/s and back) with the same profile, cold start and SLO, in fluid mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench_module import load_bench


def _bench() -> Any:
    return load_bench("autoscale_servegen.py", "autoscale_servegen")


@pytest.fixture(scope="module")
def bench() -> Any:
    return _bench()


@pytest.fixture(scope="module")
def slice_result(bench: Any, servegen_path: Path) -> dict[str, Any]:
    s = bench.Settings(
        trace=str(servegen_path),
        kpa_params={"target_concurrency": 32},
        start_s=6 * 3600.0,
        duration_s=8 * 3600.0,
    )
    result: dict[str, Any] = bench.run_case((s, "client_142", ("static", "kpa", "fleetgate")))
    return result


@pytest.mark.timeout(120)
def test_fleetgate_saves_against_static_peak_within_slo(slice_result: dict[str, Any]) -> None:
    runs = slice_result["runs"]
    static, fleet = runs["static"], runs["fleetgate"]
    assert static["slo_attainment"] >= 0.99
    assert fleet["slo_attainment"] >= 0.99
    # Static peak pays for the peak all day; fleetgate follows the ramp (measured 2026-11-30: -47 %).
    assert fleet["replica_hours"] <= 0.75 * static["replica_hours"]
    assert fleet["rejected"] == 0


@pytest.mark.timeout(120)
def test_fleetgate_meets_slo_at_least_as_well_as_kpa(slice_result: dict[str, Any]) -> None:
    runs = slice_result["runs"]
    assert runs["fleetgate"]["slo_attainment"] >= runs["kpa"]["slo_attainment"]
    # Both autoscalers start warm, sized for the first window, and stay within the simulator's bounds.
    assert 1 <= runs["fleetgate"]["peak_replicas"] <= 1024
    assert 1 <= runs["kpa"]["peak_replicas"] <= 1024


def test_markdown_table_has_totals_and_pooled_slo(bench: Any) -> None:
    def case(name: str, rh: tuple[float, float, float], slo: tuple[float, float, float]) -> dict[str, Any]:
        return {
            "case": name,
            "requests": 1e6,
            "peak_mu_per_min": 300.0,
            "mean_mu_per_min": 100.0,
            "active_minutes": 100,
            "runs": {
                n: {"replica_hours": r, "slo_attainment": a}
                for n, r, a in zip(("static", "kpa", "fleetgate"), rh, slo, strict=True)
            },
        }

    results = [
        case(bench.WHOLE, (100.0, 60.0, 50.0), (1.0, 0.98, 0.995)),
        case("t1", (10.0, 5.0, 2.0), (1.0, 0.97, 0.99)),
        case("t2", (30.0, 9.0, 4.0), (1.0, 0.99, 1.0)),
    ]
    md = bench.markdown(results, ["static", "kpa", "fleetgate"], ["fleetgate"])
    lines = md.splitlines()
    assert lines[0].startswith("| deployment | requests | peak/mean | static rh | static slo |")
    total = next(line for line in lines if "total, 2 tenants" in line)
    assert "| 40 |" in total and "| 6 |" in total and "-85.0%" in total  # 6 / 40 - 1
    pooled = next(line for line in lines if "pooled" in line)
    assert "0.9950" in pooled  # (0.99 * 100 + 1.0 * 100) / 200
    assert len({line.count("|") for line in lines}) == 1  # every row has every column
