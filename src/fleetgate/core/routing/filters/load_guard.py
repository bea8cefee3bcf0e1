"""Load guard: no new request for a replica whose recent MU is well above the fleet's mean.

The signal is each replica's dispatched MU, exponentially decayed (``ReplicaLoads``, time constant
``rate_tau_s``), charged at dispatch with the request's expected cost (its estimate, less the prefill its
expected cache hit saves) and settled to the real cost at completion. A replica whose signal would exceed
``load_bound`` x the mean (the request's own MU included) is dropped, unless it is expected to hold
``guard_exempt_ratio`` of the prompt, in which case it may go up to ``cached_load_bound`` x the mean (moving a
cache hit costs more than a little imbalance, but not without limit); hot keys get no exemption, and a replica
within ``guard_min_util`` of its MU rate of the mean is never dropped. If the guard would drop every
candidate (a huge request) it keeps them all.

With ``guard_exempt_s`` the exemption is in seconds of re-prefill instead of a share of the prompt: a
replica over the bound gets the cached bound when the blocks it holds beyond the deepest candidate under the
bound (where the request can go instead) would take at least ``guard_exempt_s`` seconds to prefill again (at
the rate of the deepest holder over the bound as the TTFT estimate reads it: configured, else its pooled
learned rate, else the MU rate), i.e. when moving the request off it adds that much work. A session is then
moved while its context is small, and kept (up to the cached bound) once its context is large.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pydantic import Field

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.pipeline import PickContext, StageBase
from fleetgate.core.routing.rates import ReplicaLoads
from fleetgate.core.routing.scorers.ttft import TtftEstimate
from fleetgate.core.types import ReplicaSnapshot, RequestInfo

_INF = math.inf


class LoadGuardParams(PluginParams):
    """The load guard's bounds (see ``core.routing.filters.load_guard``)."""

    load_bound: float = Field(default=1.15, ge=1.0, description="Most recent MU a replica may take, x mean.")
    cached_load_bound: float = Field(
        default=1.5,
        description="The bound for a replica expected to hold `guard_exempt_ratio` of the prompt, x mean "
        "(never below `load_bound`).",
    )
    guard_exempt_ratio: float = Field(
        default=0.3, description="Share of the prompt a replica must hold for the cached bound."
    )
    guard_min_util: float = Field(
        default=0.05, ge=0, description="Excess over the mean (share of the replica's MU rate) never guarded."
    )
    guard_exempt_s: float | None = Field(
        default=None,
        ge=0,
        description="Exemption in re-prefill seconds instead of `guard_exempt_ratio` (none: the ratio): a "
        "replica gets the cached bound when the prompt blocks it holds beyond the deepest replica under the "
        "bound would take this many seconds to prefill again (at the learned rate the TTFT estimate uses).",
    )


