"""Shared test configuration: the ``serial`` marker and per-worker isolation for parallel runs.

Integration fixtures that start real processes (simulated engines, gateways) live in
tests/integration/conftest.py; every server binds 127.0.0.1 on a free port.

``scripts/test.sh`` runs the suite in two phases: everything not marked ``serial`` in pytest-xdist workers,
then the ``serial`` tests one at a time with nothing beside them. A test is ``serial`` when its assertion
compares measured wall-clock times (latency ratios, p95s, event-loop stalls in ms, fitted engine rates):
those need a machine whose CPU is not shared with the suite's other workers. The list is here, with the
reason, rather than scattered over the files. Everything else only waits for timers and health verdicts,
which neighbours do not change, and runs in parallel.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

#: Node-id prefixes (relative to tests/) of the tests that run in the serial phase, and why.
SERIAL: dict[str, str] = {
    "integration/test_noisy_neighbour.py": "gold's p95 TTFT ratio with and without a noisy tenant",
    "integration/test_noisy_neighbour_llama.py": "the same p95 ratio on llama.cpp replicas",
    "integration/test_noisy_neighbour_headroom.py": "gold's TTFT and OTPS ratios, headroom on and off",
    "integration/test_calibration.py": "held-out MAPE of a model fitted to measured latencies",
    "integration/test_calibration_terms.py": "cache discount and image cost from measured latencies",
    "integration/test_engine_rates_llama.py": "first-token fit within 25% of the engine's own prefill timing",
    "integration/test_pool_live.py::test_a_reserved_burst_reclaims_a_best_effort_replica_losing_nothing": (
        "B's reserved p95 TTFT after the reclaim within 1.10x of before"
    ),
    "integration/test_health_llama.py::test_crash_is_restarted": (
        "the verdict's reason: 1 s probes of a live llama-server must answer in time (FAST policy)"
    ),
    # a crash and a stall must land inside streams of ~1.5 s: in the parallel phase of two clean-clone runs
    # the streams ended unbroken first (0 continuations of 10, 1 of 2; wall below the healthy run's)
    "integration/test_gateway_failover.py::test_crash_and_stall_mid_stream_are_continued_transparently": (
        "faults must land mid-stream"
    ),
    "integration/test_gateway_failover.py::"
    "test_failover_overhead_in_capacity_ledger_and_tenant_charged_client_usage": "crash lands mid-stream",
    "integration/test_admission_overshoot.py": "the busiest x20-clock minute uses >= 80% of the limit",
    "integration/test_probe_priority.py::test_admission_probe_class_skips_a_full_queue": "admits in < 50 ms",
    "integration/test_redis_store.py::test_fail_closed_then_recovers_without_restart": "fails fast: < 0.1 s",
    "security/test_prompt_dos.py": "a large body parses in < 1 s and /healthz waits < 50 ms meanwhile",
    "fuzz/test_shape_fuzz.py": "/healthz waits < 100 ms while each body shape is parsed",
    "unit/test_tokenize_fast.py::test_history_digest_is_linear": "compares two measured timings",
}

#: Scheduling hint for the parallel phase (whole files go to one worker each, in this order first): the files
#: that took longest in a parallel run (2026-12-02, docs/benchmarks.md "Session 6"), so none of them starts
#: last and leaves the other workers idle at the end. Order only; a missing or renamed file changes nothing.
SLOW_FIRST = (
    "fuzz/test_api_schemathesis.py",
    "chaos/test_chaos.py",
    "integration/test_serve_control.py",
    "integration/test_health_faults.py",
    "sim/test_mooncake_ordering.py",
    "property/test_capacity_allocator.py",
    "integration/test_gateway_failover_llama.py",
    "kubernetes/test_leader_election.py",
    "sim/test_capacity_sim.py",
    "integration/test_gateway_faults.py",
    "kubernetes/test_serve_kubernetes.py",
    "integration/test_ecosystem_clients.py",
    "integration/test_health_llama.py",
    "kubernetes/test_serve_kubernetes_step.py",
    "integration/test_gateway_failover.py",
    "integration/test_pool_live.py",
    "integration/test_autoscale_live.py",
    "netfaults/test_apiserver_partition.py",
    "security/test_auth_isolation.py",
    "property/test_routing_property.py",
    "sim/test_parity.py",
    "kubernetes/test_discovery.py",
    "integration/test_health_soak.py",
    "integration/test_fleet_ledger.py",
    "netfaults/test_redis_partition.py",
    "integration/test_gateway_fixes.py",
    "integration/test_gateway_dispatch_gate.py",
    "integration/test_health_sigstop.py",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "serial: asserts on measured timings; scripts/test.sh runs it after the parallel phase"
    )
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    url = os.environ.get("FLEETGATE_TEST_REDIS_URL")
    # The Redis scripts/test.sh starts is the suite's own: each xdist worker gets its own database (gw0 -> 1,
    # gw1 -> 2 ...; the serial phase keeps 0), so no worker ever sees another's keys. A Redis given by the
    # user (e.g. a shared server and one database of it) is used as given.
    if worker and url and os.environ.get("FLEETGATE_TEST_REDIS_PER_WORKER") == "1":
        base, _, _db = url.rpartition("/")
        os.environ["FLEETGATE_TEST_REDIS_URL"] = f"{base}/{int(worker.removeprefix('gw')) + 1}"


def _relative_nodeid(item: pytest.Item) -> str:
    return str(Path(item.path).resolve().relative_to(TESTS)) + item.nodeid[len(item.nodeid.split("::")[0]) :]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = [p for p in SERIAL if not (TESTS / p.split("::")[0]).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py SERIAL names files that do not exist: {missing}")
    rank: dict[int, int] = {}
    for item in items:
        try:
            rel = _relative_nodeid(item)
        except ValueError:  # a test outside tests/
            continue
        if any(rel == p or rel.startswith((p + "::", p + "[")) for p in SERIAL):
            item.add_marker(pytest.mark.serial)
        file = rel.split("::")[0]
        if file in SLOW_FIRST:
            rank[id(item)] = SLOW_FIRST.index(file)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts its collection alike (xdist checks)
        items.sort(key=lambda item: rank.get(id(item), len(SLOW_FIRST)))
