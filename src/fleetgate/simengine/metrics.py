"""Prometheus metrics of the simulated engine under vLLM's real metric names (``vllm:...``).

Names, label sets (``engine``, ``model_name``; ``finished_reason`` on ``vllm:request_success_total``) and the
latency histogram buckets follow vLLM 0.32's own ``/metrics`` (see /work/shared/reference). Gauges and
counters are read from the performance model at scrape time; only the histograms are observed as requests
go. ``fleetgate_sim_*`` series are this simulator's own (cancellations, injected errors, active fault).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetgate.simengine.perfmodel import EngineStats

# vLLM's buckets (vllm/v1/metrics/loggers.py), as seen in the reference capture.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass(slots=True)
class ServerCounters:
    """Counters kept by the HTTP shell (the model keeps the engine's own)."""

    requests_received: int = 0
    probes_received: int = 0  # of those, the gateway's health probes (``X-Fleetgate-Probe``)
    requests_cancelled: int = 0
    errors_injected: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))


class _EngineCollector(Collector):
    def __init__(self, model_name: str, stats: Callable[[], EngineStats], counters: ServerCounters) -> None:
        self._labels = ["engine", "model_name"]
        self._values = ["0", model_name]
        self._stats = stats
        self._counters = counters
        self.fault_kind = "none"

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=self._labels)
        g.add_metric(self._values, value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=self._labels)
        c.add_metric(self._values, value)
        return c

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        k = self._counters
        yield self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", s.num_running
        )
        yield self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting
        )
        yield self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage
        )
        yield self._counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            s.prefix_cache_queries,
        )
        yield self._counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            s.prefix_cache_hits,
        )
        yield self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.preemptions
        )
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens)
        yield self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=["engine", "finished_reason", "model_name"],
        )
        for reason in FINISH_REASONS:
            success.add_metric([self._values[0], reason, self._values[1]], k.finished.get(reason, 0))
        yield success
        yield self._counter(
            "fleetgate_sim_requests_received",
            "Completion requests received by the simulated engine (fleetgate).",
            k.requests_received,
        )
        yield self._counter(
            "fleetgate_sim_requests_cancelled",
            "Requests whose client went away before the response completed; the engine dropped them.",
            k.requests_cancelled,
        )
        yield self._counter(
            "fleetgate_sim_errors_injected", "Requests answered with an injected HTTP 500.", k.errors_injected
        )
        fault = GaugeMetricFamily(
            "fleetgate_sim_fault_active", "1 for the fault kind currently injected.", labels=["kind"]
        )
        fault.add_metric([self.fault_kind], 1.0)
        yield fault


class EngineMetrics:
    """A private registry (no globals): the model-backed collector plus TTFT and end-to-end histograms."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats], counters: ServerCounters) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = _EngineCollector(model_name, stats, counters)
        self.registry.register(self.collector)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            ["engine", "model_name"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        ).labels("0", model_name)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            ["engine", "model_name"],
            buckets=E2E_BUCKETS,
            registry=self.registry,
        ).labels("0", model_name)

    def render(self) -> bytes:
        """Prometheus text exposition format."""
        return generate_latest(self.registry)
