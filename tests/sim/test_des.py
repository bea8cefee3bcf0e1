"""Discrete-event simulator: plumbing, the same policy objects, determinism, autoscaling with cold starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import FixedLatencyEngine
from typer.testing import CliRunner

from fleetgate.cli import app
from fleetgate.core.autoscale import build_autoscaler
from fleetgate.core.routing.base import PolicyBase
from fleetgate.core.routing.registry import build_policy
from fleetgate.core.units import DEFAULT_PROFILE
from fleetgate.profiles import load_profile
from fleetgate.sim.des import SimConfig, Simulator
from fleetgate.sim.runner import SimOptions, json_dumps, run_des
from fleetgate.sim.traces import Trace, TraceRequest, synthetic_trace


def _trace(n: int = 200, rate: float = 20.0) -> Trace:
    return synthetic_trace(n, rate, seed=5, prefix_groups=4, prefix_blocks=2)


class RecordingPolicy(PolicyBase):
    """Wraps a real policy and records how the simulator calls it (the gateway's call sequence)."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.name = "recording"
        self.calls: list[tuple[str, str, str]] = []

    def pick(self, request, replicas, now, rng, exclude=frozenset()):  # type: ignore[no-untyped-def]
        d = self.inner.pick(request, replicas, now, rng, exclude)  # type: ignore[attr-defined]
        self.calls.append(("pick", request.request_id, d.replica))
        return d

    def on_dispatch(self, request, replica, now):  # type: ignore[no-untyped-def]
        self.calls.append(("dispatch", request.request_id, replica))
        self.inner.on_dispatch(request, replica, now)  # type: ignore[attr-defined]

    def on_complete(self, request, replica, now, cost_mu, ok):  # type: ignore[no-untyped-def]
        assert cost_mu > 0 and ok
        self.calls.append(("complete", request.request_id, replica))
        self.inner.on_complete(request, replica, now, cost_mu, ok)  # type: ignore[attr-defined]


def test_every_request_is_picked_dispatched_and_completed_once() -> None:
    trace = _trace()
    pol = RecordingPolicy(build_policy("round_robin"))
    res = Simulator(
        trace, pol, DEFAULT_PROFILE, lambda n: FixedLatencyEngine(0.2, 0.01), SimConfig(replicas=3)
    ).run()
    s = res.summary
    assert s["requests"] == s["completed"] == 200 and s["rejected"] == 0
    picks = [c for c in pol.calls if c[0] == "pick"]
    assert len(picks) == 200
    assert [c[1] for c in picks] == [f"r{i}" for i in range(200)]  # injected ids, arrival order
    for kind in ("dispatch", "complete"):
        assert sorted(c[1] for c in pol.calls if c[0] == kind) == sorted(c[1] for c in picks)
    # round robin over three replicas: near-equal request counts
    counts = [sum(1 for c in picks if c[2] == f"replica-{i}") for i in range(3)]
    assert max(counts) - min(counts) <= 1
    assert s["ttft_p50_s"] == pytest.approx(0.2)
    assert s["ttft_p99_s"] == pytest.approx(0.2)


def test_snapshots_carry_gateway_inflight_counters() -> None:
    seen: list[tuple[int, float]] = []

    class Spy(PolicyBase):
        name = "spy"

        def pick(self, request, replicas, now, rng, exclude=frozenset()):  # type: ignore[no-untyped-def]
            seen.append((sum(r.inflight_requests for r in replicas), sum(r.inflight_mu for r in replicas)))
            return build_policy("least_requests").pick(request, replicas, now, rng, exclude)

        def on_dispatch(self, request, replica, now):  # type: ignore[no-untyped-def]
            pass

        def on_complete(self, request, replica, now, cost_mu, ok):  # type: ignore[no-untyped-def]
            pass

    reqs = [TraceRequest(0.1 * i, 1000, 100) for i in range(5)]  # each lasts 0.1 + 1.0 s: all overlap
    Simulator(
        Trace("t", reqs, "synthetic"),
        Spy(),
        DEFAULT_PROFILE,
        lambda n: FixedLatencyEngine(0.1, 0.01),
        SimConfig(replicas=2),
    ).run()
    assert [n for n, _ in seen] == [0, 1, 2, 3, 4]
    assert seen[1][1] == pytest.approx(DEFAULT_PROFILE.estimate(1000, None))


def test_same_seed_gives_byte_identical_json_with_real_engine_model() -> None:
    opts = SimOptions(trace="synthetic:n=400,rate=8,cv=1.5,groups=6", policy="random", replicas=4, seed=7)
    a = run_des(opts).summary
    b = run_des(opts).summary
    a.pop("wall_s"), b.pop("wall_s")
    a.pop("requests_per_wall_s"), b.pop("requests_per_wall_s")
    assert json_dumps(a) == json_dumps(b)
    c = run_des(SimOptions(trace=opts.trace, policy="random", replicas=4, seed=8)).summary
    assert c["ttft_mean_s"] != a["ttft_mean_s"]  # the seed matters (random routing)


def test_autoscaler_adds_replicas_after_cold_start() -> None:
    trace = synthetic_trace(3000, 30.0, seed=1)  # ~100 s of load far above one replica
    prof = load_profile("llama2-70b-h100-tp4")
    sim = Simulator(
        trace,
        build_policy("least_requests"),
        prof,
        lambda n: FixedLatencyEngine(0.1, 0.01),
        SimConfig(replicas=1, cold_start_s=30.0, autoscale_interval_s=5.0, max_replicas=8),
        autoscaler=build_autoscaler("fleetgate", {"max_replicas": 8}),
    )
    res = sim.run()
    series = res.replicas_over_time
    assert max(total for _, _, total in series) > 1
    first_up = next(t for t, _, total in series if total > 1)
    first_ready = next(t for t, ready, _ in series if ready > 1)
    assert first_ready == pytest.approx(first_up + 30.0)
    assert res.summary["completed"] == 3000


def test_cli_writes_json_and_report(tmp_path: Path, mooncake_path: Path) -> None:
    out = tmp_path / "s.json"
    rep = tmp_path / "rep"
    r = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            str(mooncake_path),
            "--policy",
            "least_requests",
            "--replicas",
            "4",
            "--max-requests",
            "300",
            "--json",
            str(out),
            "--report",
            str(rep),
            "--no-progress",
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    for key in (
        "requests",
        "completed",
        "rejected",
        "ttft_p50_s",
        "ttft_p95_s",
        "ttft_p99_s",
        "e2e_p95_s",
        "output_tokens_per_s",
        "cache_hit_rate",
        "replica_seconds",
        "max_over_mean_load",
        "wall_s",
    ):
        assert key in data
    assert data["requests"] == 300 and data["completed"] == 300
    assert (rep / "report.md").is_file() and (rep / "ttft_cdf.png").is_file()
    r = CliRunner().invoke(
        app,
        [
            "simulate",
            "compare",
            "--policies",
            "random,round_robin",
            "--trace",
            str(mooncake_path),
            "--replicas",
            "4",
            "--max-requests",
            "200",
            "--no-progress",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "| random |" in r.output and "| round_robin |" in r.output


def test_cli_bad_policy_and_missing_trace_are_clear_errors(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["simulate", "--trace", str(tmp_path / "nope.jsonl"), "--no-progress"])
    assert r.exit_code == 2 and "not found" in r.output
    r = CliRunner().invoke(
        app, ["simulate", "--trace", "synthetic:n=10", "--policy", "bogus", "--no-progress"]
    )
    assert r.exit_code == 2 and "unknown routing policy" in r.output
