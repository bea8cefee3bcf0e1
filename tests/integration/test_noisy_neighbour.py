"""Noisy neighbour, live and CI-sized (~40 s): a best-effort tenant at 10x the fleet's capacity next to a
reserved one, through real simulated engines and a real gateway.

The real target (gold's p95 TTFT within +10% of running alone, >= 99% of its reservation admitted) is
measured by ``bench/noisy_neighbour.py`` with 30-second phases and recorded in docs/benchmarks.md
("Admission: noisy neighbour (live)"). Here the phases are 8 s (~70 gold requests each, so a p95 is the 4th
largest sample) on a shared CI machine, so the TTFT bounds are loose: they catch a broken admission (free
flooding the engines makes gold's TTFT grow by multiples), not a few percent. The admitted share and the
"every request has an explicit outcome" checks are exact.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench_module import load_bench


@pytest.mark.timeout(150)
async def test_reserved_tenant_unaffected_by_best_effort_flood(tmp_path: Path) -> None:
    nn = load_bench("noisy_neighbour.py", "noisy_neighbour_bench")
    params = nn.BenchParams(
        phase_s=8.0,
        warmup_s=2.0,
        max_num_seqs=32,  # shorter free requests at the same MU each (see the benchmark's docstring)
        free_max_tokens=768,
        drain_timeout_s=45.0,
    )
    res = await nn.run_benchmark(params, tmp_path)
    a, b = res["phases"]["A"], res["phases"]["B"]
    summary = nn.report(res)
    print(summary)

    # Nothing lost: every request sent has an HTTP status, no client-side errors.
    assert res["nothing_lost"], summary
    # Gold gets its reservation (it sends at 90% of it): >= 99% admitted, alone and next to free.
    assert a["gold_admitted_share"] >= 0.99, summary
    assert b["gold_admitted_share"] >= 0.99, summary
    # Free is best-effort: it gets some idle capacity (200) and is shed beyond it (503), never 5xx otherwise.
    statuses = b["free_statuses"]
    assert statuses.get("200", 0) > 0 and statuses.get("503", 0) > 0, summary
    assert set(statuses) <= {"200", "503"}, summary
    # Free stays within the fleet meter: 80% of capacity minus gold's use, over the phase plus the longest
    # admission-queue wait (10 s), plus the meter's 2 s burst; x1.5 for gateway backlog on a loaded machine.
    fleet_per_s = res["fleet_capacity_mu_per_min"] / 60.0
    free_mu = statuses["200"] * res["free_cost_mu"]
    free_bound = (
        fleet_per_s * 0.8 * (params.phase_s + 10.0 + 2.0)
        - res["gold_rate_per_s"] * res["gold_cost_mu"] * params.phase_s
    )
    assert free_mu <= 1.5 * free_bound, summary
    # Loose TTFT bounds (the real +10% target is the benchmark's, see the module docstring).
    assert res["ttft_p50_ratio"] <= 1.5, summary
    assert res["ttft_p95_ratio"] <= 2.0, summary
