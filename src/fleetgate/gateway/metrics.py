"""Gateway Prometheus metrics on a per-app ``CollectorRegistry`` (no process globals).

Counters and histograms are updated on the request path through label children cached per
(deployment, replica), so a request costs a few dict lookups. Gauges of current state (in-flight requests
and MU, engine signals, health) are read from the fleet at scrape time by a custom collector: zero hot-path
cost and never stale.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetgate.gateway.fleet import Fleet

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0,
)  # fmt: skip
RESUME_BUCKETS = (
    0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
ROUTING_BUCKETS = (
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1,
)  # fmt: skip


@dataclass(slots=True)
class ReplicaMetrics:
    """Cached label children for one (deployment, replica)."""

    ttft: Histogram
    e2e: Histogram
    prompt_tokens: Counter
    generation_tokens: Counter


class GatewayMetrics:
    """All gateway metrics; ``registry`` is what /metrics renders."""

    def __init__(self, fleet: Fleet, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        labels = ["deployment", "replica"]
        self.requests = Counter(
            "fleetgate_requests",
            "Requests finished, by deployment, replica, endpoint and HTTP status.",
            [*labels, "endpoint", "status"],
            registry=self.registry,
        )
        self.errors = Counter(
            "fleetgate_request_errors",
            "Errors by kind (upstream_error, timeout, stream_error, client_disconnect, invalid_request ...).",
            [*labels, "kind"],
            registry=self.registry,
        )
        self.usage_anomalies = Counter(
            "fleetgate_usage_anomalies",
            "Engine usage reports cut to what the request could produce before settlement, by kind "
            "(negative, output_over_bound: over max_tokens, the context or what was streamed, "
            "prompt_over_context, parts_over_prompt: cached or image tokens beyond the prompt).",
            [*labels, "kind"],
            registry=self.registry,
        )
        self.retries = Counter(
            "fleetgate_upstream_retries",
            "Attempts that failed before the first byte and were retried on another replica.",
            labels,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "fleetgate_time_to_first_token_seconds",
            "Time from request arrival to the first streamed byte sent to the client.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "fleetgate_e2e_request_latency_seconds",
            "Time from request arrival to the end of the response.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "fleetgate_prompt_tokens", "Prompt tokens reported by engines.", labels, registry=self.registry
        )
        self.generation_tokens = Counter(
            "fleetgate_generation_tokens",
            "Generated tokens reported by engines.",
            labels,
            registry=self.registry,
        )
        self.routing = Histogram(
            "fleetgate_routing_seconds",
            "Time the routing policy took to pick a replica (one observation per attempt).",
            ["deployment"],
            buckets=ROUTING_BUCKETS,
            registry=self.registry,
        )
        self.continuations = Counter(
            "fleetgate_stream_continuations",
            "Broken streams continued on another replica, by the replica that took over, the one that broke "
            "and the outcome (ok / failed).",
            [*labels, "from_replica", "outcome"],
            registry=self.registry,
        )
        self.continuation_resume = Histogram(
            "fleetgate_stream_resume_seconds",
            "Added latency of a continuation: from detecting the broken stream to the first continued event "
            "sent to the client (a stall is detected stream_idle_timeout_s after the last event).",
            ["deployment"],
            buckets=RESUME_BUCKETS,
            registry=self.registry,
        )
        self.interrupted_streams = Counter(
            "fleetgate_interrupted_streams",
            "Streams whose replica broke after the first byte, by outcome: continued (the client saw one "
            "unbroken stream) or error (it got an SSE error event).",
            ["deployment", "outcome"],
            registry=self.registry,
        )
        self.failover_refusals = Counter(
            "fleetgate_stream_continuation_refusals",
            "Broken streams that were not continued (the client got an SSE error), by reason.",
            ["deployment", "reason"],
            registry=self.registry,
        )
        self.failover_overhead = Counter(
            "fleetgate_failover_overhead_mu",
            "Model units the fleet spent on failover beyond what clients were charged (broken attempts, "
            "re-prefill of continued streams).",
            ["deployment"],
            registry=self.registry,
        )
        self.registry.register(_FleetCollector(fleet))
        self._children: dict[tuple[str, str], ReplicaMetrics] = {}
        self._routing: dict[str, Histogram] = {}
        self._requests: dict[tuple[str, str, str, str], Counter] = {}

    def count_request(self, deployment: str, replica: str, endpoint: str, status: int) -> None:
        """``requests`` +1, with the label child cached (this runs once per request)."""
        key = (deployment, replica, endpoint, str(status))
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = self.requests.labels(*key)
        child.inc()

    def routing_child(self, deployment: str) -> Histogram:
        """The ``fleetgate_routing_seconds`` child of ``deployment`` (cached: ``labels()`` is slow)."""
        child = self._routing.get(deployment)
        if child is None:
            child = self._routing[deployment] = self.routing.labels(deployment)
        return child

    def replica(self, deployment: str, replica: str) -> ReplicaMetrics:
        key = (deployment, replica)
        children = self._children.get(key)
        if children is None:
            children = ReplicaMetrics(
                ttft=self.ttft.labels(deployment, replica),
                e2e=self.e2e.labels(deployment, replica),
                prompt_tokens=self.prompt_tokens.labels(deployment, replica),
                generation_tokens=self.generation_tokens.labels(deployment, replica),
            )
            self._children[key] = children
        return children


class _FleetCollector(Collector):
    """Current-state gauges, read from the fleet when /metrics is scraped."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        labels = ["deployment", "replica"]
        inflight = GaugeMetricFamily(
            "fleetgate_inflight_requests", "Requests in flight per replica.", labels=labels
        )
        inflight_mu = GaugeMetricFamily(
            "fleetgate_inflight_mu", "Estimated model units in flight per replica.", labels=labels
        )
        healthy = GaugeMetricFamily(
            "fleetgate_replica_routable", "1 when the replica receives new requests.", labels=labels
        )
        waiting = GaugeMetricFamily(
            "fleetgate_engine_waiting", "Engine-reported waiting requests.", labels=labels
        )
        running = GaugeMetricFamily(
            "fleetgate_engine_running", "Engine-reported running requests.", labels=labels
        )
        kv = GaugeMetricFamily(
            "fleetgate_engine_kv_usage", "Engine-reported KV-cache usage (0..1).", labels=labels
        )
        hits = GaugeMetricFamily(
            "fleetgate_engine_prefix_cache_hit_rate",
            "Engine prefix-cache token hit rate between the last two scrapes (0..1).",
            labels=labels,
        )
        held = GaugeMetricFamily(
            "fleetgate_gate_waiting_requests",
            "Requests held at the gateway by the dispatch gate (every replica busy with prefill).",
            labels=["deployment"],
        )
        held_total = CounterMetricFamily(
            "fleetgate_gate_held",
            "Requests the dispatch gate has held since start (released ones included).",
            labels=["deployment"],
        )
        tail_dropped = CounterMetricFamily(
            "fleetgate_tail_bound_dropped",
            "Candidate replicas the routing policy's tail bound set aside since start (a replica whose "
            "oldest unanswered request was far past its estimated first token), one per pick.",
            labels=["deployment"],
        )
        for dep in self._fleet.deployments.values():
            gate = dep.policy.gate
            if gate is not None:
                held.add_metric([dep.model], len(gate))
                held_total.add_metric([dep.model], gate.held_total)
            tail_dropped.add_metric([dep.model], dep.policy.tail_bound_drops())
        for deployment, replica in self._fleet.replicas():
            key = [deployment.model, replica.name]
            inflight.add_metric(key, replica.inflight_requests)
            inflight_mu.add_metric(key, replica.inflight_mu)
            healthy.add_metric(key, 1.0 if replica.snapshot().routable else 0.0)
            engine = replica.engine
            if engine is not None:
                if engine.waiting is not None:
                    waiting.add_metric(key, engine.waiting)
                if engine.running is not None:
                    running.add_metric(key, engine.running)
                if engine.kv_usage is not None:
                    kv.add_metric(key, engine.kv_usage)
            if replica.engine_prefix_hit_rate is not None:
                hits.add_metric(key, replica.engine_prefix_hit_rate)
        yield from (inflight, inflight_mu, healthy, waiting, running, kv, hits, held, held_total)
        yield tail_dropped
