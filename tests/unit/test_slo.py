"""SLO window math, bounded Prometheus labels, the status document and the JSON log formatter."""

from __future__ import annotations

import io
import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from fleetgate.config import DeploymentConfig, ReplicaConfig
from fleetgate.core.types import HealthState
from fleetgate.gateway.fleet import Fleet, build_deployment
from fleetgate.ops.logging import REQUEST_ID, JsonFormatter, setup_logging
from fleetgate.ops.metrics import SloCollector
from fleetgate.ops.slo import (
    Outcome,
    RequestSample,
    SloTracker,
    classify,
    quantile,
    summarise,
    top_tenants,
)
from fleetgate.ops.status import TenantInfo, autoscaler_rows, build_status


def sample(t: float, tenant: str = "a", outcome: Outcome = Outcome.OK, **kw: Any) -> RequestSample:
    base: dict[str, Any] = {
        "deployment": "m",
        "replica": "r0",
        "e2e_s": 1.0,
        "ttft_s": 0.1,
        "output_tokens": 10,
        "mu": 1.0,
    }
    base.update(kw)
    return RequestSample(t=t, tenant=tenant, outcome=outcome, **base)


@pytest.mark.parametrize(
    ("status", "dispatched", "kind", "expected"),
    [
        (200, True, None, Outcome.OK),
        (200, True, "upstream_error", Outcome.ERROR),  # a stream that broke after the first byte
        (429, False, "rate_limit_exceeded", Outcome.REJECTED),
        (503, False, "server_error", Outcome.REJECTED),  # shed by admission before any replica
        (503, True, "upstream_error", Outcome.ERROR),  # every replica failed
        (502, True, "upstream_error", Outcome.ERROR),
        (400, False, "invalid_request_error", Outcome.CLIENT_ERROR),
        (499, True, "client_disconnect", Outcome.CANCELLED),
    ],
)
def test_classify(status: int, dispatched: bool, kind: str | None, expected: Outcome) -> None:
    assert classify(status, dispatched=dispatched, error_kind=kind) is expected


def test_quantile_interpolates() -> None:
    assert quantile([], 0.5) is None
    assert quantile([3.0], 0.95) == 3.0
    values = [float(i) for i in range(1, 101)]
    assert quantile(values, 0.5) == pytest.approx(50.5)
    assert quantile(values, 0.95) == pytest.approx(95.05)


def test_summary_rates_attainment_and_otps() -> None:
    samples = [sample(float(i), ttft_s=0.1 * (i + 1), e2e_s=0.1 * (i + 1) + 1.0) for i in range(10)]
    samples += [sample(11, outcome=Outcome.ERROR), sample(12, outcome=Outcome.REJECTED, mu=0.0)]
    samples += [sample(13, outcome=Outcome.CLIENT_ERROR, mu=0.0), sample(14, outcome=Outcome.CANCELLED)]
    st = summarise(samples, span_s=30.0, ttft_target_s=0.5)
    assert (st.requests, st.ok, st.errors, st.rejected, st.client_errors, st.cancelled) == (
        14,
        10,
        1,
        1,
        1,
        1,
    )
    assert st.error_rate == pytest.approx(1 / 12) and st.rejection_rate == pytest.approx(1 / 12)
    assert st.attainment == pytest.approx(5 / 11)  # 5 of 10 ok within 0.5 s; the error counts as a miss
    assert st.ttft_p50_s == pytest.approx(0.55)
    assert st.otps_p50 == pytest.approx(9.0)  # (10 - 1) tokens over the 1 s after the first token
    assert st.mu == pytest.approx(12.0) and st.mu_per_min == pytest.approx(24.0)
    assert summarise([], span_s=60).attainment is None


def test_non_stream_otps_uses_whole_request() -> None:
    s = sample(0, ttft_s=None, e2e_s=2.0, output_tokens=10)
    assert s.otps == pytest.approx(5.0)
    assert sample(0, outcome=Outcome.ERROR).otps is None


