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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np


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
        rate = _otps(self.outcome, self.e2e_s, self.ttft_s, self.output_tokens)
        return None if math.isnan(rate) else rate


def _otps(outcome: Outcome, e2e_s: float, ttft_s: float | None, output_tokens: int | None) -> float:
    """Decode speed of one request: (n - 1) tokens after the first over the time after it; without a
    first-token time, n over the whole duration. NaN when not a successful request with output."""
    n = output_tokens
    if not n or outcome is not Outcome.OK:
        return math.nan
    span = e2e_s - (ttft_s or 0.0)
    if n > 1 and ttft_s is not None and span > 1e-6:
        return (n - 1) / span
    return n / e2e_s if e2e_s > 1e-6 else math.nan


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


_OUTCOMES = tuple(Outcome)
_OUTCOME_CODE = {o: i for i, o in enumerate(_OUTCOMES)}
_QUANTILES = (("ttft", 0.5), ("ttft", 0.95), ("e2e", 0.95), ("otps", 0.5), ("otps", 0.1))


class _Interner:
    """Names <-> small ints (tenants, deployments, replicas: bounded by the config, not by traffic)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def __call__(self, name: str) -> int:
        found = self.ids.get(name)
        if found is None:
            found = self.ids[name] = len(self.names)
            self.names.append(name)
        return found


@dataclass
class SloTracker:
    """Sliding window of finished requests; summaries by tenant, deployment, replica or (tenant, deployment).

    Samples live in a ring of numpy columns (at most ``max_samples``), so recording is a few array stores
    and a summary over 100k requests is a handful of vectorised passes, with exact quantiles (the same
    linear interpolation as ``quantile``). One per gateway, no globals; time only comes in as arguments.
    Attainment counts each request against its own tenant's target.
    """

    window_s: float = 60.0
    ttft_target_s: float = 2.0
    tenant_ttft_target_s: Mapping[str, float] = field(default_factory=dict)
    max_samples: int = 100_000
    started_s: float | None = None  # when observation began (MU/min over a shorter span right after)
    total: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise ValueError("window_s must be > 0")
        n = self.max_samples
        self._t = np.full(n, -np.inf)
        self._first = np.zeros(n)  # TTFT, or the whole duration when nothing streamed
        self._ttft = np.full(n, np.nan)
        self._e2e = np.zeros(n)
        self._otps = np.full(n, np.nan)
        self._mu = np.zeros(n)
        self._tokens = np.zeros(n)
        self._outcome = np.zeros(n, dtype=np.int8)
        self._tenant = np.zeros(n, dtype=np.int32)
        self._deployment = np.zeros(n, dtype=np.int32)
        self._replica = np.zeros(n, dtype=np.int32)
        self._tenants = _Interner()
        self._deployments = _Interner()
        self._replicas = _Interner()  # "deployment/replica"
        self._next = 0
        self._first_t: float | None = None

    def target_for(self, tenant: str) -> float:
        return self.tenant_ttft_target_s.get(tenant, self.ttft_target_s)

    def observe(self, sample: RequestSample) -> None:
        """Record a finished request (O(1); the oldest sample is overwritten when the ring is full)."""
        self.record(
            sample.t,
            sample.tenant,
            sample.deployment,
            sample.replica,
            sample.outcome,
            sample.e2e_s,
            sample.ttft_s,
            sample.output_tokens,
            sample.mu,
        )

    def record(
        self,
        t: float,
        tenant: str,
        deployment: str,
        replica: str,
        outcome: Outcome,
        e2e_s: float,
        ttft_s: float | None = None,
        output_tokens: int | None = None,
        mu: float = 0.0,
    ) -> None:
        """``observe`` without building a ``RequestSample`` first (the per-request path)."""
        if self._first_t is None:
            self._first_t = t
        i = self._next
        self._next = (i + 1) % self.max_samples
        self._t[i] = t
        if ttft_s is None:
            self._first[i] = e2e_s
            self._ttft[i] = np.nan
        else:
            self._first[i] = ttft_s
            self._ttft[i] = ttft_s
        self._e2e[i] = e2e_s
        self._otps[i] = _otps(outcome, e2e_s, ttft_s, output_tokens)
        self._mu[i] = mu
        self._tokens[i] = output_tokens or 0
        self._outcome[i] = _OUTCOME_CODE[outcome]
        self._tenant[i] = self._tenants(tenant)
        self._deployment[i] = self._deployments(deployment)
        self._replica[i] = self._replicas(f"{deployment}/{replica}")
        self.total += 1

    def span_s(self, now: float) -> float:
        """Seconds the window really covers: shorter than ``window_s`` right after start, and when the ring
        is full and has already dropped requests younger than the window (rates stay honest)."""
        start = self.started_s if self.started_s is not None else self._first_t
        if start is None:
            return self.window_s
        if self.total >= self.max_samples:
            start = max(start, float(self._t[self._next]))  # the oldest sample still held
        return min(self.window_s, max(now - start, 1.0))

    def _live(self, now: float) -> np.ndarray:
        t = self._t
        return np.flatnonzero((t >= now - self.window_s) & (t <= now))

    def samples(self, now: float) -> list[RequestSample]:
        """The window's samples (oldest first), rebuilt as objects: for tests and small exports."""
        idx = self._live(now)
        idx = idx[np.argsort(self._t[idx], kind="stable")]
        tenants, deps, reps = self._tenants.names, self._deployments.names, self._replicas.names
        out = []
        for i in idx:
            dep = deps[self._deployment[i]]
            out.append(
                RequestSample(
                    t=float(self._t[i]),
                    tenant=tenants[self._tenant[i]],
                    deployment=dep,
                    replica=reps[self._replica[i]][len(dep) + 1 :],
                    outcome=_OUTCOMES[self._outcome[i]],
                    e2e_s=float(self._e2e[i]),
                    ttft_s=None if np.isnan(self._ttft[i]) else float(self._ttft[i]),
                    mu=float(self._mu[i]),
                    output_tokens=int(self._tokens[i]) or None,
                )
            )
        return out

    def window(self, now: float) -> SloWindow:
        """A snapshot of the window at ``now``: summarise it by several groupings at the cost of one."""
        return SloWindow(self, now)

    def counts_by_tenant(self, now: float) -> dict[str, int]:
        return self.window(now).counts_by_tenant()

    def by_tenant(self, now: float) -> dict[str, SloStats]:
        return self.window(now).by_tenant()

    def by_deployment(self, now: float) -> dict[str, SloStats]:
        return self.window(now).by_deployment()

    def by_replica(self, now: float) -> dict[str, SloStats]:
        """Keyed ``"deployment/replica"``."""
        return self.window(now).by_replica()

    def by_tenant_deployment(
        self, now: float, tenant_label: Callable[[str], str] = lambda t: t
    ) -> dict[tuple[str, str], SloStats]:
        """Summaries per (tenant label, deployment); ``tenant_label`` folds rare tenants into one label."""
        return self.window(now).by_tenant_deployment(tenant_label)


