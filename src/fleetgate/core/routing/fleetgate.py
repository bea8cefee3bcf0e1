"""fleetgate's default policy: least estimated TTFT in a sticky, bounded-load, self-rebalancing assignment.

Assembled from pipeline parts, each with its own ``Params`` and state:

1. ``filters.routable``: healthy/suspect, not draining, not ejected, not in ``exclude`` (affinity never
   overrides this, so a request is never forced onto a bad replica);
   then, with ``tail_bound_s``, ``filters.tail_bound``: no replica whose oldest unanswered request is far
   past its estimated first token (the estimate is wrong there; on by default, ``tail_bound_s: null`` turns
   it off);
2. ``filters.affinity``: the request's workload key owns a bounded-load subset of replicas (the leader
   candidates), grown with the key's MU rate and rebalanced on schedule;
3. ``scorers.ttft``: the estimated time to first token on every candidate (fluid prefill queue + own prefill
   given the expected cache + sequence-slot wait), plus any extra weighted ``scorers`` (see below);
4. ``filters.load_guard``: no new request for a replica well above the mean recent MU;
5. ``pickers.leader_spill``: the cache holder or the subset's fastest, unless another is much faster.

Before the pick, the **dispatch gate** (``gate``, ``core.routing.gate``) holds requests at the gateway while
every replica has prefill queued (``backlog_s``) and releases them shortest expected prefill first
(``gate_prefill_s``), so the pick happens when a replica can start the request. ``gate: auto`` turns it on
once an engine prefill rate is known: configured (``prefill_tokens_per_s``) or learned online per replica.

Extra ``scorers`` (any registered scorer, with a weight) add ``weight x (1 - score)`` seconds to a
candidate's estimated TTFT before the leader/spill rule, so e.g. ``kv_usage`` can be combined with the
estimate.

**Fast path.** The simulator calls ``pick`` millions of times and it is most of a run's time at 128 replicas,
so ``pick`` evaluates steps 2-5 in one pass over the candidates, reading each part's parameters and state
explicitly (no per-stage lists); the parts' own ``filter``/``score`` methods are the same rules for plain
pipelines. ``bench/sim_speed.py`` measures it. See docs/routing.md for the reasoning, measurements and every
parameter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.base import PolicyBase
from fleetgate.core.routing.filters.affinity import AffinityFilter, AffinityParams
from fleetgate.core.routing.filters.load_guard import LoadGuard, LoadGuardParams
from fleetgate.core.routing.filters.routable import routable
from fleetgate.core.routing.filters.tail_bound import TailBound, TailBoundParams
from fleetgate.core.routing.gate import DispatchGate, GateParams
from fleetgate.core.routing.keys import KeyKind
from fleetgate.core.routing.outlier import OutlierDetector, OutlierParams
from fleetgate.core.routing.parts import ScorerSpec, scorer_list
from fleetgate.core.routing.pickers.leader_spill import LeaderSpillParams, LeaderSpillPicker
from fleetgate.core.routing.pipeline import PickContext, Scorer, no_replica_error
from fleetgate.core.routing.rates import DecayingRates, ReplicaLoads
from fleetgate.core.routing.scorers.ttft import Switch, TtftEstimate, TtftEstimateParams, switch
from fleetgate.core.types import RandomSource, ReplicaSnapshot, RequestInfo, RouteDecision
from fleetgate.core.units import CostProfile

_INF = math.inf
_NAN = math.nan


def _doc(params: type[PluginParams], field: str) -> str:
    """A part's description of one of its parameters (the policy overrides the default, not the meaning)."""
    return params.model_fields[field].description or ""


