"""The scrape listener of the engine-rate learner: counters in, gauges and one drift warning out."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from fleetgate.core.engine_rates import EngineRateLearner
from fleetgate.core.units import CostProfile
from fleetgate.engines.metrics import EngineSignals
from fleetgate.gateway.engine_rates import EngineRateListener, EngineRateMetrics


@dataclass
class Target:
    name: str = "r0"
    deployment: str = "m"


def test_listener_feeds_counters_publishes_gauges_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    # the profile says 0.03 s per prompt token (33 tokens/s); the engine does 1,000 tokens/s: drift 0.03
    learner = EngineRateLearner(CostProfile(alpha=0.05, beta=0.1), drift_alert_after=1)
    registry = CollectorRegistry()
    now = [0.0]
    listener = EngineRateListener(
        lambda m: learner if m == "m" else None, lambda: now[0], EngineRateMetrics(registry)
    )
    target = Target()
    caplog.set_level(logging.WARNING, logger="fleetgate.engine_rates")
    for k in range(6):
        now[0] = float(k)
        signals = EngineSignals(
            prefill_tokens=1000.0 * k, prefill_seconds=1.0 * k, decode_tokens=50.0 * k, decode_seconds=1.0 * k
        )
        listener(target, signals)
    listener(target, None)  # a failed scrape: the next one starts a new baseline
    listener(Target(deployment="other"), EngineSignals())  # no learner for that model: ignored
    labels = {"model": "m", "replica": "r0"}
    assert registry.get_sample_value("fleetgate_engine_prefill_tokens_per_second", labels) == pytest.approx(
        1000.0
    )
    assert registry.get_sample_value("fleetgate_engine_decode_seconds_per_token", labels) == pytest.approx(
        0.02
    )
    assert registry.get_sample_value("fleetgate_cost_profile_drift", labels) == pytest.approx(0.001 / 0.03)
    warnings = [r for r in caplog.records if "off by" in r.getMessage()]
    assert len(warnings) == 1 and "recalibrate" in warnings[0].getMessage()
