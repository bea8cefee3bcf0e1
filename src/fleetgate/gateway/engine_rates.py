"""Shell of the online engine-rate learner (``core.engine_rates``): counters in, metrics and warnings out.

The learner itself is a lifecycle observer of its deployment (dispatch, first token, completion). This shell
is the scraper listener: each scrape's work counters and queue gauges (requests waiting and running) go to
the replica's deployment learner, then the learned rates and the profile drift are exported per replica and
a drift alert becomes one warning line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from prometheus_client import CollectorRegistry, Gauge

from fleetgate.core.engine_rates import EngineCounters, EngineRateLearner, LearnedRates
from fleetgate.engines.metrics import EngineSignals

log = logging.getLogger("fleetgate.engine_rates")


class ScrapedReplica(Protocol):
    """What the listener reads of a scrape target (``gateway.fleet.ReplicaState`` fits)."""

    name: str
    deployment: str


def counters_from(signals: EngineSignals | None) -> EngineCounters | None:
    if signals is None:
        return None
    return EngineCounters(
        prefill_tokens=signals.prefill_tokens,
        prefill_seconds=signals.prefill_seconds,
        decode_tokens=signals.decode_tokens,
        decode_seconds=signals.decode_seconds,
    )


class EngineRateMetrics:
    """``fleetgate_engine_prefill_tokens_per_second``, ``fleetgate_engine_decode_seconds_per_token`` and
    ``fleetgate_cost_profile_drift`` per (model, replica); a series appears once there is an estimate."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("model", "replica")
        self.prefill = Gauge(
            "fleetgate_engine_prefill_tokens_per_second",
            "Prompt tokens per second the replica prefills, learned online.",
            labels,
            registry=registry,
        )
        self.decode = Gauge(
            "fleetgate_engine_decode_seconds_per_token",
            "Seconds per output token after the first on the replica, learned online.",
            labels,
            registry=registry,
        )
        self.drift = Gauge(
            "fleetgate_cost_profile_drift",
            "Learned seconds per prefill token over the cost profile's (1 = the profile matches).",
            labels,
            registry=registry,
        )

    def publish(self, model: str, replica: str, rates: LearnedRates) -> None:
        for gauge, value in (
            (self.prefill, rates.prefill_tokens_per_s),
            (self.decode, rates.decode_s_per_token),
            (self.drift, rates.drift),
        ):
            if value is not None:
                gauge.labels(model, replica).set(value)


class EngineRateListener:
    """Scrape listener feeding each deployment's learner (``learner_for(model)``) and publishing its rates."""

    def __init__(
        self,
        learner_for: Callable[[str], EngineRateLearner | None],
        clock: Callable[[], float],
        metrics: EngineRateMetrics | None = None,
    ) -> None:
        self.learner_for = learner_for
        self.clock = clock
        self.metrics = metrics

    def __call__(self, target: ScrapedReplica, signals: EngineSignals | None) -> None:
        learner = self.learner_for(target.deployment)
        if learner is None:
            return
        now = self.clock()
        learner.on_counters(target.name, now, counters_from(signals))
        if signals is None:
            learner.on_engine_load(target.name, now, None, None, False)
        else:
            s = signals
            learner.on_engine_load(target.name, now, s.waiting, s.running, s.waiting_for_slots)
        if self.metrics is not None:
            self.metrics.publish(target.deployment, target.name, learner.rates(target.name))
        for alert in learner.take_alerts():
            log.warning(
                "deployment %s replica %s: the cost profile is off by %+.0f%% on prefill (learned %.0f "
                "prompt tokens/s, the profile implies %.0f): recalibrate it (fleetgate calibrate)",
                target.deployment,
                alert.replica,
                (alert.drift - 1.0) * 100.0,
                alert.learned_tokens_per_s,
                alert.profile_tokens_per_s,
            )
