"""Chaos run: 4 simulated engines and one real llama.cpp replica behind two gateways sharing Redis, under
steady load, while a schedule injects HTTP 500s, slowness, mid-stream stalls, hangs, crashes (of simulated
engines and of the real ``llama-server`` process), a Redis outage and a gateway SIGTERM.

One run serves both tests. The real replica joins the fleet when ``make real-engines`` has built the
llama-server binary and the tiny model (``make test`` builds them); without them the run uses the simulated
engines only and the llama.cpp test is skipped with that reason by hand, and fails under ``make test``
(tests/real_engines.py).

CI variant: 2,000 requests at engine time scale 0.01 (about a minute or two on 2 cores). Long variant:
``FLEETGATE_CHAOS_REQUESTS=10000 FLEETGATE_CHAOS_RATE=40 .venv/bin/pytest -s tests/chaos`` (or ``make
soak``). See docs/reliability.md. A 1,400-request CI variant was tried (2026-12-02) and dropped: in 2 of 3
runs at load 5-8 one request's broken first attempt was found in a gateway's access log (a duplicate by the
ledger's rule). The cause was the gateway's: a request still on the SIGSTOPped llama.cpp replica when gateway
A's shutdown grace ran out was cancelled without an answer (its connection closed; the client retried it on
gateway B); such a request now gets a 503 (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import shutil

import pytest
from chaos_ledger import KEYS, LLAMA, ChaosResult, env_int, run_chaos

from fleetgate.engines.llama import missing_llama_parts
from real_engines import need_llama

pytestmark = [
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed"),
    pytest.mark.timeout(900),
]

LLAMA_MISSING = missing_llama_parts()
CI_REQUESTS = 2000


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> ChaosResult:
    """The whole chaos scenario, run once for the module (the tests below read its ledger)."""
    total = env_int("FLEETGATE_CHAOS_REQUESTS", CI_REQUESTS)
    rate = float(env_int("FLEETGATE_CHAOS_RATE", 30))
    workdir = tmp_path_factory.mktemp("chaos")
    result = asyncio.run(run_chaos(workdir, total=total, rate=rate, llama=not LLAMA_MISSING))
    print("\n" + "\n".join(result.log))
    print(result.report.summary())
    for line in result.report.violations[:20]:  # whole (an assertion message shows them cut short)
        print("   violation:", line)
    print(
        f"wall {result.wall_s:.1f} s, recovered {result.recovered} in {result.recovery_s:.1f} s, "
        f"failovers {result.failovers}, retried resets {result.resets}, "
        f"gateway A exit {result.gateway_a_exit}, llama.cpp replica {result.llama} "
        f"(restarts {result.llama_restarts}, unhealthy verdict after SIGSTOP {result.llama_verdict_s})"
    )
    return result


def test_chaos_no_request_lost_duplicated_or_truncated(chaos: ChaosResult) -> None:
    total = env_int("FLEETGATE_CHAOS_REQUESTS", CI_REQUESTS)
    report = chaos.report
    assert report.total == total
    assert not [line for line in chaos.log if "failed" in line or "not reached" in line], chaos.log
    assert report.lost == 0 and report.hung == 0, report.violations[:20]
    assert report.duplicated_or_mixed == 0, report.violations[:20]
    assert report.truncated == 0, report.violations[:20]
    assert report.violations == []
    assert report.rate_limit_max_window <= report.rate_limit_allowed
    assert report.ok >= total * 0.5, report.summary()  # faults cost some requests, never most of them
    # the fleet healed by itself: every replica healthy again and the surviving gateway ready
    assert chaos.recovered, chaos.health
    assert chaos.gateway_a_exit == 0  # the SIGTERMed gateway drained and exited cleanly
    # no API key in the gateways' logs or metrics, even while failing
    for key in KEYS.values():
        assert key not in chaos.gateway_output
        assert key not in chaos.metrics_text


def test_real_llama_replica_served_and_survived_hang_and_crash(chaos: ChaosResult) -> None:
    """The llama.cpp replica took part: it answered a share of the load with the exact text each request
    must get, its hang was called unhealthy by the gateways' health monitor (which triggered the restart),
    its crash was restarted, and it was healthy again at the end."""
    need_llama()
    assert chaos.llama
    report = chaos.report
    served = report.by_replica.get(LLAMA, {})
    assert served.get("ok", 0) >= report.total * 0.02, report.summary()  # a real share of the load
    assert served.get("lost", 0) == 0 and served.get("hung", 0) == 0, report.violations[:20]
    assert report.replica_violations.get(LLAMA, 0) == 0, [v for v in report.violations][:20]
    assert any(f"{LLAMA} SIGSTOP" in line for line in chaos.log), chaos.log
    assert any(f"{LLAMA} SIGKILL" in line for line in chaos.log), chaos.log
    assert chaos.llama_verdict_s is not None, chaos.log  # the monitor, not a timer, decided the restart
    assert chaos.llama_restarts == 2, chaos.log
    assert chaos.health.get(LLAMA) == "healthy", chaos.health


def test_interrupted_streams_continue_transparently(chaos: ChaosResult) -> None:
    """Streams whose replica crashed, stalled or broke after the first byte were continued on another
    replica (issue 21): at least 99% of them reached the client as one complete stream, and every text,
    spliced or not, is exactly this request's (checked token for token in the ledger above)."""
    report = chaos.report
    assert report.interrupted > 0, report.summary()  # the schedule's crashes and stalls hit streams
    assert report.transparent_share >= 0.99, report.summary()
    assert report.resume_s, report.summary()
