"""``/metrics`` exposition: Prometheus text by default, OpenMetrics when the scraper asks for it.

Why: ``prometheus_client`` adds a ``*_created`` sample (a Unix timestamp) to every counter and histogram
child. In the Prometheus text format those are plain gauges that double the series count and confuse
queries and dashboards; Prometheus itself does not read them there. They are left out of both formats.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics


class _WithoutCreated:
    """A read-only view of a registry whose metrics lack their ``_created`` samples."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            samples = [s for s in metric.samples if not s.name.endswith("_created")]
            if len(samples) != len(metric.samples):
                copy = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                copy.samples = samples
                metric = copy
            yield metric


def render_metrics(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The body and ``Content-Type`` for a scrape with this ``Accept`` header."""
    view = _WithoutCreated(registry)
    if accept and "application/openmetrics-text" in accept:
        return generate_openmetrics(view), OPENMETRICS_CONTENT_TYPE
    return generate_latest(view), CONTENT_TYPE_LATEST