class SloWindow:
    """The samples of one window, column by column, with the per-sample facts every grouping needs."""

    def __init__(self, tracker: SloTracker, now: float) -> None:
        tr = self.tracker = tracker
        self.span = tracker.span_s(now)
        idx = tr._live(now)
        self.tenant = tr._tenant[idx]
        self.deployment = tr._deployment[idx]
        self.replica = tr._replica[idx]
        self.outcome = tr._outcome[idx]
        self.mu = tr._mu[idx]
        self.tokens = tr._tokens[idx]
        ok = self.outcome == _OUTCOME_CODE[Outcome.OK]
        self.judged = (ok | (self.outcome == _OUTCOME_CODE[Outcome.ERROR])).astype(np.float64)
        first = tr._first[idx]
        targets = np.array([tr.target_for(n) for n in tr._tenants.names] or [0.0])
        self.good = (ok & (first <= targets[self.tenant])).astype(np.float64)
        # for quantiles: successful requests only, each column sorted by value once
        self.sorted_columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name, values in (("ttft", first), ("e2e", tr._e2e[idx]), ("otps", tr._otps[idx])):
            keep = np.flatnonzero(ok & ~np.isnan(values))
            order = keep[np.argsort(values[keep])]  # ties are equal values: any order
            self.sorted_columns[name] = (order, values[order])

    def counts_by_tenant(self) -> dict[str, int]:
        names = self.tracker._tenants.names
        counts = np.bincount(self.tenant, minlength=len(names))
        return {name: int(c) for name, c in zip(names, counts, strict=True) if c}

    def by_tenant(self) -> dict[str, SloStats]:
        tr = self.tracker
        names = tr._tenants.names
        return self._summaries(self.tenant, names, [tr.target_for(n) for n in names])

    def by_deployment(self) -> dict[str, SloStats]:
        names = self.tracker._deployments.names
        return self._summaries(self.deployment, names, [self.tracker.ttft_target_s] * len(names))

    def by_replica(self) -> dict[str, SloStats]:
        names = self.tracker._replicas.names
        return self._summaries(self.replica, names, [self.tracker.ttft_target_s] * len(names))

    def by_tenant_deployment(
        self, tenant_label: Callable[[str], str] = lambda t: t
    ) -> dict[tuple[str, str], SloStats]:
        tr = self.tracker
        labels = _Interner()
        label_of = np.array([labels(tenant_label(n)) for n in tr._tenants.names] or [0], dtype=np.int64)
        deployments = tr._deployments.names
        n_dep = max(len(deployments), 1)
        groups = label_of[self.tenant] * n_dep + self.deployment
        pairs = [(lab, dep) for lab in labels.names for dep in deployments]
        targets: list[float | None] = [tr.target_for(lab) for lab, _ in pairs]
        stats = self._summaries(groups, [str(i) for i in range(len(pairs))], targets)
        return {pairs[int(k)]: v for k, v in stats.items()}

    def _summaries(
        self, groups: np.ndarray, names: list[str], targets: list[float | None]
    ) -> dict[str, SloStats]:
        """One ``SloStats`` per group id present in ``groups`` (aligned with the window's columns)."""
        n_groups = len(names)
        n_out = len(_OUTCOMES)
        counts = np.bincount(groups * n_out + self.outcome, minlength=n_groups * n_out).reshape(
            n_groups, n_out
        )
        mu = np.bincount(groups, weights=self.mu, minlength=n_groups)
        tokens = np.bincount(groups, weights=self.tokens, minlength=n_groups)
        n_good = np.bincount(groups, weights=self.good, minlength=n_groups)
        n_judged = np.bincount(groups, weights=self.judged, minlength=n_groups)
        quantiles: dict[tuple[str, float], list[float | None]] = {}
        for column, (order, values) in self.sorted_columns.items():
            qs = [q for c, q in _QUANTILES if c == column]
            per_q = _group_quantiles(groups[order], values, n_groups, qs)
            for q, per_group in zip(qs, per_q, strict=True):
                quantiles[(column, q)] = per_group
        out: dict[str, SloStats] = {}
        for g in np.flatnonzero(counts.sum(axis=1)):
            c = counts[g]
            out[names[g]] = SloStats(
                requests=int(c.sum()),
                ok=int(c[_OUTCOME_CODE[Outcome.OK]]),
                errors=int(c[_OUTCOME_CODE[Outcome.ERROR]]),
                rejected=int(c[_OUTCOME_CODE[Outcome.REJECTED]]),
                client_errors=int(c[_OUTCOME_CODE[Outcome.CLIENT_ERROR]]),
                cancelled=int(c[_OUTCOME_CODE[Outcome.CANCELLED]]),
                ttft_p50_s=quantiles[("ttft", 0.5)][g],
                ttft_p95_s=quantiles[("ttft", 0.95)][g],
                e2e_p95_s=quantiles[("e2e", 0.95)][g],
                otps_p50=quantiles[("otps", 0.5)][g],
                otps_p10=quantiles[("otps", 0.1)][g],
                mu=float(mu[g]),
                mu_per_min=float(mu[g]) * 60.0 / self.span,
                output_tokens=int(tokens[g]),
                attainment=float(n_good[g] / n_judged[g]) if n_judged[g] else None,
                ttft_target_s=targets[g],
            )
        return out