def test_window_slides_and_is_bounded() -> None:
    tracker = SloTracker(window_s=10.0, max_samples=100, started_s=0.0)
    for i in range(20):
        tracker.observe(sample(float(i), tenant="a" if i % 2 else "b"))
    assert len(tracker.samples(19.0)) == 11  # t = 9 .. 19: the window [now - 10, now] is closed
    per = tracker.by_tenant(19.0)
    assert (per["a"].requests, per["b"].requests) == (6, 5)
    assert per["a"].mu_per_min == pytest.approx(6 * 60 / 10)
    assert tracker.samples(100.0) == []
    for _ in range(500):
        tracker.observe(sample(200.0))
    assert len(tracker.samples(200.0)) == 100
    assert tracker.total == 520


def test_span_is_short_right_after_start() -> None:
    tracker = SloTracker(window_s=60.0, started_s=100.0)
    tracker.observe(sample(105.0, mu=2.0))
    assert tracker.span_s(110.0) == 10.0
    assert tracker.by_tenant(110.0)["a"].mu_per_min == pytest.approx(12.0)
    assert tracker.span_s(1000.0) == 60.0


def test_full_ring_shortens_the_span() -> None:
    tracker = SloTracker(window_s=60.0, max_samples=10, started_s=0.0)
    for i in range(20):
        tracker.observe(sample(50.0 + i, mu=1.0))  # t = 50 .. 69; only 60 .. 69 are still held
    assert tracker.span_s(70.0) == pytest.approx(10.0)
    assert tracker.by_tenant(70.0)["a"].mu_per_min == pytest.approx(10 * 60 / 10.0)


def test_tenant_targets() -> None:
    tracker = SloTracker(window_s=60, ttft_target_s=1.0, tenant_ttft_target_s={"fast": 0.05}, started_s=0)
    tracker.observe(sample(1.0, tenant="fast", ttft_s=0.1))
    tracker.observe(sample(1.0, tenant="slow", ttft_s=0.1))
    per = tracker.by_tenant(2.0)
    assert per["fast"].attainment == 0.0 and per["slow"].attainment == 1.0


def test_top_tenants_caps_cardinality() -> None:
    counts = {f"t{i}": i for i in range(100)}
    label = top_tenants(counts, {"gold": 500.0, "silver": 100.0, "free": 0.0}, limit=3)
    names = {label(n) for n in [*counts, "gold", "silver", "free"]}
    assert names == {"gold", "silver", "t99", "other"}


def test_collector_bounded_labels() -> None:
    tracker = SloTracker(window_s=60, started_s=0)
    for i in range(50):
        tracker.observe(sample(1.0, tenant=f"tenant-{i}"))
    tracker.observe(sample(1.0, tenant="gold", outcome=Outcome.REJECTED))
    registry = CollectorRegistry()
    reserved = {"gold": {"m": 100.0}, "tenant-7": {"m": 5.0}, "tenant-8": {"m": 5.0}}
    SloCollector(tracker, lambda: 2.0, lambda: reserved, max_tenants=2).register(registry)
    text = generate_latest(registry).decode()
    tenants = {line.split('tenant="')[1].split('"')[0] for line in text.splitlines() if 'tenant="' in line}
    assert tenants == {"gold", "tenant-7", "other"}
    assert 'fleetgate_slo_rejection_ratio{deployment="m",tenant="gold"} 1.0' in text
    assert 'fleetgate_tenant_reserved_mu_per_minute{deployment="m",tenant="other"} 5.0' in text
    assert 'fleetgate_slo_requests{deployment="m",outcome="ok",tenant="other"} 49.0' in text
    assert "fleetgate_slo_window_seconds 60.0" in text


