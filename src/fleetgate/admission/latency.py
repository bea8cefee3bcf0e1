"""Latency headroom wiring: config -> ``core.admission.headroom`` parameters, and its ``/metrics`` gauges."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetgate.config_latency import ClassLatencyTargets, LatencyHeadroomConfig
from fleetgate.core.admission.headroom import ClassTargets, HeadroomParams, LatencyHeadroom

if TYPE_CHECKING:
    from fleetgate.gateway.admission import Admission
    from fleetgate.gateway.fleet import Fleet


def _targets(cfg: ClassLatencyTargets) -> ClassTargets:
    return ClassTargets(ttft_p95_s=cfg.ttft_p95_s, otps_p10=cfg.otps_p10)


def headroom_params(cfg: LatencyHeadroomConfig) -> HeadroomParams:
    """``admission.latency_headroom`` as the core's parameters."""
    return HeadroomParams(
        enabled=cfg.enabled,
        reserved=_targets(cfg.reserved),
        best_effort=_targets(cfg.best_effort),
        tolerance=cfg.tolerance,
        open_headroom=cfg.open_headroom,
        close_headroom=cfg.close_headroom,
        min_samples=cfg.min_samples,
        active_s=cfg.active_s,
        otps_min_tokens=cfg.otps_min_tokens,
    )


def wire_latency_headroom(
    gate: Admission, fleet: Fleet, registry: CollectorRegistry, clock: Callable[[], float]
) -> None:
    """Admission holds best-effort beyond each deployment's headroom limit (``clock``: the lifecycle's);
    its figures go to ``/metrics``."""
    gate.use_latency_headroom(
        lambda m: fleet.deployments[m].headroom if m in fleet.deployments else None, clock
    )
    registry.register(LatencyCollector(lambda: {m: d.headroom for m, d in fleet.deployments.items()}, clock))


#: (gauge name, help, key in a class row of ``LatencyHeadroom.report``)
_CLASS_GAUGES = (
    ("fleetgate_latency_ttft_p95_seconds", "Observed TTFT p95 over recent requests, by class.", "ttft_p95_s"),
    ("fleetgate_latency_ttft_p95_target_seconds", "TTFT p95 target, by class.", "ttft_p95_s_target"),
    ("fleetgate_latency_otps_p10", "Observed output tokens/s per stream, p10, by class.", "otps_p10"),
    ("fleetgate_latency_otps_p10_target", "OTPS p10 target, by class.", "otps_p10_target"),
    (
        "fleetgate_latency_ttft_headroom",
        "TTFT headroom in tolerances (1: as solo, 0: at the target, < 0: beyond it), by class.",
        "ttft_headroom",
    ),
    ("fleetgate_latency_otps_headroom", "OTPS headroom in tolerances, by class.", "otps_headroom"),
)


class LatencyCollector(Collector):
    """Gauges of every deployment's latency headroom, read at scrape time."""

    def __init__(
        self, headrooms: Callable[[], Mapping[str, LatencyHeadroom]], clock: Callable[[], float]
    ) -> None:
        self._headrooms = headrooms
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        reports = {m: h.report(now) for m, h in sorted(self._headrooms().items())}
        for name, help_text, key in _CLASS_GAUGES:
            g = GaugeMetricFamily(name, help_text, labels=["deployment", "class"])
            for model, rep in reports.items():
                for cls, row in rep["classes"].items():
                    if row.get(key) is not None:
                        g.add_metric([model, cls], float(row[key]))
            yield g
        limit = GaugeMetricFamily(
            "fleetgate_best_effort_limit",
            "Best-effort requests the latency headroom lets be in flight (absent: no limit).",
            labels=["deployment"],
        )
        on = GaugeMetricFamily(
            "fleetgate_best_effort_on_engines",
            "Best-effort requests on the engines now (as the gateway counts them).",
            labels=["deployment"],
        )
        for model, rep in reports.items():
            if rep["best_effort_limit"] is not None:
                limit.add_metric([model], float(rep["best_effort_limit"]))
            on.add_metric([model], float(rep["best_effort_on_engines"]))
        yield limit
        yield on