def _group_quantiles(
    groups: np.ndarray, values: np.ndarray, n_groups: int, qs: list[float]
) -> list[list[float | None]]:
    """Per-group ``quantile(sorted values, q)`` for each q and every group id below ``n_groups`` (None when
    the group is empty). ``values`` are sorted; a stable sort by group keeps them sorted within each group
    (a radix sort when the ids fit 16 bits)."""
    out: list[list[float | None]] = [[None] * n_groups for _ in qs]
    if len(values) == 0:
        return out
    keys = groups.astype(np.int16) if n_groups < 2**15 else groups
    order = np.argsort(keys, kind="stable")
    g_sorted = groups[order]
    v_sorted = values[order]
    ids = np.arange(n_groups, dtype=g_sorted.dtype)
    starts = np.searchsorted(g_sorted, ids, side="left")
    ends = np.searchsorted(g_sorted, ids, side="right")
    for g in np.flatnonzero(ends > starts):
        a, n = int(starts[g]), int(ends[g] - starts[g])
        for k, q in enumerate(qs):
            pos = q * (n - 1)
            lo = math.floor(pos)
            hi = min(lo + 1, n - 1)
            frac = pos - lo
            out[k][g] = float(v_sorted[a + lo] * (1 - frac) + v_sorted[a + hi] * frac)
    return out


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
