"""Latency-headroom admission, live and CI-sized (~2 x 45 s): the shipped ``examples/tenants.yaml`` under
``fleetgate serve`` (its own two simulated engines, a local provider), gold (reserved) paced at 4 req/s,
free (best-effort) as 24 concurrent closed-loop clients streaming ``max_tokens: 256`` from another process
(issue 18 item 5's reproduction), through ``bench/noisy_neighbour.py``.

Run twice, side by side: in the default configuration (engine priority on for the simulated engine,
``admission.latency_headroom`` on), and in the old one (both off: best-effort bounded by the MU meters
only). The real target (gold's p95 TTFT within +10 % of solo) is the benchmark's, with 30 s phases
(docs/benchmarks.md, "Session 6: latency-headroom admission"); here the phases are 10 s (~40 gold requests,
the p95 is the 2nd largest sample) on a shared machine, so the bounds have margins: default p50 <= 1.10x
and p95 <= 1.5x; the old configuration is hurt (TTFT p95 >= 1.15x or OTPS p10 <= 0.8x, and a lower OTPS
ratio than the default) so the test shows the gate matters;
free is held (served less) next to gold, and with gold idle it is served as well as without the gate
(>= 0.8x: no starvation).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench_module import load_bench

ROOT = Path(__file__).resolve().parents[2]


def _headline(report: str) -> str:
    return "\n".join(line for line in report.splitlines() if not line.startswith(("slowest", "system")))


@pytest.mark.timeout(300)
async def test_reserved_tenant_keeps_ttft_under_a_concurrent_stream_flood(tmp_path: Path) -> None:
    nn = load_bench("noisy_neighbour.py", "noisy_neighbour_bench_headroom")
    params = nn.BenchParams(
        config=str(ROOT / "examples" / "tenants.yaml"),
        gold_key="sk-gold-demo",
        free_key="sk-free-demo",
        admin_key="sk-admin-demo",
        gold_rate_per_s=4.0,
        gold_max_tokens=32,
        flood_concurrency=24,
        free_max_tokens=256,
        free_stream=True,
        phase_s=10.0,
        warmup_s=3.0,
        gold_idle_phase_s=8.0,
        drain_timeout_s=45.0,
        engine_priority=None,  # the config's default
    )
    runs: dict[str, dict[str, Any]] = {}
    for name, p in (
        ("default", params),
        ("old", replace(params, engine_priority=False, latency_headroom=False)),
    ):
        (tmp_path / name).mkdir()
        runs[name] = await nn.run_benchmark(p, tmp_path / name)
    summary = "\n\n".join(f"[{name}]\n{_headline(nn.report(res))}" for name, res in runs.items())
    print(summary)
    new, old = runs["default"], runs["old"]

    for res in runs.values():
        assert res["nothing_lost"], summary
        assert res["gold_admitted_share_B"] == 1.0, summary  # reserved: never refused by the gate
    # the default keeps gold near solo: the median within 10 %, the p95 (2nd largest of ~40) within 50 %
    # (one host-wide CPU stall on a shared 2-core machine moves it by more than the real +10 % target)
    assert new["ttft_p50_ratio"] <= 1.10, summary
    assert new["ttft_p95_ratio"] <= 1.5, summary
    # the old configuration lets the same flood hurt gold: its TTFT p95 or its stream rate (OTPS p10)
    assert old["ttft_p95_ratio"] >= 1.15 or old["otps_p10_ratio"] <= 0.8, summary
    assert old["otps_p10_ratio"] < new["otps_p10_ratio"], summary
    # free is held while gold is active (served less than without the gate; 503s are allowed) ...
    nb, ob = new["phases"]["B"], old["phases"]["B"]
    # (429: free's own requests_per_minute, 600, paces its queued requests at 0.1 s: a burst of them
    # released together may outwait its deadline on that meter; the tenant's own limit, not the gate)
    assert set(nb["free_statuses"]) <= {"200", "429", "503"}, summary
    assert nb["free_served_per_s"] < ob["free_served_per_s"], summary
    assert nb["free_statuses"].get("200", 0) > 0, summary  # ... but not shut out
    # the ledger (/admin/capacity) shows both signals against learned targets, and the gate's limit
    gate = new["latency_end_of_B"]["fleetgate-sim"]
    assert gate["enabled"] and gate["reserved_active"] and gate["best_effort_limit"] is not None, summary
    reserved = gate["classes"]["reserved"]
    assert reserved["ttft_p95_s_target"] and reserved["otps_p10_target"], summary
    assert old["latency_end_of_B"]["fleetgate-sim"]["best_effort_limit"] is None, summary
    # ... and with gold idle it is served as without the gate (no starvation)
    nc, oc = new["phases"]["C"], old["phases"]["C"]
    assert set(nc["free_statuses"]) <= {"200", "429"} and nc["free_statuses"].get("200", 0) > 0, summary
    assert nc["free_served_per_s"] >= 0.8 * oc["free_served_per_s"], summary
