"""Per-tenant and per-deployment service levels over a sliding window. Pure: time comes in as arguments.

Every finished request becomes one ``RequestSample``; ``SloTracker`` keeps the samples of the last
``window_s`` seconds (bounded by ``max_samples``: under extreme rates the window is the last N requests) and
summarises them on demand, grouped by tenant, deployment, replica or (tenant, deployment). Summaries are
computed when someone looks (the status page, a Prometheus scrape), so the request path only appends.

Outcomes: ``ok`` (a 2xx without an in-band error), ``rejected`` (admission said no: 429, or a 503 before
any replica was tried), ``error`` (the fleet failed the request: 5xx or a broken stream), ``client_error``
(a 4xx other than 429: the caller's fault) and ``cancelled`` (the client left). Error and rejection rates are
over all requests that reached a verdict; SLO attainment is the share of ok-or-error requests that succeeded
with a time to first token within the tenant's target.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Outcome(StrEnum):
    OK = "ok"
    ERROR = "error"
    REJECTED = "rejected"
    CLIENT_ERROR = "client_error"
    CANCELLED = "cancelled"


def classify(status: int, *, dispatched: bool, error_kind: str | None) -> Outcome:
    """The outcome of one request from its HTTP status, whether a replica was tried and its error kind."""
    if status == 499 or error_kind in ("client_disconnect",):
        return Outcome.CANCELLED
    if status == 429 or (status == 503 and not dispatched):
        return Outcome.REJECTED
    if status >= 500:
        return Outcome.ERROR
    if status >= 400:
        return Outcome.CLIENT_ERROR
    if error_kind is not None:  # a 200 stream that ended with an error event
        return Outcome.ERROR
    return Outcome.OK


@dataclass(frozen=True, slots=True)
class RequestSample:
    """One finished request, as the gateway saw it (no prompt text, no keys)."""

    t: float  # finish time (clock seconds)
    tenant: str
    deployment: str
    replica: str
    outcome: Outcome
    e2e_s: float
    ttft_s: float | None = None
    output_tokens: int | None = None
    mu: float = 0.0

    @property
    def otps(self) -> float | None:
        """Output tokens per second of this request after its first token (decode speed)."""
        n = self.output_tokens
        if not n or self.outcome is not Outcome.OK:
            return None
        span = self.e2e_s - (self.ttft_s or 0.0)
        if n > 1 and self.ttft_s is not None and span > 1e-6:
            return (n - 1) / span
        return n / self.e2e_s if self.e2e_s > 1e-6 else None


def quantile(sorted_values: list[float], q: float) -> float | None:
    """Linear-interpolated quantile of an already sorted list (None when empty)."""
    if not sorted_values:
        return None
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac


@dataclass(frozen=True, slots=True)
class SloStats:
    """A summary of the samples of one group over the window."""

    requests: int = 0
    ok: int = 0
    errors: int = 0
    rejected: int = 0
    client_errors: int = 0
    cancelled: int = 0
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    e2e_p95_s: float | None = None
    otps_p50: float | None = None
    otps_p10: float | None = None
    mu: float = 0.0
    mu_per_min: float = 0.0
    output_tokens: int = 0
    attainment: float | None = None
    ttft_target_s: float | None = None

    @property
    def error_rate(self) -> float:
        judged = self.ok + self.errors + self.rejected
        return self.errors / judged if judged else 0.0

    @property
    def rejection_rate(self) -> float:
        judged = self.ok + self.errors + self.rejected
        return self.rejected / judged if judged else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "ok": self.ok,
            "errors": self.errors,
            "rejected": self.rejected,
            "client_errors": self.client_errors,
            "cancelled": self.cancelled,
            "error_rate": self.error_rate,
            "rejection_rate": self.rejection_rate,
            "ttft_p50_s": self.ttft_p50_s,
            "ttft_p95_s": self.ttft_p95_s,
            "e2e_p95_s": self.e2e_p95_s,
            "otps_p50": self.otps_p50,
            "otps_p10": self.otps_p10,
            "used_mu": self.mu,
            "used_mu_per_min": self.mu_per_min,
            "output_tokens": self.output_tokens,
            "slo_attainment": self.attainment,
            "ttft_target_s": self.ttft_target_s,
        }


def summarise(
    samples: Iterable[RequestSample], *, span_s: float, ttft_target_s: float | None = None
) -> SloStats:
    """Summary of ``samples``; ``span_s`` turns MU into MU per minute; attainment needs a target."""
    counts = dict.fromkeys(Outcome, 0)
    ttfts: list[float] = []
    e2es: list[float] = []
    otps: list[float] = []
    mu = 0.0
    tokens = 0
    good = 0
    n = 0
    for s in samples:
        n += 1
        counts[s.outcome] += 1
        mu += s.mu
        if s.output_tokens:
            tokens += s.output_tokens
        if s.outcome is Outcome.OK:
            first = s.ttft_s if s.ttft_s is not None else s.e2e_s
            ttfts.append(first)
            e2es.append(s.e2e_s)
            rate = s.otps
            if rate is not None:
                otps.append(rate)
            if ttft_target_s is not None and first <= ttft_target_s:
                good += 1
    ttfts.sort()
    e2es.sort()
    otps.sort()
    judged = counts[Outcome.OK] + counts[Outcome.ERROR]
    attainment = good / judged if ttft_target_s is not None and judged else None
    return SloStats(
        requests=n,
        ok=counts[Outcome.OK],
        errors=counts[Outcome.ERROR],
        rejected=counts[Outcome.REJECTED],
        client_errors=counts[Outcome.CLIENT_ERROR],
        cancelled=counts[Outcome.CANCELLED],
        ttft_p50_s=quantile(ttfts, 0.5),
        ttft_p95_s=quantile(ttfts, 0.95),
        e2e_p95_s=quantile(e2es, 0.95),
        otps_p50=quantile(otps, 0.5),
        otps_p10=quantile(otps, 0.1),
        mu=mu,
        mu_per_min=mu * 60.0 / span_s if span_s > 0 else 0.0,
        output_tokens=tokens,
        attainment=attainment,
        ttft_target_s=ttft_target_s,
    )


Key = Callable[[RequestSample], str]
BY_TENANT: Key = lambda s: s.tenant  # noqa: E731
BY_DEPLOYMENT: Key = lambda s: s.deployment  # noqa: E731
BY_REPLICA: Key = lambda s: f"{s.deployment}/{s.replica}"  # noqa: E731


@dataclass
class SloTracker:
    """Sliding window of request samples; summaries by any grouping. One per gateway, no globals."""

    window_s: float = 60.0
    ttft_target_s: float = 2.0
    tenant_ttft_target_s: Mapping[str, float] = field(default_factory=dict)
    max_samples: int = 100_000
    started_s: float | None = None  # when observation began (MU/min over a shorter span right after)
    _samples: deque[RequestSample] = field(init=False, repr=False)
    _first_t: float | None = field(default=None, init=False, repr=False)
    total: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise ValueError("window_s must be > 0")
        self._samples = deque(maxlen=self.max_samples)

    def target_for(self, tenant: str) -> float:
        return self.tenant_ttft_target_s.get(tenant, self.ttft_target_s)

    def observe(self, sample: RequestSample) -> None:
        """Record a finished request (O(1); old samples are dropped lazily)."""
        if self._first_t is None:
            self._first_t = sample.t
        self._samples.append(sample)
        self.total += 1

    def prune(self, now: float) -> None:
        cutoff = now - self.window_s
        samples = self._samples
        while samples and samples[0].t < cutoff:
            samples.popleft()

    def span_s(self, now: float) -> float:
        """Seconds the window covers (shorter than ``window_s`` right after start)."""
        start = self.started_s if self.started_s is not None else self._first_t
        if start is None:
            return self.window_s
        return min(self.window_s, max(now - start, 1.0))

    def samples(self, now: float) -> list[RequestSample]:
        self.prune(now)
        return list(self._samples)

    def grouped(self, now: float, key: Key) -> dict[str, list[RequestSample]]:
        out: dict[str, list[RequestSample]] = {}
        for s in self.samples(now):
            out.setdefault(key(s), []).append(s)
        return out

    def by(self, now: float, key: Key, *, tenant_targets: bool = False) -> dict[str, SloStats]:
        """Summaries per group; with ``tenant_targets`` the group names are tenants (their own targets)."""
        span = self.span_s(now)
        out: dict[str, SloStats] = {}
        for name, group in self.grouped(now, key).items():
            target = self.target_for(name) if tenant_targets else self.ttft_target_s
            out[name] = summarise(group, span_s=span, ttft_target_s=target)
        return out

    def by_tenant(self, now: float) -> dict[str, SloStats]:
        return self.by(now, BY_TENANT, tenant_targets=True)

    def by_deployment(self, now: float) -> dict[str, SloStats]:
        return self.by(now, BY_DEPLOYMENT)

    def by_replica(self, now: float) -> dict[str, SloStats]:
        return self.by(now, BY_REPLICA)

    def by_tenant_deployment(
        self, now: float, tenant_label: Callable[[str], str] = lambda t: t
    ) -> dict[tuple[str, str], SloStats]:
        """Summaries per (tenant label, deployment); ``tenant_label`` folds rare tenants into one label."""
        span = self.span_s(now)
        groups: dict[tuple[str, str], list[RequestSample]] = {}
        for s in self.samples(now):
            groups.setdefault((tenant_label(s.tenant), s.deployment), []).append(s)
        return {
            key: summarise(group, span_s=span, ttft_target_s=self.target_for(key[0]))
            for key, group in groups.items()
        }


def top_tenants(
    counts: Mapping[str, int], reserved: Mapping[str, float], limit: int, other: str = "other"
) -> Callable[[str], str]:
    """A label function keeping at most ``limit`` tenant names (the largest reservations first, then the
    busiest in the window); everyone else becomes ``other``. Bounds the cardinality of per-tenant labels."""
    keep: list[str] = []
    for name, mu in sorted(reserved.items(), key=lambda kv: (-kv[1], kv[0])):
        if mu > 0 and len(keep) < limit:
            keep.append(name)
    for name, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(keep) >= limit:
            break
        if name not in keep:
            keep.append(name)
    kept = frozenset(keep)
    return lambda name: name if name in kept else other
