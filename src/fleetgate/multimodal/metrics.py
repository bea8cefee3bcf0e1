"""Prometheus view of the image pipeline, read at scrape time (no cost on the request path)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from fleetgate.multimodal.pipeline import ImagePipeline


class ImagePipelineCollector(Collector):
    """``fleetgate_image_*``: images processed/rejected, worker crashes/timeouts/restarts, pool size and the
    CPU budget it was sized from."""

    def __init__(self, pipeline: ImagePipeline) -> None:
        self.pipeline = pipeline

    def collect(self) -> Iterator[Metric]:
        p = self.pipeline
        yield CounterMetricFamily(
            "fleetgate_images_processed",
            "Images processed into the deployment's format.",
            value=p.images_processed,
        )
        yield CounterMetricFamily(
            "fleetgate_images_rejected", "Images refused with a 400 (bad image, limits, worker failure).",
            value=p.images_rejected,
        )  # fmt: skip
        stats = p.pool.stats if p.pool is not None else None
        events = CounterMetricFamily(
            "fleetgate_image_worker_events",
            "Image worker crashes, task timeouts and restarts.",
            labels=["event"],
        )
        counts = (0, 0, 0) if stats is None else (stats.crashes, stats.timeouts, stats.restarts)
        for name, count in zip(("crashes", "timeouts", "restarts"), counts, strict=True):
            events.add_metric([name], count)
        yield events
        workers = len(p.pool.pids()) if p.pool is not None and p.pool.started else 0
        yield GaugeMetricFamily("fleetgate_image_workers", "Image worker processes running.", value=workers)
        yield GaugeMetricFamily(
            "fleetgate_image_cpu_budget",
            "CPUs the image pool was sized from (cgroup/affinity).",
            value=p.budget.cpus,
        )


def register(pipeline: ImagePipeline, registry: CollectorRegistry) -> None:
    """Add the collector to the gateway's registry (what /metrics renders)."""
    registry.register(ImagePipelineCollector(pipeline))
