"""Admission metrics on a caller-supplied ``CollectorRegistry`` (no process globals)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class AdmissionMetrics:
    """Decisions, queue waits, store errors and fail-open admissions."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.decisions = Counter(
            "fleetgate_admission_decisions",
            "Admission verdicts by tenant, tier and result (admitted, rate_limited, saturated, queue_full, "
            "deadline, store_unavailable).",
            ["tenant", "tier", "result"],
            registry=self.registry,
        )
        self.admitted_mu = Counter(
            "fleetgate_admission_admitted_mu",
            "Estimated model units admitted, by tenant and tier.",
            ["tenant", "tier"],
            registry=self.registry,
        )
        self.settled_mu = Counter(
            "fleetgate_admission_settled_mu", "Model units settled (real cost), by tenant.", ["tenant"],
            registry=self.registry,
        )  # fmt: skip
        self.wait = Histogram(
            "fleetgate_admission_wait_seconds",
            "Time requests spent waiting for admission, by priority class.",
            ["priority"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.store_errors = Counter(
            "fleetgate_admission_store_errors",
            "Admission store operations that failed (store unreachable), by store kind.",
            ["store"],
            registry=self.registry,
        )
        self.fail_open = Counter(
            "fleetgate_admission_fail_open",
            "Requests admitted without limits because the store was unreachable and fail_open is set.",
            registry=self.registry,
        )

    def watch(self, queue_depth: Callable[[], int], store_available: Callable[[], bool]) -> None:
        """Expose current queue depth and store reachability, read at scrape time."""
        self.registry.register(_StateCollector(queue_depth, store_available))


class _StateCollector(Collector):
    def __init__(self, queue_depth: Callable[[], int], store_available: Callable[[], bool]) -> None:
        self._depth = queue_depth
        self._available = store_available

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily("fleetgate_admission_queue_depth", "Requests waiting for admission now.")
        g.add_metric([], float(self._depth()))
        yield g
        a = GaugeMetricFamily(
            "fleetgate_admission_store_up", "1 when the admission store answered its last operation."
        )
        a.add_metric([], 1.0 if self._available() else 0.0)
        yield a
