"""Capacity ledger math, per deployment, in MU per minute.

- capacity: what the healthy replicas can serve (sum of their ``capacity_mu_per_min``),
- sold: the sum of tenants' reservations,
- used: settled MU over a sliding window, as a per-minute rate,
- headroom: capacity minus used (free right now); ``unsold`` is capacity minus sold.

Pure: the caller passes ``now`` (seconds, any monotonic origin). ``used_mu`` is recomputed with ``math.fsum``
over the settlements still inside the window, so it equals the sum of those settled costs exactly (no drift
from incremental add/subtract).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetgate.core.types import ReplicaSnapshot


def capacity_of(replicas: Iterable[ReplicaSnapshot]) -> float:
    """MU/min the routable (healthy or suspect, not draining) replicas serve together."""
    return math.fsum(r.capacity_mu_per_min for r in replicas if r.routable)


@dataclass(frozen=True, slots=True)
class Settlement:
    """One settled request: when, who, and its real cost."""

    at_s: float
    tenant: str
    mu: float


@dataclass(frozen=True)
class CapacitySnapshot:
    """The ledger's view of one deployment at one instant (what ``GET /admin/capacity`` shows)."""

    deployment: str
    at_s: float
    window_s: float
    replicas: int
    capacity_mu_per_min: float
    sold_mu_per_min: float
    used_mu_per_min: float
    used_mu: float
    settled_requests: int
    used_by_tenant_mu_per_min: Mapping[str, float] = field(default_factory=dict)
    sold_by_tenant_mu_per_min: Mapping[str, float] = field(default_factory=dict)

    @property
    def headroom_mu_per_min(self) -> float:
        """Capacity not in use right now (negative when over capacity)."""
        return self.capacity_mu_per_min - self.used_mu_per_min

    @property
    def unsold_mu_per_min(self) -> float:
        """Capacity not promised to anyone (negative when oversold)."""
        return self.capacity_mu_per_min - self.sold_mu_per_min

    @property
    def utilisation(self) -> float:
        """used / capacity (``inf`` when there is load but no capacity)."""
        if self.capacity_mu_per_min <= 0:
            return 0.0 if self.used_mu_per_min <= 0 else math.inf
        return self.used_mu_per_min / self.capacity_mu_per_min

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (non-finite numbers become ``None``)."""

        def num(v: float) -> float | None:
            return v if math.isfinite(v) else None

        return {
            "deployment": self.deployment,
            "at_s": self.at_s,
            "window_s": self.window_s,
            "replicas": self.replicas,
            "capacity_mu_per_min": self.capacity_mu_per_min,
            "sold_mu_per_min": self.sold_mu_per_min,
            "used_mu_per_min": self.used_mu_per_min,
            "used_mu": self.used_mu,
            "headroom_mu_per_min": self.headroom_mu_per_min,
            "unsold_mu_per_min": self.unsold_mu_per_min,
            "utilisation": num(self.utilisation),
            "settled_requests": self.settled_requests,
            "used_by_tenant_mu_per_min": dict(self.used_by_tenant_mu_per_min),
            "sold_by_tenant_mu_per_min": dict(self.sold_by_tenant_mu_per_min),
        }


class CapacityLedger:
    """Settled MU of one deployment over a sliding window of ``window_s`` seconds.

    Settlements are kept in arrival order; those at or before ``now - window_s`` fall out. Record times
    should be non-decreasing (a late, older record is still counted until it ages out).
    """

    def __init__(self, deployment: str, window_s: float = 60.0, max_entries: int = 1_000_000) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.deployment = deployment
        self.window_s = float(window_s)
        self.max_entries = max_entries
        self._entries: deque[Settlement] = deque()
        self.total_settled_mu_all_time = 0.0
        self.total_settled_requests = 0

    def record(self, tenant: str, mu: float, now: float) -> None:
        """Add one settled request's real cost (MU) at time ``now``."""
        if not math.isfinite(mu) or mu < 0:
            raise ValueError(f"settled MU must be finite and >= 0, got {mu!r}")
        self._entries.append(Settlement(float(now), tenant, float(mu)))
        self.total_settled_mu_all_time += mu
        self.total_settled_requests += 1
        self._expire(now)  # amortised O(1): the window stays bounded even when nobody reads it
        if len(self._entries) > self.max_entries:
            self._entries.popleft()

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        entries = self._entries
        while entries and entries[0].at_s <= horizon:
            entries.popleft()

    def in_window(self, now: float) -> list[Settlement]:
        """The settlements inside ``(now - window_s, now]``."""
        self._expire(now)
        return [s for s in self._entries if s.at_s <= now]

    def used_mu(self, now: float) -> float:
        """Exact (correctly rounded) sum of the settled MU inside the window."""
        return math.fsum(s.mu for s in self.in_window(now))

    def used_mu_per_min(self, now: float) -> float:
        """Settled MU in the window as a per-minute rate."""
        return self.used_mu(now) * 60.0 / self.window_s

    def used_by_tenant(self, now: float) -> dict[str, float]:
        """Per-tenant settled MU in the window (exact sums)."""
        parts: dict[str, list[float]] = {}
        for s in self.in_window(now):
            parts.setdefault(s.tenant, []).append(s.mu)
        return {t: math.fsum(v) for t, v in parts.items()}

    def snapshot(
        self,
        now: float,
        replicas: Iterable[ReplicaSnapshot],
        reservations: Mapping[str, float] | None = None,
    ) -> CapacitySnapshot:
        """Capacity, sold, used and headroom right now."""
        reps = list(replicas)
        window = self.in_window(now)
        rate = 60.0 / self.window_s
        by_tenant: dict[str, list[float]] = {}
        for s in window:
            by_tenant.setdefault(s.tenant, []).append(s.mu)
        sold = dict(reservations or {})
        used = math.fsum(s.mu for s in window)
        return CapacitySnapshot(
            deployment=self.deployment,
            at_s=now,
            window_s=self.window_s,
            replicas=sum(1 for r in reps if r.routable),
            capacity_mu_per_min=capacity_of(reps),
            sold_mu_per_min=math.fsum(sold.values()),
            used_mu_per_min=used * rate,
            used_mu=used,
            settled_requests=len(window),
            used_by_tenant_mu_per_min={t: math.fsum(v) * rate for t, v in by_tenant.items()},
            sold_by_tenant_mu_per_min=sold,
        )


# -- the fleet-wide ledger's buckets (``AdmissionStore.add_used`` / ``used``; the Redis store's Lua is the
# same arithmetic) ---------------------------------------------------------------------------------------

#: Seconds per bucket of settled MU in the store: a window of 60 s reads 13 buckets.
USED_BUCKET_S = 5.0


def bucket_of(now: float, bucket_s: float = USED_BUCKET_S) -> int:
    """The bucket a settlement at ``now`` (seconds on the store's clock) is added to."""
    return math.floor(now / bucket_s)


def window_buckets(now: float, window_s: float, bucket_s: float = USED_BUCKET_S) -> list[tuple[int, float]]:
    """The buckets that overlap ``(now - window_s, now]``, each with the share of it inside the window: 1
    for all but the oldest, which counts in proportion (settlements taken as spread evenly over it)."""
    start = now - window_s
    out = []
    for b in range(bucket_of(start, bucket_s), bucket_of(now, bucket_s) + 1):
        weight = min(1.0, max(0.0, ((b + 1) * bucket_s - start) / bucket_s))
        if weight > 0:
            out.append((b, weight))
    return out
