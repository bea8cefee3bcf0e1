"""The health series of several deployments in one registry: each with a leading ``deployment`` label.

Replica names may repeat across deployments, so the composition root gives every deployment's monitor a view
of one shared set of families with its ``deployment`` label already set.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleetgate.health.monitor import _PROBE_BUCKETS, HealthMetrics, HealthSeriesSet


class DeploymentLabelled:
    """A metric family seen with its ``deployment`` label already set (``labels``/``remove`` as usual)."""

    def __init__(self, family: Any, deployment: str) -> None:
        self._family = family
        self._deployment = deployment

    def labels(self, *values: str, **labels: str) -> Any:
        if values:
            return self._family.labels(self._deployment, *values)
        return self._family.labels(deployment=self._deployment, **labels)

    def remove(self, *values: str) -> None:
        self._family.remove(self._deployment, *values)


class HealthFamilies:
    """The health series (``fleetgate.health.monitor.HealthMetrics``) with a leading ``deployment`` label,
    shared by the monitors of all deployments (replica names may repeat across deployments)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.probe_latency = Histogram(
            "fleetgate_health_probe_latency_seconds",
            "Latency of health probes (a 1-token request), by outcome.",
            ["deployment", "replica", "outcome"],
            buckets=_PROBE_BUCKETS,
            registry=registry,
        )
        self.transitions = Counter(
            "fleetgate_health_transitions_total",
            "Replica health state transitions, by reason kind.",
            ["deployment", "replica", "from_state", "to_state", "reason"],
            registry=registry,
        )
        self.remediations = Counter(
            "fleetgate_health_remediations_total",
            "Remediations (restarts / pod deletions) started, by reason kind and result.",
            ["deployment", "replica", "action", "reason", "result"],
            registry=registry,
        )
        self.state = Gauge(
            "fleetgate_health_state",
            "1 for the replica's current health state, 0 for the others.",
            ["deployment", "replica", "state"],
            registry=registry,
        )

    def for_deployment(self, deployment: str) -> HealthMetrics:
        """A ``HealthMetrics`` writing these series with ``deployment`` set."""
        return HealthMetrics(
            series=HealthSeriesSet(
                probe_latency=DeploymentLabelled(self.probe_latency, deployment),
                transitions=DeploymentLabelled(self.transitions, deployment),
                remediations=DeploymentLabelled(self.remediations, deployment),
                state=DeploymentLabelled(self.state, deployment),
            )
        )