class LoadGuard(StageBase):
    """The filter plus the load signal's bookkeeping (``charge`` at dispatch, settle at completion)."""

    name = "load_guard"
    uses_prefix_hashes = True

    def __init__(self, params: LoadGuardParams, loads: ReplicaLoads, estimate: TtftEstimate) -> None:
        self.params = params
        self.load_bound = params.load_bound
        self.cached_load_bound = max(params.cached_load_bound, params.load_bound)
        self.guard_exempt_ratio = params.guard_exempt_ratio
        self.guard_min_util = params.guard_min_util
        self.guard_exempt_s = params.guard_exempt_s
        self.loads = loads
        self.estimate = estimate
        self._charged: dict[str, float] = {}
        self.guarded = 0  # picks where the guard would have left nothing
        self.skips = 0  # candidates the guard dropped

    def limits(self, own: float, candidates: int, now: float) -> tuple[float, float, float, float, float]:
        """``(k, mean, limit, cached_limit, slack)``: stored load x ``k`` = MU over the last ``tau``; a
        candidate with load ``v`` is over the bound when ``v > limit`` (``cached_limit`` if exempt) and
        ``v + own - mean > slack * its MU rate``."""
        loads = self.loads
        horizon = loads.tau_s
        k = loads.scale(now) * horizon
        total = loads.total * k
        known = max(candidates, len(loads.reps))  # mean over every replica with recent load
        mean = (total + own) / known
        return (
            k,
            mean,
            self.load_bound * mean - own,
            self.cached_load_bound * mean - own,
            self.guard_min_util * horizon,
        )

    def over_load(
        self, r: ReplicaSnapshot, k: float, mean: float, lim: float, slack: float, own: float
    ) -> float | None:
        """Replica ``r``'s load (MU over the last ``tau``) when it is over the plain bound of ``limits``
        (``lim``, and more than ``slack`` of its MU rate over the mean with this request's ``own`` cost);
        None when it is not."""
        st = self.loads.reps.get(r.name)
        v = 0.0 if st is None else st[0] * k
        cap = r.capacity_mu_per_min / 60.0
        if cap <= 0.0:
            cap = 1e-9
        return v if v > lim and v + own - mean > slack * cap else None

    def exempt_tokens(
        self,
        request: RequestInfo,
        hot: bool,
        depths: Mapping[str, int] | None = None,
        candidates: Sequence[ReplicaSnapshot] = (),
        bounds: tuple[float, float, float, float, float] = (0.0, 0.0, _INF, 0.0, 0.0),
    ) -> float:
        """Cached prompt tokens from which a replica gets the cached bound (none for a hot key). With
        ``guard_exempt_s``: from the depths (``depths``, expected cached blocks) of the ``candidates`` and
        ``bounds`` = ``(k, mean, limit, slack, own)`` of ``limits``, the tokens beyond the deepest candidate
        under the bound (where the request can go) that take ``guard_exempt_s`` to prefill again at the rate
        of the deepest holder over the bound; none when no holder over the bound is deeper."""
        inp = request.input_tokens
        if inp <= 0 or hot:
            return _INF
        if self.guard_exempt_s is None:
            return self.guard_exempt_ratio * inp
        if not depths:
            return _INF
        k, mean, lim, slack, own = bounds
        get = depths.get
        alt = top = 0
        holder: ReplicaSnapshot | None = None
        for r in candidates:
            d = get(r.name, 0)
            if d <= alt and d <= top:
                continue
            if self.over_load(r, k, mean, lim, slack, own) is not None:
                if d > top:
                    top, holder = d, r
            elif d > alt:
                alt = d
        if holder is None or top <= alt:
            return _INF
        bt = request.prefix_block_tokens
        per_token = self.estimate.reprefill_s(request, holder, bt) / bt if bt > 0 else 0.0
        if per_token <= 0.0:
            return _INF
        return alt * bt + self.guard_exempt_s / per_token

    def filter(
        self, request: RequestInfo, candidates: list[ReplicaSnapshot], ctx: PickContext
    ) -> list[ReplicaSnapshot]:
        own = request.cost_mu if request.cost_mu > 0 else self.estimate.prefill_mu(request)
        k, mean, lim, lim_cached, slack = self.limits(own, len(candidates), ctx.now)
        depths, _ = self.estimate.depths(request)
        exempt = self.exempt_tokens(request, False, depths, candidates, (k, mean, lim, slack, own))
        bt = request.prefix_block_tokens
        out = []
        for r in candidates:
            v = self.over_load(r, k, mean, lim, slack, own)
            d = depths.get(r.name, 0) if depths else 0
            if v is not None and (d * bt < exempt or v > lim_cached):
                continue
            out.append(r)
        self.skips += len(candidates) - len(out)
        if not out:
            self.guarded += 1
            return candidates
        return out

    def charge(self, request_id: str, replica: str, cost: float, now: float) -> None:
        """Add a dispatched request's expected cost to the replica's signal."""
        self.loads.add(replica, cost, now)
        if request_id:
            if len(self._charged) > 100_000:  # outcomes that never came back: forget them
                self._charged.clear()
            self._charged[request_id] = cost

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        """Plain-pipeline use: charge the request's own cost estimate."""
        self.charge(request.request_id, replica, request.cost_mu, now)

    def on_complete(self, request: RequestInfo, replica: str, now: float, cost_mu: float, ok: bool) -> None:
        charged = self._charged.pop(request.request_id, None)
        if charged is not None and ok and cost_mu > 0:
            # Settle: the load signal follows what the request really cost, not its estimate.
            self.loads.add(replica, cost_mu - charged, now)