class FleetgateParams(
    AffinityParams, LoadGuardParams, TtftEstimateParams, LeaderSpillParams, TailBoundParams
):
    """fleetgate's default policy: the parameters of its parts (affinity, load guard, TTFT estimate,
    leader/spill picker, tail bound), the dispatch gate, and the pick's own.

    The policy's defaults differ from its parts' own (session 10, docs/benchmarks.md "Session 10: a better
    default policy"): session-grain keys, a bounded spill of a cache leader, pooled learned rates on one
    scale, the tail bound, and keys that go hot at a quarter of a replica's rate (context keys split a
    hot shared document over its tenants' keys). Each can be set back, e.g. `key: prefix`,
    `tail_bound_s: null`."""

    key: KeyKind = Field(default="context", description=_doc(AffinityParams, "key"))
    hot_share: float = Field(default=0.25, gt=0, description=_doc(AffinityParams, "hot_share"))
    spill_max_wait_s: float | None = Field(
        default=1.0, ge=0, description=_doc(LeaderSpillParams, "spill_max_wait_s")
    )
    guard_exempt_ratio: float = Field(default=0.8, description=_doc(LoadGuardParams, "guard_exempt_ratio"))
    learned_rate_noise: float = Field(
        default=2.0, ge=1.0, description=_doc(TtftEstimateParams, "learned_rate_noise")
    )
    learned_rate_scale: Literal["seconds", "relative"] = Field(
        default="relative", description=_doc(TtftEstimateParams, "learned_rate_scale")
    )
    tail_bound_s: float | None = Field(default=2.0, ge=0, description=_doc(TailBoundParams, "tail_bound_s"))
    tail_bound_keep_share: float | None = Field(
        default=0.5, gt=0, le=1, description=_doc(TailBoundParams, "tail_bound_keep_share")
    )
    outlier: OutlierParams = Field(default_factory=OutlierParams, description="Outlier ejection.")
    rate_tau_s: float = Field(
        default=60.0, gt=0, description="Time constant of the recent-MU rates (per replica and per key)."
    )
    scan_limit: int = Field(
        default=0,
        ge=0,
        description="Large fleets: estimate this many replicas at a random offset plus the key's subset and "
        "the cache holders (0: every replica).",
    )
    scorers: list[ScorerSpec] = Field(
        default_factory=list,
        description="Extra weighted scorers; each adds weight x (1 - score) seconds to the TTFT estimate.",
    )
    gate: Switch = Field(
        default="auto", description="Dispatch gate: `auto` turns it on once an engine prefill rate is known."
    )
    gate_lead_s: float = Field(default=0.05, description="Release when a replica's queue ends within this.")
    gate_aging: float = Field(default=0.25, description="Seconds of priority gained per second held.")
    gate_max_queued: int = Field(default=4096, description="Held requests at most (then route directly).")
    gate_max_wait_s: float = Field(default=10.0, description="A request held this long is released.")

    rate_learning: Literal["alone", "busy"] = Field(
        default="alone",
        description="Which requests the deployment's online engine-rate learner takes its prefill rate "
        "from: `alone`, only those that ran with nothing else in flight on their replica (an overloaded "
        "replica may never learn one); `busy`, also streamed requests on busy replicas, whose prefill time "
        "is their first token less the later of their dispatch and the previous first token there (none "
        "where another request finished in between: it may have waited for a slot or KV memory).",
    )

    _gate_switch = field_validator("gate", mode="before")(switch)
    _short_form = field_validator("scorers", mode="before")(scorer_list)


def _cap(r: ReplicaSnapshot) -> float:
    """MU per second the replica serves."""
    return max(r.capacity_mu_per_min / 60.0, 1e-9)