def test_tenant_used_gauge_is_the_ledgers_when_admission_keeps_one() -> None:
    """``fleetgate_tenant_used_mu_per_minute``: the capacity ledger's figure (fleet-wide with Redis) when
    given, under this gateway's labels (unnamed tenants summed as ``other``); else the SLO window's."""
    tracker = SloTracker(window_s=60, started_s=0)
    tracker.observe(sample(1.0, tenant="gold", mu=6.0))
    ledger = {"m": {"gold": 30.0, "seen-elsewhere": 4.0, "also-elsewhere": 1.5}}
    registry = CollectorRegistry()
    SloCollector(
        tracker, lambda: 2.0, lambda: {"gold": {"m": 10.0}}, max_tenants=1, ledger_use=lambda: ledger
    ).register(registry)
    text = generate_latest(registry).decode()
    used = [ln for ln in text.splitlines() if ln.startswith("fleetgate_tenant_used_mu_per_minute{")]
    assert sorted(used) == [
        'fleetgate_tenant_used_mu_per_minute{deployment="m",tenant="gold"} 30.0',
        'fleetgate_tenant_used_mu_per_minute{deployment="m",tenant="other"} 5.5',
    ]
    own = CollectorRegistry()
    SloCollector(tracker, lambda: 2.0, lambda: {}).register(own)  # no ledger: this gateway's window
    own_used = 'fleetgate_tenant_used_mu_per_minute{deployment="m",tenant="gold"} 180.0'  # 6 MU in 2 s
    assert own_used in generate_latest(own).decode()


def test_build_status_from_real_fleet_objects() -> None:
    dep = build_deployment(
        DeploymentConfig(
            model="m",
            capacity_mu_per_min=60,
            replicas=[
                ReplicaConfig(name="r0", url="http://127.0.0.1:1"),
                ReplicaConfig(name="r1", url="http://127.0.0.1:2"),
            ],
        )
    )
    dep.replicas["r1"].health = HealthState.UNHEALTHY
    dep.replicas["r0"].engine_prefix_hit_rate = 0.25
    fleet = Fleet([dep])
    tracker = SloTracker(window_s=60, started_s=0)
    tracker.observe(sample(10.0, tenant="gold", mu=6.0))
    tracker.observe(sample(20.0, tenant="gold", mu=6.0, ttft_s=0.3))
    loop = SimpleNamespace(desired=2, history=[(0.0, 1, 1, 0.5), (1.0, 2, 1, float("inf")), (2.0, 2, 2, 0.9)])
    doc = build_status(
        now=60.0,
        wall_time=1.0e9,
        fleet=fleet,
        tracker=tracker,
        tenants=[TenantInfo("gold", "interactive", {"m": 30.0}), TenantInfo("idle", "batch", {})],
        autoscalers={"m": loop},
    )
    json.dumps(doc, allow_nan=False)  # strictly valid JSON
    r0, r1 = doc["replicas"]
    assert (r0["name"], r0["url"], r0["health"], r1["health"]) == (
        "r0",
        "http://127.0.0.1:1",
        "healthy",
        "unhealthy",
    )
    assert r0["mu_load"] == pytest.approx(12.0 / 60.0) and r0["cache_hit_rate"] == 0.25
    assert r1["mu_load"] == 0.0 and not r1["routable"]
    gold, idle = doc["tenants"]
    assert gold["reserved_mu_per_min"] == 30.0 and gold["used_mu_per_min"] == pytest.approx(12.0)
    assert gold["ttft_p95_s"] == pytest.approx(0.29) and idle["requests"] == 0 and idle["ttft_p95_s"] is None
    assert doc["deployments"][0]["capacity_mu_per_min"] == 60.0  # only routable replicas count
    (auto,) = doc["autoscalers"]
    assert auto["decisions"] == [{"t": -59.0, "from": 1, "to": 2, "ready": 1, "utilisation": None}]
    first = autoscaler_rows({"m": SimpleNamespace(desired=1, history=[(5.0, 1, 2, 0.0)])}, 10.0)
    assert first[0]["decisions"] == [{"t": -5.0, "from": 2, "to": 1, "ready": 2, "utilisation": 0.0}]
    assert [h["desired"] for h in auto["history"]] == [1, 2, 2]


