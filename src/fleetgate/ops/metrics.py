"""SLO gauges for Prometheus, computed from the ``SloTracker`` window at scrape time.

Labels are (tenant, deployment). Deployments come from the config (bounded); tenants are capped at
``max_tenants`` names (reserved tenants first, then the busiest), the rest are reported as ``other``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetgate.ops.slo import Outcome, SloStats, SloTracker, top_tenants

#: tenant -> deployment -> reserved MU/min
Reservations = Callable[[], Mapping[str, Mapping[str, float]]]
#: deployment -> tenant -> MU/min settled over the capacity ledger's window (``None``: no ledger)
LedgerUse = Callable[[], Mapping[str, Mapping[str, float]] | None]


def _no_ledger() -> None:
    return None


class SloCollector(Collector):
    """Window summaries as gauges; register on the gateway's registry (``register``)."""

    def __init__(
        self,
        tracker: SloTracker,
        clock: Callable[[], float],
        reservations: Reservations = dict,
        *,
        max_tenants: int = 20,
        ledger_use: LedgerUse = _no_ledger,
    ) -> None:
        """``ledger_use``: where ``fleetgate_tenant_used_mu_per_minute`` comes from when admission keeps a
        capacity ledger (the same figure as ``/admin/capacity``: fleet-wide with a Redis store); without
        one, the SLO window's settled MU of this gateway."""
        self.tracker = tracker
        self.clock = clock
        self.reservations = reservations
        self.ledger_use = ledger_use
        self.max_tenants = max_tenants

    def register(self, registry: CollectorRegistry) -> SloCollector:
        registry.register(self)
        return self

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        tracker = self.tracker
        reserved = self.reservations()
        snap = tracker.window(now)
        counts = snap.counts_by_tenant()
        label = top_tenants(counts, {t: sum(d.values()) for t, d in reserved.items()}, self.max_tenants)
        stats = snap.by_tenant_deployment(label)
        ledger = self.ledger_use()
        labels = ["tenant", "deployment"]
        window = GaugeMetricFamily(
            "fleetgate_slo_window_seconds", "Length of the sliding window the SLO gauges cover."
        )
        window.add_metric([], tracker.window_s)
        requests = GaugeMetricFamily(
            "fleetgate_slo_requests",
            "Requests finished within the window, by outcome (ok, error, rejected, client_error, cancelled).",
            labels=[*labels, "outcome"],
        )
        ttft = GaugeMetricFamily(
            "fleetgate_slo_ttft_seconds",
            "Time to first token of successful requests within the window (quantile 0.5 and 0.95).",
            labels=[*labels, "quantile"],
        )
        otps = GaugeMetricFamily(
            "fleetgate_slo_output_tokens_per_second",
            "Per-request output tokens/s after the first token within the window (quantile 0.1 and 0.5).",
            labels=[*labels, "quantile"],
        )
        errors = GaugeMetricFamily(
            "fleetgate_slo_error_ratio",
            "Share of requests the fleet failed within the window.",
            labels=labels,
        )
        rejections = GaugeMetricFamily(
            "fleetgate_slo_rejection_ratio",
            "Share of requests admission rejected (429/503) within the window.",
            labels=labels,
        )
        attainment = GaugeMetricFamily(
            "fleetgate_slo_attainment_ratio",
            "Share of served-or-failed requests that succeeded within the tenant's TTFT target.",
            labels=labels,
        )
        target = GaugeMetricFamily(
            "fleetgate_slo_ttft_target_seconds",
            "The TTFT target attainment is measured against.",
            labels=labels,
        )
        used = GaugeMetricFamily(
            "fleetgate_tenant_used_mu_per_minute",
            "Model units settled per minute over the capacity ledger's window (every gateway's with Redis).",
            labels=labels,
        )
        sold = GaugeMetricFamily(
            "fleetgate_tenant_reserved_mu_per_minute",
            "Model units per minute the tenant reserved.",
            labels=labels,
        )
        for (tenant, deployment), st in sorted(stats.items()):
            key = [tenant, deployment]
            for outcome in Outcome:
                requests.add_metric([*key, str(outcome)], _COUNT_FIELD[outcome](st))
            if st.ttft_p50_s is not None and st.ttft_p95_s is not None:
                ttft.add_metric([*key, "0.5"], st.ttft_p50_s)
                ttft.add_metric([*key, "0.95"], st.ttft_p95_s)
            if st.otps_p50 is not None and st.otps_p10 is not None:
                otps.add_metric([*key, "0.1"], st.otps_p10)
                otps.add_metric([*key, "0.5"], st.otps_p50)
            errors.add_metric(key, st.error_rate)
            rejections.add_metric(key, st.rejection_rate)
            if st.attainment is not None:
                attainment.add_metric(key, st.attainment)
            if st.ttft_target_s is not None:
                target.add_metric(key, st.ttft_target_s)
            if ledger is None:
                used.add_metric(key, st.mu_per_min)
        if ledger is not None:  # labels as above; a tenant this gateway does not name is summed as ``other``
            summed: dict[tuple[str, str], float] = {}
            for deployment, per_tenant in ledger.items():
                for tenant, mu in per_tenant.items():
                    k = (label(tenant), deployment)
                    summed[k] = summed.get(k, 0.0) + mu
            for (tenant, deployment), mu in sorted(summed.items()):
                used.add_metric([tenant, deployment], mu)
        other: dict[str, float] = {}
        for tenant, per_dep in sorted(reserved.items()):
            name = label(tenant)
            for deployment, mu in sorted(per_dep.items()):
                if name == "other":
                    other[deployment] = other.get(deployment, 0.0) + mu
                else:
                    sold.add_metric([name, deployment], mu)
        for deployment, mu in sorted(other.items()):
            sold.add_metric(["other", deployment], mu)
        yield from (window, requests, ttft, otps, errors, rejections, attainment, target, used, sold)


_COUNT_FIELD: Mapping[Outcome, Callable[[SloStats], int]] = MappingProxyType(
    {
        Outcome.OK: lambda st: st.ok,
        Outcome.ERROR: lambda st: st.errors,
        Outcome.REJECTED: lambda st: st.rejected,
        Outcome.CLIENT_ERROR: lambda st: st.client_errors,
        Outcome.CANCELLED: lambda st: st.cancelled,
    }
)
