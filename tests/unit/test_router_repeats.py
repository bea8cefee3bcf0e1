"""bench/router_repeats.py: the interleaved schedule, the medians and paired ratios over repeats, and the
gateway-metrics parsing that ``router_compare.py --repeats/--watch-gateway`` report from."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from router_repeats import (
    cpu_shares,
    cpu_times,
    markdown,
    parse_gateway,
    rate_skew,
    schedule,
    summarize,
)

NAMES = ("fleetgate:fleetgate", "fleetgate:round_robin", "sglang-router:cache_aware", "fleetgate:p2c")


def test_schedule_runs_each_contender_once_per_repeat_in_a_seeded_shuffled_order() -> None:
    blocks = schedule(NAMES, 4, seed=7)
    assert len(blocks) == 16
    orders = [[c for r, c in blocks if r == rep] for rep in range(4)]
    assert all(sorted(o) == sorted(NAMES) for o in orders)
    assert len({tuple(o) for o in orders}) > 1  # the order changes between repeats
    assert schedule(NAMES, 4, seed=7) == blocks
    assert schedule(NAMES, 4, seed=8) != blocks
    assert schedule(NAMES, 1, seed=7) == [(0, c) for c in NAMES]  # one repeat: the order given


def _block(repeat: int, name: str, p95: float, hit: float) -> dict[str, Any]:
    return {"repeat": repeat, "position": 0, "contender": name, "requests": 10, "ok": 10, "errors": 0,
            "prompt_tokens": 100, "prefix_cache_hit_rate": hit, "load_max_over_mean_window": 1.1,
            "ttft_s": {"p50": p95 / 4, "p95": p95, "p99": p95 * 2}}  # fmt: skip


def test_summary_takes_medians_over_repeats_and_pairs_ratios_within_a_repeat() -> None:
    # repeat 1 ran on a slow machine: everything is 3x slower there, the paired ratio is not
    blocks = [
        _block(0, "fleetgate:fleetgate", 1.0, 0.16),
        _block(0, "fleetgate:round_robin", 2.0, 0.08),
        _block(1, "fleetgate:round_robin", 6.0, 0.08),
        _block(1, "fleetgate:fleetgate", 3.3, 0.16),
        _block(2, "fleetgate:fleetgate", 1.2, 0.15),
        _block(2, "fleetgate:round_robin", 2.0, 0.10),
        {"repeat": 2, "position": 6, "contender": "fleetgate:p2c", "failed": "boom"},
    ]
    s = summarize(blocks)
    ours, rr = s["results"]["fleetgate:fleetgate"], s["results"]["fleetgate:round_robin"]
    assert ours["ttft_s"]["p95"] == 1.2 and rr["ttft_s"]["p95"] == 2.0
    assert ours["per_repeat_p95_s"] == [1.0, 3.3, 1.2]
    assert ours["prefix_cache_hit_rate"] == 0.16
    pair = s["paired"]["fleetgate:round_robin"]
    assert pair["p95_ratios"] == pytest.approx([0.5, 0.55, 0.6])
    assert pair["p95_ratio_median"] == pytest.approx(0.55)
    assert pair["hit_ratios"] == pytest.approx([2.0, 2.0, 1.5]) and pair["hit_ratio_median"] == 2.0
    assert "failed" in s["results"]["fleetgate:p2c"]
    assert s["paired"]["fleetgate:p2c"]["p95_ratio_median"] is None
    t = s["targets"]
    assert t["p95_target_met"] and t["hit_target_met"]
    assert t["paired_p95_ratio_vs_worst"] == ["fleetgate:round_robin", pytest.approx(0.55)]
    table = markdown(blocks, s)
    assert "| fleetgate:round_robin | 500 / 2000 / 4000 |" in table
    assert "0.50 0.55 0.60" in table and "boom" in table


def test_parse_gateway_reads_learned_rates_and_requests_per_replica() -> None:
    reg = CollectorRegistry()
    rate = Gauge("fleetgate_engine_prefill_tokens_per_second", "x", ["model", "replica"], registry=reg)
    done = Counter("fleetgate_requests", "x", ["deployment", "replica", "endpoint", "status"], registry=reg)
    inflight = Gauge("fleetgate_inflight_requests", "x", ["deployment", "replica"], registry=reg)
    rate.labels("m", "r0").set(2400.0)
    rate.labels("m", "r1").set(4100.0)
    done.labels("m", "r0", "chat", "200").inc(5)
    done.labels("m", "r0", "chat", "500").inc(1)
    done.labels("m", "r1", "chat", "200").inc(9)
    inflight.labels("m", "r1").set(2)
    got = parse_gateway(generate_latest(reg).decode())
    assert got["prefill_tokens_per_s"] == {"r0": 2400.0, "r1": 4100.0}
    assert got["requests"] == {"r0": 6.0, "r1": 9.0}
    assert got["inflight"] == {"r1": 2.0}


def test_rate_skew_counts_the_requests_that_went_to_the_fastest_learned_replica() -> None:
    def smp(t: float, rates: dict[str, float], done: dict[str, float]) -> dict[str, Any]:
        return {"t_s": t, "prefill_tokens_per_s": rates, "requests": done, "inflight": {}}

    # each interval is judged by the rates at its start: 2-4 not counted (r1 has no rate at 2), 4-6 r0
    # fastest (spread 2) and took 4 of 5, 6-8 r0 (1.5) 1 of 2, 8-10 r1 (2) 3 of 3
    watch = [
        smp(2, {"r0": 4000.0}, {"r0": 2.0, "r1": 1.0}),
        smp(4, {"r0": 4000.0, "r1": 2000.0}, {"r0": 6.0, "r1": 1.0}),
        smp(6, {"r0": 3000.0, "r1": 2000.0}, {"r0": 10.0, "r1": 2.0}),
        smp(8, {"r0": 3000.0, "r1": 6000.0}, {"r0": 11.0, "r1": 3.0}),
        smp(10, {"r0": 3000.0, "r1": 6000.0}, {"r0": 11.0, "r1": 6.0}),
    ]
    row = rate_skew({**_block(0, "fleetgate:fleetgate", 1.0, 0.1), "gateway_watch": watch})
    assert row is not None
    assert row["share_to_fastest_learned"] == pytest.approx(8 / 10)
    assert row["rate_spread_median"] == 2.0
    assert row["requests_per_replica"] == {"r0": 11.0, "r1": 6.0}
    assert row["first_rate_t_s"] == {"r0": 2, "r1": 4}
    assert row["requests_before_all_rates"] == {"r0": 6.0, "r1": 1.0}
    assert rate_skew(_block(0, "fleetgate:fleetgate", 1.0, 0.1)) is None  # not watched


def test_cpu_shares_split_the_machines_cpu_time_between_two_readings() -> None:
    before = [100.0, 50.0, 10.0, 840.0, 0.0, 0.0, 0.0, 0.0]
    after = [160.0, 80.0, 20.0, 940.0, 0.0, 0.0, 0.0, 0.0]  # 200 ticks: 60 user, 30 nice, 10 sys, 100 idle
    got = cpu_shares(before, after)
    assert got is not None
    assert (got["user"], got["nice"], got["system"], got["idle"]) == (0.3, 0.15, 0.05, 0.5)
    assert cpu_shares(before, before) is None
    assert len(cpu_times()) in (0, 8)