def test_json_logs_carry_request_id_and_redact() -> None:
    stream = io.StringIO()
    handler = setup_logging("INFO", "json", stream)
    try:
        log = logging.getLogger("fleetgate.test")
        token = REQUEST_ID.set("req-42")
        try:
            log.info(
                "hello %s", "world", extra={"tenant": "gold", "messages": "secret prompt", "api_key": "sk-x"}
            )
        finally:
            REQUEST_ID.reset(token)
        log.warning("outside")
    finally:
        logging.getLogger().removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["msg"] == "hello world" and first["request_id"] == "req-42" and first["tenant"] == "gold"
    assert first["messages"] == "[redacted]" and first["api_key"] == "[redacted]"
    assert "request_id" not in second and second["level"] == "warning"
    assert "secret prompt" not in stream.getvalue()


def test_json_formatter_exceptions() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "failed", (), __import__("sys").exc_info()
        )
    out = json.loads(JsonFormatter().format(record))
    assert out["msg"] == "failed" and "ValueError: boom" in out["exc"]


async def test_request_id_reaches_log_lines_inside_a_request() -> None:
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from fleetgate.gateway.errors import error_middleware
    from fleetgate.ops.logging import request_context_middleware

    async def handler(request: web.Request) -> web.Response:
        logging.getLogger("fleetgate.test").warning("inside")
        return web.Response(text="ok")

    app = web.Application(middlewares=[error_middleware])
    app.middlewares.append(request_context_middleware)  # as attach_ops does
    app.router.add_get("/x", handler)
    stream = io.StringIO()
    log_handler = setup_logging("INFO", "json", stream)
    try:
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            given = await client.get("/x", headers={"x-request-id": "abc-123"})
            made = await client.get("/x")
    finally:
        logging.getLogger().removeHandler(log_handler)
    assert given.headers["x-request-id"] == "abc-123"
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if '"inside"' in line]
    assert [rec["request_id"] for rec in lines] == ["abc-123", made.headers["x-request-id"]]


_samples = st.lists(
    st.builds(
        RequestSample,
        t=st.floats(0, 100),
        tenant=st.sampled_from(["a", "b", "c"]),
        deployment=st.sampled_from(["m1", "m2"]),
        replica=st.sampled_from(["r0", "r1"]),
        outcome=st.sampled_from(list(Outcome)),
        e2e_s=st.floats(0.01, 30),
        ttft_s=st.none() | st.floats(0, 5),
        output_tokens=st.none() | st.integers(0, 500),
        mu=st.floats(0, 10),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(_samples, st.integers(5, 80))
def test_tracker_matches_reference_summaries(samples: list[RequestSample], ring: int) -> None:
    """The vectorised ring agrees with the plain ``summarise`` over the samples it still holds."""
    tracker = SloTracker(window_s=50.0, ttft_target_s=1.0, max_samples=ring, started_s=0.0)
    for s in samples:
        tracker.observe(s)
    now = 100.0
    kept = [s for s in samples[-ring:] if now - 50.0 <= s.t <= now]
    start = samples[-ring].t if len(samples) >= ring else 0.0  # a full ring covers less than the window
    span = min(50.0, max(now - start, 1.0))
    for name, key in (("tenant", lambda s: s.tenant), ("deployment", lambda s: s.deployment)):
        groups: dict[str, list[RequestSample]] = {}
        for s in kept:
            groups.setdefault(key(s), []).append(s)
        got = tracker.by_tenant(now) if name == "tenant" else tracker.by_deployment(now)
        assert set(got) == set(groups)
        for g, members in groups.items():
            want = summarise(members, span_s=span, ttft_target_s=1.0)
            have = got[g]
            assert (have.requests, have.ok, have.errors, have.rejected) == (
                want.requests,
                want.ok,
                want.errors,
                want.rejected,
            )
            for field_name in ("ttft_p50_s", "ttft_p95_s", "e2e_p95_s", "otps_p50", "otps_p10", "attainment"):
                a, b = getattr(have, field_name), getattr(want, field_name)
                assert (a is None) == (b is None) and (
                    a is None or a == pytest.approx(b, rel=1e-9, abs=1e-12)
                )
            assert have.mu_per_min == pytest.approx(want.mu_per_min)
    assert len(tracker.samples(now)) == len(kept)
