"""The autoscalers' input: MU demand of one deployment (settled MU over a window plus MU in flight), fed by
the request lifecycle (``core.lifecycle.Lifecycle``).

Demand is what was *offered*, not only what admission let through: a request shed for lack of capacity
(best-effort refused or timed out in the queue while the deployment is full) joins the window at its
estimate (:meth:`DemandMeter.refused`). Without it a deployment that sheds could never scale out of
shedding: its admitted work is capped by the replicas it holds, so its demand reads as exactly what it
already has. Refusals by the tenant's own rate limit or quota are not fleet demand and are not counted.
"""

from __future__ import annotations

from collections import deque


class DemandMeter:
    """Settled MU over a sliding window plus MU in flight. ``Lifecycle.start`` calls :meth:`start` when a
    request is admitted and ``Lifecycle.settle``/``release_demand`` call :meth:`finish` (with the real cost,
    0 when it never ran); times come in as arguments.

    The window is exact (every settlement in ``[now - window_s, now]``, a running sum): the simulator's
    autoscaling figures were made with it. Memory: one entry per request settled in the window (pruned at
    every call).
    """

    def __init__(self, window_s: float = 60.0) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_s = window_s
        self.inflight_mu = 0.0
        self.inflight_requests = 0
        self._settled: deque[tuple[float, float]] = deque()
        self._sum = 0.0
        self._per_min = 60.0 / window_s

    # (``start``/``finish`` run once per request: ``max(0.0, x)`` written as ``x if x > 0.0 else 0.0``, the
    # same value for every x, NaN included, and ``_prune`` inlined)

    def start(self, estimate_mu: float) -> None:
        self.inflight_mu += estimate_mu if estimate_mu > 0.0 else 0.0
        self.inflight_requests += 1

    def finish(self, estimate_mu: float, actual_mu: float, now_s: float) -> None:
        """A request ended: its estimate leaves the in-flight sum, its real cost joins the settled window."""
        left = self.inflight_mu - (estimate_mu if estimate_mu > 0.0 else 0.0)
        self.inflight_mu = left if left > 0.0 else 0.0
        n = self.inflight_requests - 1
        self.inflight_requests = n if n > 0 else 0
        settled = self._settled
        if actual_mu > 0:
            settled.append((now_s, actual_mu))
            self._sum += actual_mu
        oldest = now_s - self.window_s
        while settled and settled[0][0] < oldest:
            self._sum -= settled.popleft()[1]

    def refused(self, estimate_mu: float, now_s: float) -> None:
        """A request was refused for lack of capacity (never started): its estimate is offered demand the
        deployment did not serve, counted in the window like a settled request's cost."""
        if estimate_mu > 0.0:
            self._settled.append((now_s, estimate_mu))
            self._sum += estimate_mu
        self._prune(now_s)

    def _prune(self, now_s: float) -> None:
        settled = self._settled
        oldest = now_s - self.window_s
        while settled and settled[0][0] < oldest:
            self._sum -= settled.popleft()[1]

    def settled_mu_per_min(self, now_s: float) -> float:
        """MU settled (and offered but refused for capacity) in the window, scaled to a per-minute rate."""
        self._prune(now_s)
        return max(0.0, self._sum) * self._per_min