class FleetgatePolicy(PolicyBase):
    """See the module docstring; parameters are documented in docs/routing.md."""

    name = "fleetgate"
    uses_prefix_hashes = True

    def __init__(
        self,
        params: FleetgateParams,
        profile: CostProfile,
        *,
        outliers: OutlierDetector | None = None,
        scorers: Sequence[tuple[Scorer, float]] = (),
    ) -> None:
        self.params = params
        self.outliers = outliers
        self.learns_rates_busy = params.rate_learning == "busy"
        self.loads = ReplicaLoads(params.rate_tau_s)
        self.key_rates: DecayingRates[int] = DecayingRates(params.rate_tau_s)
        # ``first_token_feedback: auto`` follows the gate: on with it, and with an automatic gate only once a
        # prefill rate is known (configured or learned).
        ftf = params.first_token_feedback
        feedback: bool | None = ftf == "on"
        if ftf == "auto":
            feedback = {"on": True, "off": False}.get(params.gate)
        self.estimate = TtftEstimate(
            TtftEstimateParams.model_validate(
                params.model_dump(include=set(TtftEstimateParams.model_fields))
            ),
            profile,
            self.loads,
            feedback=feedback,
        )
        self.guard = LoadGuard(
            LoadGuardParams.model_validate(params.model_dump(include=set(LoadGuardParams.model_fields))),
            self.loads,
            self.estimate,
        )
        self.affinity = AffinityFilter(
            AffinityParams.model_validate(params.model_dump(include=set(AffinityParams.model_fields))),
            self.loads,
            self.key_rates,
            guard_min_util=params.guard_min_util,
        )
        self.picker = LeaderSpillPicker(
            LeaderSpillParams.model_validate(params.model_dump(include=set(LeaderSpillParams.model_fields)))
        )
        self.scorers = tuple((s, float(w)) for s, w in scorers if w > 0)
        self.tail: TailBound | None = None
        if params.tail_bound_s is not None:
            tp = TailBoundParams.model_validate(params.model_dump(include=set(TailBoundParams.model_fields)))
            self.tail = TailBound(tp, self.loads)
        self._held_depth = self.affinity.uses_held_depth  # (the key kind is fixed: read once, not per pick)
        self.scan_limit = params.scan_limit
        self._gate_mode = params.gate
        gp = GateParams(params.gate_lead_s, params.gate_aging, params.gate_max_queued, params.gate_max_wait_s)
        self.gate: DispatchGate[Any] | None = DispatchGate(gp) if params.gate != "off" else None

    # -- the dispatch gate ---------------------------------------------------------------------------

    @property
    def gate_active(self) -> bool:
        """The gate holds requests: ``gate: on``, or ``auto`` with a configured or learned prefill rate."""
        return self.gate is not None and (self._gate_mode == "on" or self.estimate.rate_known)

    def backlog_s(self, replicas: Sequence[ReplicaSnapshot], now: float) -> float:
        """Seconds until the least-loaded routable replica has drained the prefill queued on it (the fluid
        queue fed at dispatch; 0 for a replica with nothing in flight); ``inf`` when no replica is routable;
        0 while the gate is not active. Drives the gate."""
        est = self.estimate
        # (``gate_active`` written out: the gate asks at every arrival)
        if self.gate is None or (
            self._gate_mode != "on" and est.prefill_tps is None and not est.learned_seen
        ):
            return 0.0
        outliers = self.outliers
        if outliers is not None and outliers.blocking:
            # The detector's ``allows`` can move an expired ejection to half-open: ask as ``routable`` does.
            lst = replicas if isinstance(replicas, list) else list(replicas)
            replicas = routable(lst, now, frozenset(), outliers)
        return est.backlog_s(replicas, now)

    def gate_prefill_s(self, request: RequestInfo) -> float:
        """The request's prefill seconds on the replica expected to hold most of its prompt (the gate's
        shortest-first order)."""
        return self.estimate.gate_prefill_s(request)

    def tail_bound_drops(self) -> int:
        return self.tail.dropped if self.tail is not None else 0

    # -- pick ----------------------------------------------------------------------------------------

    def pick(
        self,
        request: RequestInfo,
        replicas: Sequence[ReplicaSnapshot],
        now: float,
        rng: RandomSource,
        exclude: frozenset[str] = frozenset(),
    ) -> RouteDecision:
        lst = replicas if isinstance(replicas, list) else list(replicas)
        cands = routable(lst, now, exclude, self.outliers)
        if not cands:
            raise no_replica_error(len(lst), request.model)
        aff = self.affinity
        est = self.estimate
        guard = self.guard
        aff.observe(lst, cands, not exclude)
        if self.tail is not None:
            cands = self.tail.keep(cands, now, request, est.depths)
        n = len(cands)
        if n == 1:
            only = cands[0]
            pmu = est.prefill_mu(request)
            # (``learned_rate_scale: relative``: one replica is its own median, so the MU rate applies)
            tps = None if est.relative else est.prefill_tps or only.learned_prefill_tokens_per_s
            est.memo = (request, only.name, pmu, _cap(only), est.prefill_s(request, pmu, _cap(only), tps))
            return RouteDecision(only.name, reason="fleetgate:only")
        depths, deepest = est.depths(request)
        held = max(depths.values()) if depths and self._held_depth else 0
        subset, rank_of = aff.subset(request, cands, held)
        inp = request.input_tokens
        full = est.prefill_mu(request)
        save_per_token = full * (1.0 - est.cache_discount) / inp if inp > 0 else 0.0
        bt = request.prefix_block_tokens

        # The load guard's limits on a "MU over the horizon" scale.
        own = request.cost_mu if request.cost_mu > 0 else full
        k, mean, rel_lim, rel_lim_cached, slack = guard.limits(own, n, now)
        # A hot key (its subset grew beyond the minimum) must spread: no guard exemption for cached
        # replicas and no pull towards cache holders outside its subset.
        hot = aff.is_hot(subset)

        pool = est.pool  # learned rates shrunk toward the deployment's median (over every candidate)
        if pool is not None:
            pool.update(cands)
        # (after the pool's update: the seconds rule reads it)
        exempt_tokens = guard.exempt_tokens(request, hot, depths, cands, (k, mean, rel_lim, slack, own))
        sticky = self.picker.sticky_cache
        skipped = 0
        lim = self.scan_limit
        scanned = bool(lim) and n > lim
        if scanned:
            # Large fleets: score a window of ``scan_limit`` replicas at a seeded random offset plus every
            # replica that matters for this request (its subset and the deepest cache holders);
            # the guard's mean still covers the whole fleet (it comes from the running total).
            start = int(rng.random() * n)
            scan = cands[start : start + lim]
            if start + lim > n:
                scan += cands[: start + lim - n]
            want = set(subset)
            if len(deepest) <= lim:
                want.update(deepest)  # the cache leaders (a root held everywhere: the window samples it)
            if want:
                seen = {r.name for r in scan}
                want.difference_update(seen)
                if want:
                    scan += [r for r in cands if r.name in want]
            cands = scan
        extra = self._extra_seconds(request, cands, now, rng, exclude) if self.scorers else None
        reps_get = self.loads.reps.get
        busy = est.busy  # replicas with at least ``slot_from`` requests in flight (usually none)
        spt = full / inp if inp > 0 else 0.0  # MU per prompt token
        tps = est.prefill_tps
        # Seconds per MU of this request's prefill when the engine's prefill throughput is known (configured;
        # else per replica, the learned rate when the snapshot has one).
        sec_per_mu = 1.0 / (spt * tps) if tps and spt > 0 else 0.0
        per_replica_rate = tps is None
        # ``learned_rate_scale: relative``: seconds per MU are the MU rate's times median / own learned rate.
        rel_ref = (pool.median or 0.0) if est.relative and pool is not None else 0.0
        if per_replica_rate and not est.learned_seen:
            # (asked before the loop, which the load guard leaves early for a replica it drops)
            if pool is not None and not scanned:
                est.learned_seen = pool.median is not None  # (the median of the same candidates' rates)
            else:
                for r in cands:
                    if r.learned_prefill_tokens_per_s:
                        est.learned_seen = True
                        break
        engine_q = est.engine_queue
        kv_full = est.engine_queue_kv
        depth_of = (depths or {}).get
        # Only these can be the cache leader or the subset's fastest (one set test for every other replica).
        marked = (depths or {}).keys() | rank_of.keys()
        # Without a configured prefill rate or extra scorers, with each replica's own learned rate or pooled
        # ones on the relative scale (the session-10 defaults), the engine queue trusted: a loop without
        # those branches; the general loop below is the same rule (tests/unit/test_routing_fleetgate.py
        # holds them to the same decisions). On the relative scale a replica's seconds per MU depend only
        # on its own learned rate and MU rate while the pool's median holds, so they come from the pool's
        # table (``rel_pool``; none when no candidate has a learned rate: all 0 then, as the plain rule).
        plain = per_replica_rate and extra is None and engine_q and spt > 0 and (pool is None or est.relative)
        rel_pool = pool if plain and rel_ref else None
        rel_table: dict[float | None, float] = {}
        rel_get = rel_table.get  # (the table for the MU rate at hand, set with it)
        while True:  # a second pass without the guard only if the guard left nothing (a huge request)
            best: ReplicaSnapshot | None = None
            deep: ReplicaSnapshot | None = None
            sub: ReplicaSnapshot | None = None
            best_t = deep_t = sub_t = _INF
            best_v = sub_v = _INF
            best_w = 0.0
            deep_d = 0
            sub_rank = 1 << 30
            if plain:
                # Per distinct MU rate (a fleet usually has one), not per replica: the rate, the request's
                # own prefill seconds without a cache hit, and the estimate with nothing queued.
                last_c = _NAN
                cap = full_s = idle_t = 0.0
                for r in cands:
                    name = r.name
                    c = r.capacity_mu_per_min
                    if c != last_c:
                        last_c = c
                        cap = c / 60.0
                        if cap <= 0.0:
                            cap = 1e-9
                        full_s = full / cap
                        idle_t = 0.0 + full_s
                        if rel_pool is not None:
                            rel_get = rel_pool.per_mu_table(cap).get
                    st = reps_get(name)
                    v = 0.0 if st is None else st[0] * k
                    if name in marked:
                        d = depth_of(name, 0)
                        m = True
                    else:
                        d = 0
                        m = False
                    if (
                        v > rel_lim
                        and v + own - mean > slack * cap
                        and (d * bt < exempt_tokens or v > rel_lim_cached)
                    ):
                        skipped += 1
                        continue
                    lt = r.learned_prefill_tokens_per_s
                    if rel_pool is None:
                        sec_per_mu = 1.0 / (spt * lt) if lt else 0.0
                    else:
                        got = rel_get(lt)
                        sec_per_mu = rel_pool.relative_per_mu(lt, cap) if got is None else got
                    wait = 0.0
                    if st is not None:
                        f = st[1]
                        if f > now:
                            wait = f - now
                    w = r.engine_waiting
                    if w and r.inflight_requests > 0 and (r.engine_kv_usage or 0.0) >= kv_full:
                        ww = w * r.inflight_mu / r.inflight_requests * (sec_per_mu or 1.0 / cap)
                        if ww > wait:
                            wait = ww
                    if d:
                        cached = d * bt
                        pre = full - save_per_token * (cached if cached < inp else inp)
                        t = wait + (pre * sec_per_mu if sec_per_mu else pre / cap)
                    elif sec_per_mu:
                        t = wait + full * sec_per_mu
                    elif wait:
                        t = wait + full_s
                    else:
                        t = idle_t
                    if busy and name in busy:
                        t += busy[name]
                    if t < best_t or (t == best_t and v < best_v):
                        best, best_t, best_v, best_w = r, t, v, wait
                    if not m:
                        continue
                    if (
                        d
                        and sticky
                        and (d > deep_d or (d == deep_d and t < deep_t))
                        and (not hot or name in rank_of)
                    ):
                        deep, deep_d, deep_t = r, d, t
                    if name in rank_of:
                        rank = rank_of[name]
                        if t < sub_t or (t == sub_t and (v, rank) < (sub_v, sub_rank)):
                            sub, sub_t, sub_v, sub_rank = r, t, v, rank
            else:
                for i, r in enumerate(cands):
                    name = r.name
                    cap = r.capacity_mu_per_min / 60.0
                    if cap <= 0.0:
                        cap = 1e-9
                    st = reps_get(name)
                    v = 0.0 if st is None else st[0] * k
                    d = depth_of(name, 0)
                    # The load guard first: it needs only the recent load, the MU rate and the cached blocks.
                    if (
                        v > rel_lim
                        and v + own - mean > slack * cap
                        and (d * bt < exempt_tokens or v > rel_lim_cached)
                    ):
                        skipped += 1
                        continue
                    if per_replica_rate:
                        lt = r.learned_prefill_tokens_per_s
                        if pool is not None:
                            lt = pool.rate(lt)
                        if not lt or spt <= 0:
                            sec_per_mu = 0.0
                        elif est.relative:
                            sec_per_mu = rel_ref / (lt * cap)
                        else:
                            sec_per_mu = 1.0 / (spt * lt)
                    # Time to first token: prefill queued ahead (virtual finish time) + own uncached prefill.
                    if st is None:
                        wait = 0.0
                    else:
                        f = st[1]
                        wait = f - now if f > now else 0.0
                    if engine_q:
                        w = r.engine_waiting
                        if w and r.inflight_requests > 0 and (r.engine_kv_usage or 0.0) >= kv_full:
                            # Requests the engine has not started (queued or memory-bound): the replica may
                            # be far slower than the fluid model believes (KV thrashing), so trust the
                            # larger estimate.
                            ww = w * r.inflight_mu / r.inflight_requests * (sec_per_mu or 1.0 / cap)
                            if ww > wait:
                                wait = ww
                    if d:
                        cached = d * bt
                        pre = full - save_per_token * (cached if cached < inp else inp)
                    else:
                        pre = full
                    t = wait + (pre * sec_per_mu if sec_per_mu else pre / cap)
                    if busy and name in busy:
                        t += busy[name]  # waiting for a sequence slot
                    if extra is not None:
                        t += extra[i]
                    if t < best_t or (t == best_t and v < best_v):
                        best, best_t, best_v, best_w = r, t, v, wait
                    if (
                        d
                        and sticky
                        and (d > deep_d or (d == deep_d and t < deep_t))
                        and (not hot or name in rank_of)
                    ):
                        deep, deep_d, deep_t = r, d, t
                    if name in rank_of:
                        rank = rank_of[name]
                        if t < sub_t or (t == sub_t and (v, rank) < (sub_v, sub_rank)):
                            sub, sub_t, sub_v, sub_rank = r, t, v, rank
            if best is not None:
                break
            guard.guarded += 1
            rel_lim = rel_lim_cached = _INF
        guard.skips += skipped
        share = deep_d * bt / inp if inp > 0 else 1.0
        picker = self.picker
        move_s = 0.0
        if deep is not None and deep is not best and picker.spill_max_reprefill_s < _INF:
            # (opt-in) the context a spill would prefill again on the fastest: what the leader holds beyond it
            move_s = est.reprefill_s(request, best, (deep_d - depth_of(best.name, 0)) * bt)
        rep, t, reason = picker.choose(
            sub, sub_t, deep, deep_d, deep_t, best, best_t, best_w, share if share < 1.0 else 1.0, move_s
        )
        name = rep.name
        cached_blocks = depths.get(name, 0) if depths else 0
        cached = min(cached_blocks * bt, inp)
        pmu = full - save_per_token * cached
        cap = _cap(rep)
        if per_replica_rate:
            sec_per_mu = est.sec_per_mu(est.learned_rate(rep), spt, cap)
        est.memo = (request, name, pmu, cap, pmu * sec_per_mu if sec_per_mu else pmu / cap)
        return RouteDecision(
            name,
            {"est_ttft_s": t, "cached_blocks": float(cached_blocks), "subset_size": float(len(subset))},
            reason,
        )

    def _extra_seconds(
        self,
        request: RequestInfo,
        cands: list[ReplicaSnapshot],
        now: float,
        rng: RandomSource,
        exclude: frozenset[str],
    ) -> list[float]:
        """Seconds the extra scorers add per candidate: sum of weight x (1 - score)."""
        ctx = PickContext(now, rng, exclude)
        out = [0.0] * len(cands)
        for scorer, weight in self.scorers:
            scores = scorer.score(request, cands, ctx)
            out = [o + weight * (1.0 - s) for o, s in zip(out, scores, strict=True)]
        return out

    # -- feedback ------------------------------------------------------------------------------------

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        est = self.estimate
        cost = est.on_dispatch(request, replica, now)
        self.guard.charge(request.request_id, replica, cost, now)
        # (after the estimate: the tail bound expects the first token at the fluid queue end; it waits only
        # for a streamed request's)
        if self.tail is not None and request.stream:
            self.tail.on_dispatch(request, replica, now)
        self.affinity.record(request, replica, now, cost, est.cap_rate)
        for scorer, _ in self.scorers:
            scorer.on_dispatch(request, replica, now)
        if self.outliers is not None and self.outliers.blocking:
            self.outliers.on_dispatch(replica, now)
        self.affinity.tick(now, est.cap_rate)

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        self.estimate.on_first_token(request, replica, now)
        if self.tail is not None:
            self.tail.on_first_token(request, replica, now)
        for scorer, _ in self.scorers:
            scorer.on_first_token(request, replica, now)

    def on_complete(self, request: RequestInfo, replica: str, now: float, cost_mu: float, ok: bool) -> None:
        if self.outliers is not None:
            self.outliers.record(replica, ok, now)
        self.guard.on_complete(request, replica, now, cost_mu, ok)
        self.estimate.release(request.request_id)
        if self.tail is not None:
            self.tail.on_complete(request, replica, now, cost_mu, ok)
        for scorer, _ in self.scorers:
            scorer.on_complete(request, replica, now, cost_mu, ok)

    def inflight(self, replica: str) -> int:
        """Requests this policy dispatched to ``replica`` that have not completed yet."""
        return self.estimate.inflight(replica)
