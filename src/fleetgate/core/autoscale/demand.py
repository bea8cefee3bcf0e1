"""The autoscalers' input: MU demand of one deployment (settled MU over a window plus MU in flight)."""

from __future__ import annotations

import math


class DemandMeter:
    """MU demand of one deployment as the autoscaler reads it: settled MU over a sliding window plus MU in
    flight. The gateway calls :meth:`start` at dispatch and :meth:`finish` at settle (with the real cost);
    times come in as arguments. Settled amounts are kept in one-second buckets, so memory stays bounded."""

    def __init__(self, window_s: float = 60.0) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_s = window_s
        self.inflight_mu = 0.0
        self.inflight_requests = 0
        self._buckets: dict[int, float] = {}

    def start(self, estimate_mu: float) -> None:
        self.inflight_mu += max(0.0, estimate_mu)
        self.inflight_requests += 1

    def finish(self, estimate_mu: float, actual_mu: float, now_s: float) -> None:
        """A request ended: its estimate leaves the in-flight sum, its real cost joins the settled window."""
        self.inflight_mu = max(0.0, self.inflight_mu - max(0.0, estimate_mu))
        self.inflight_requests = max(0, self.inflight_requests - 1)
        if actual_mu > 0:
            key = math.floor(now_s)
            self._buckets[key] = self._buckets.get(key, 0.0) + actual_mu
        self._prune(now_s)

    def _prune(self, now_s: float) -> None:
        oldest = math.floor(now_s - self.window_s)
        for key in [k for k in self._buckets if k <= oldest]:
            del self._buckets[key]

    def settled_mu_per_min(self, now_s: float) -> float:
        """MU settled in the window, scaled to a per-minute rate."""
        self._prune(now_s)
        return sum(self._buckets.values()) * 60.0 / self.window_s
