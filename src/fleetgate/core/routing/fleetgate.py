"""fleetgate's default policy: MU least-TTFT within a sticky, bounded-load, self-rebalancing assignment.

Per request (``pick``: O(replicas) plus O(matched prefix depth), no per-replica allocation):

1. **filter**: routable replicas only (healthy/suspect, not draining, not ejected, not in ``exclude``);
   affinity below never overrides this, so a request is never forced onto a bad replica;
2. **affinity**: the request's workload key (``keys.KeyFunction``: prompt prefix, session or tenant) owns a
   subset of replicas (``affinity.BoundedLoadAffinity``: consistent hashing with bounded loads); the subset
   grows with the key's MU rate (hot keys spread) and shrinks when it cools;
3. **estimate** for every candidate the time to first token: prefill queued ahead of the request (a
   fluid queue per replica fed at dispatch; raised to the engine's own waiting queue when the scrape shows
   one *and* the engine is short of KV memory) plus this request's prefill *given what that replica is
   expected to have cached* (``prefix_index.PrefixIndex``: blocks routed there recently, LRU-bounded by
   ``cache_tokens_per_replica``); prefill seconds = uncached tokens / ``prefill_tokens_per_s`` when the
   engine's rate is known, else prefill MU / the replica's MU rate;
4. **load guard**: a replica whose recent dispatched MU (EWMA, ``rate_tau_s``) would exceed ``load_bound``
   x the mean takes no new request, unless it is expected to hold ``guard_exempt_ratio`` of the prompt, in
   which case it may go up to ``cached_load_bound`` x the mean (moving a cache hit costs more than a
   little imbalance, but not without limit); hot keys get no exemption;
5. **pick** (``pick_rule: leader``): the leader is the replica expected to hold the longest prefix of the
   prompt (the subset's best when none does, or when the key is hot); it wins unless the best replica
   overall would be much faster (``leader_ttft > spill_factor * best_ttft + spill_slack_s``), in which
   case that one does (a *spill*). ``pick_rule: ttft``: the lowest ``ttft + cache_weight * own_prefill``.

Before the pick, the **dispatch gate** (``gate``, ``core.routing.gate``; on when the engines' prefill rate
is known) holds requests at the gateway while every replica has prefill queued (``backlog_s``) and releases
them shortest expected prefill first (``gate_prefill_s``), so the pick happens when a replica can start the
request.

Every ``rebalance_interval_s`` (driven by the ``now`` passed in): keys idle for ``key_ttl_s`` are forgotten,
cooled keys shrink their subsets, replicas that left the fleet are dropped from subsets, and replicas whose
MU rate is above ``(1 + rebalance_band)`` x mean hand their largest keys that fit in the excess to the next
replicas on the key's ring that stay inside the band (as few keys as possible move).

See docs/routing.md for the reasoning, measurements and every parameter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fleetgate.core.routing.affinity import BoundedLoadAffinity
from fleetgate.core.routing.base import PolicyBase
from fleetgate.core.routing.filters.routable import routable
from fleetgate.core.routing.gate import DispatchGate, GateParams
from fleetgate.core.routing.keys import KeyFunction
from fleetgate.core.routing.outlier import OutlierDetector
from fleetgate.core.routing.params import parse_params
from fleetgate.core.routing.pipeline import PickContext, no_replica_error
from fleetgate.core.routing.prefix_index import PrefixIndex
from fleetgate.core.routing.rates import DecayingRates, ReplicaLoads, SlidingSums
from fleetgate.core.types import RandomSource, ReplicaSnapshot, RequestInfo, RouteDecision
from fleetgate.core.units import load_profile

_INF = math.inf


def _cap(r: ReplicaSnapshot) -> float:
    """MU per second the replica serves."""
    return max(r.capacity_mu_per_min / 60.0, 1e-9)


class FleetgatePolicy(PolicyBase):
    """See the module docstring; parameters are documented in docs/routing.md."""

    name = "fleetgate"

    def __init__(
        self,
        *,
        key: str = "prefix",
        key_prefix_tokens: int = 1024,
        min_subset: int = 2,
        max_subset: int = 0,
        hot_share: float = 0.5,
        shrink_ratio: float = 0.7,
        bound_eps: float = 0.25,
        vnodes: int = 64,
        rate_tau_s: float = 60.0,
        load_window_s: float = 60.0,
        load_signal: str = "ewma",
        load_bound: float = 1.15,
        guard_min_util: float = 0.05,
        rebalance_band: float = 0.3,
        rebalance_interval_s: float = 10.0,
        max_moves: int = 64,
        key_ttl_s: float = 600.0,
        spill_factor: float = 1.5,
        spill_slack_s: float = 0.5,
        spill_factor_new: float = 1.05,
        spill_slack_new_s: float = 0.0,
        cache_tokens_per_replica: int = 400_000,
        sticky_cache: bool = True,
        guard_exempt_ratio: float = 0.3,
        cached_load_bound: float = 1.5,
        sticky_min_blocks: int = 1,
        chunk_tokens: int = 8192,
        interference_seq_tokens: float | None = None,
        interference_kv_tokens: float | None = None,
        max_running: int | None = None,
        slot_fraction: float = 0.75,
        scan_limit: int = 0,
        slot_wait_s: float | None = None,
        pick_rule: str = "leader",
        cache_weight: float = 2.0,
        prefill_tokens_per_s: float | None = None,
        engine_queue: bool = True,
        engine_queue_kv: float = 0.8,
        profile: str | None = None,
        prefill_mu_per_token: float | None = None,
        cache_discount: float | None = None,
        gate: str = "auto",
        gate_lead_s: float = 0.05,
        gate_aging: float = 0.25,
        gate_max_queued: int = 4096,
        gate_max_wait_s: float = 10.0,
        first_token_feedback: str = "auto",
        outliers: OutlierDetector | None = None,
    ) -> None:
        if load_bound < 1.0 or rebalance_band < 0 or spill_factor < 1.0 or spill_slack_s < 0:
            raise ValueError(
                "need load_bound >= 1, rebalance_band >= 0, spill_factor >= 1, spill_slack_s >= 0"
            )
        if rebalance_interval_s <= 0 or key_ttl_s <= 0 or cache_tokens_per_replica < 1 or guard_min_util < 0:
            raise ValueError("rebalance_interval_s, key_ttl_s, cache_tokens_per_replica must be positive")
        prof = load_profile(profile)
        self.alpha = prof.alpha if prefill_mu_per_token is None else float(prefill_mu_per_token)
        self.cache_discount = prof.cache_discount if cache_discount is None else float(cache_discount)
        self.beta = prof.beta
        self.gamma = prof.gamma
        self.default_output = float(prof.default_output_tokens)
        perf = prof.perf or {}
        if chunk_tokens < 1:
            raise ValueError("chunk_tokens must be >= 1")
        self.chunk_tokens = chunk_tokens
        # Decode interference (off by default: neutral on TTFT in the simulator, worse load balance; see
        # docs/routing.md): every engine iteration (one prefill chunk of ``chunk_tokens``) also runs the
        # in-flight requests' decode steps, in prefill-token equivalents per in-flight request and per
        # in-flight KV token (the Splitwise llama2-70b fit gives about 2.5 and 1.4e-3).
        self.int_seq = 0.0 if interference_seq_tokens is None else float(interference_seq_tokens)
        self.int_kv = 0.0 if interference_kv_tokens is None else float(interference_kv_tokens)
        if self.int_seq < 0 or self.int_kv < 0:
            raise ValueError("interference_seq_tokens and interference_kv_tokens must be >= 0")
        # Sequence slots: an engine runs at most ``max_running`` requests at once (vLLM ``max_num_seqs``);
        # beyond that a new request waits for running ones to finish. From ``slot_fraction`` of the slots
        # on, each in-flight request adds ``slot_wait_s`` (default: twice the mean time between two
        # finishes on a full replica, default_output decode steps / max_running), so the estimate turns
        # into count balancing before the engine queues. Defaults from the profile (``max_batch`` and its
        # decode step time); 0 disables the term.
        # Without a perf block: the Splitwise llama2-70b numbers (64 slots, 0.045 s decode step).
        mr = int(perf.get("max_batch") or 64) if max_running is None else int(max_running)
        if slot_wait_s is None:
            step = float(perf.get("decode_step_base_s", 0.029)) + float(
                perf.get("decode_step_per_seq_s", 2.4e-4)
            ) * max(mr, 1)
            slot_wait_s = 2.0 * step * self.default_output / mr if mr > 0 else 0.0
        if mr < 0 or slot_wait_s < 0 or not 0 < slot_fraction <= 1:
            raise ValueError("need max_running >= 0, slot_wait_s >= 0 and 0 < slot_fraction <= 1")
        self.max_running = mr
        if scan_limit < 0:
            raise ValueError("scan_limit must be >= 0 (0: always score every replica)")
        self.scan_limit = scan_limit
        if pick_rule not in ("ttft", "leader"):
            raise ValueError("pick_rule must be 'ttft' or 'leader'")
        if cache_weight < 0 or (prefill_tokens_per_s is not None and prefill_tokens_per_s <= 0):
            raise ValueError("need cache_weight >= 0 and prefill_tokens_per_s > 0")
        self.pick_rule = pick_rule
        if gate not in ("auto", "on", "off"):
            raise ValueError("gate must be 'auto', 'on' or 'off'")
        # The dispatch gate (core.routing.gate) needs an accurate backlog, i.e. the engines' prefill rate:
        # ``auto`` turns it on exactly when ``prefill_tokens_per_s`` is configured.
        on = gate == "on" or (gate == "auto" and prefill_tokens_per_s is not None)
        gp = GateParams(gate_lead_s, gate_aging, gate_max_queued, gate_max_wait_s)
        self.gate: DispatchGate[Any] | None = DispatchGate(gp) if on else None
        self.engine_queue = engine_queue
        self.engine_queue_kv = engine_queue_kv
        self.cache_weight = float(cache_weight)
        # Engine prefill throughput (tokens/s) when known; else the profile's (capacity / alpha).
        self.prefill_tps = None if prefill_tokens_per_s is None else float(prefill_tokens_per_s)
        self.slot_from = max(1, math.ceil(slot_fraction * mr)) if mr else 0
        self.slot_wait_s = float(slot_wait_s)
        # Per replica: [in-flight requests, in-flight KV tokens] dispatched by this policy (never lags).
        self._kv: dict[str, list[float]] = {}
        self._kv_of: dict[str, tuple[str, float]] = {}
        self._busy: dict[str, float] = {}  # replica -> expected wait for a sequence slot (s)
        # First-token feedback: request id -> (replica, expected end of its prefill, the replica's correction
        # then); replica -> sum of the corrections applied to its fluid queue.
        if first_token_feedback not in ("auto", "on", "off"):
            raise ValueError("first_token_feedback must be 'auto', 'on' or 'off'")
        # ``auto``: with the gate, whose holds depend on the backlog being right.
        self.first_token_feedback = first_token_feedback == "on" or (
            first_token_feedback == "auto" and self.gate is not None
        )
        self._expect: dict[str, tuple[str, float, float]] = {}
        self._shift: dict[str, float] = {}
        if load_signal not in ("ewma", "window"):
            raise ValueError("load_signal must be 'ewma' or 'window'")
        self.load_signal = load_signal
        self.load_bound = load_bound
        self.guard_min_util = guard_min_util
        self.rebalance_band = rebalance_band
        self.rebalance_interval_s = rebalance_interval_s
        self.max_moves = max_moves
        self.key_ttl_s = key_ttl_s
        self.spill_factor = spill_factor
        self.spill_slack_s = spill_slack_s
        if spill_factor_new < 1.0 or spill_slack_new_s < 0:
            raise ValueError("need spill_factor_new >= 1 and spill_slack_new_s >= 0")
        self.spill_factor_new = spill_factor_new
        self.spill_slack_new_s = spill_slack_new_s
        self.cache_tokens_per_replica = cache_tokens_per_replica
        self.sticky_cache = sticky_cache
        self.guard_exempt_ratio = guard_exempt_ratio
        self.cached_load_bound = max(cached_load_bound, load_bound)
        self.sticky_min_blocks = sticky_min_blocks
        self.outliers = outliers
        self.key_fn = KeyFunction(key, key_prefix_tokens)
        self.affinity = BoundedLoadAffinity(
            vnodes=vnodes,
            bound_eps=bound_eps,
            min_subset=min_subset,
            max_subset=max_subset,
            hot_share=hot_share,
            shrink_ratio=shrink_ratio,
        )
        self.index: PrefixIndex | None = None
        self.replica_load = SlidingSums(load_window_s)
        self.loads = ReplicaLoads(rate_tau_s)
        self.key_rates: DecayingRates[int] = DecayingRates(rate_tau_s)
        self._pending: dict[int, list[str]] = {}
        self._charged: dict[str, float] = {}
        # (request object, replica, prefill MU given its expected cache, MU/s, prefill seconds) of the last
        # pick.
        self._memo: tuple[RequestInfo | None, str, float, float, float] = (None, "", 0.0, 1.0, 0.0)
        self._last_req: RequestInfo | None = None
        self._last_key = 0
        self._cands: list[ReplicaSnapshot] = []
        self._replicas: Sequence[ReplicaSnapshot] = ()
        self._cap_rate = 100.0 / 60.0
        self._next_maintenance: float | None = None
        self.spills = 0  # picks that left the leader for a much faster replica
        self.off_subset = 0  # dispatches outside the key's subset (cache leader or spill)
        self.guarded = 0
        self.skips = 0

    # -- estimates -----------------------------------------------------------------------------------

    def prefill_mu(self, request: RequestInfo) -> float:
        """MU of this request's prefill with nothing cached.

        Scaled from the request's own ``cost_mu`` by the profile's prefill share, so a profile that differs
        from the one that priced the request in absolute scale still gives the right proportion.
        """
        inp = request.input_tokens
        absolute = self.alpha * inp
        if request.cost_mu <= 0:
            return absolute
        out = request.estimated_output_tokens or request.max_output_tokens or self.default_output
        whole = self.gamma + absolute + self.beta * out
        return request.cost_mu * absolute / whole if whole > 0 else 0.0

    def _prefill_s(self, request: RequestInfo, pre_mu: float, cap: float) -> float:
        """Seconds of prefill for ``pre_mu`` (engine throughput when known, else the MU rate)."""
        tps = self.prefill_tps
        full = self.prefill_mu(request)
        inp = request.input_tokens
        if tps and full > 0 and inp > 0:
            return pre_mu * inp / (full * tps)
        return pre_mu / cap

    def backlog_s(self, replicas: Sequence[ReplicaSnapshot], now: float) -> float:
        """Seconds until the least-loaded routable replica has drained the prefill queued on it (the fluid
        queue fed at dispatch; 0 for a replica with nothing in flight, so a too-slow configured engine rate
        never holds a request while a replica idles); ``inf`` when no replica is routable. Drives the gate."""
        lst = replicas if isinstance(replicas, list) else list(replicas)
        reps = self.loads.reps
        best = _INF
        for r in routable(lst, PickContext(now, None, frozenset()), self.outliers):  # type: ignore[arg-type]
            if r.inflight_requests == 0:
                return 0.0  # nothing in flight there: idle, whatever the estimate says
            st = reps.get(r.name)
            left = 0.0 if st is None else st[1] - now
            if left < best:
                best = left if left > 0.0 else 0.0
        return best

    def gate_prefill_s(self, request: RequestInfo) -> float:
        """The request's prefill seconds on the replica expected to hold most of its prompt (the gate's
        shortest-first order)."""
        inp = request.input_tokens
        cached = 0
        hashes = request.prefix_hashes
        if hashes and self.index is not None:
            depths, _ = self.index.match(hashes)
            if depths:
                cached = min(max(depths.values()) * request.prefix_block_tokens, inp)
        full = self.prefill_mu(request)
        pre = full - (full * (1.0 - self.cache_discount) / inp * cached if inp > 0 else 0.0)
        return self._prefill_s(request, pre, self._cap_rate)

    def _key(self, request: RequestInfo) -> int:
        """The request's workload key (memoised for the pick -> on_dispatch pair of one request object)."""
        if self._last_req is request:
            return self._last_key
        k = self.key_fn(request)
        self._last_req, self._last_key = request, k
        return k

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
        cands = routable(lst, PickContext(now, rng, exclude), self.outliers)
        if not cands:
            raise no_replica_error(len(lst), request.model)
        self._replicas = lst
        if not exclude:
            self._cands = cands
        n = len(cands)
        if n == 1:
            only = cands[0]
            pmu = self.prefill_mu(request)
            self._memo = (request, only.name, pmu, _cap(only), self._prefill_s(request, pmu, _cap(only)))
            return RouteDecision(only.name, reason="fleetgate:only")
        aff = self.affinity
        key = self._key(request)
        state = aff.keys.get(key)
        if state is not None:
            subset = state.subset
            rank_of = state.rank
        else:
            pend = self._pending.get(key)
            if pend is None:
                names = {r.name for r in cands}
                aff.ensure_ring(names)
                pend = aff.walk(key, names, n, aff.min_subset)
                if len(self._pending) > 4096:
                    self._pending.clear()
                self._pending[key] = pend
            subset = pend
            rank_of = {name: i for i, name in enumerate(pend)}

        hashes = request.prefix_hashes
        if hashes and self.index is not None:
            depths, deepest = self.index.match(hashes)
        else:
            depths, deepest = None, frozenset()
        inp = request.input_tokens
        full = self.prefill_mu(request)
        save_per_token = full * (1.0 - self.cache_discount) / inp if inp > 0 else 0.0
        bt = request.prefix_block_tokens

        # Recent MU per replica (the load guard's signal), on a "MU over the horizon" scale.
        loads = self.loads
        reps = loads.reps
        window = self.load_signal == "window"
        if window:
            load = self.replica_load
            load.expire(now)
            sums = load.sums
            horizon = load.window_s
            k = 1.0
            total = sum(sums.get(r.name, 0.0) for r in cands)
            known = n
        else:
            sums = {}
            horizon = loads.tau_s
            k = loads.scale(now) * horizon  # stored load -> MU over the last ``tau`` seconds
            total = loads.total * k
            known = max(n, len(reps))  # mean over every replica with recent load (routable or not)
        own = request.cost_mu if request.cost_mu > 0 else full
        mean = (total + own) / known
        rel_lim = self.load_bound * mean - own
        rel_lim_cached = self.cached_load_bound * mean - own
        slack = self.guard_min_util * horizon
        # A hot key (its subset grew beyond the minimum) must spread: no guard exemption for cached
        # replicas and no pull towards cache holders outside its subset.
        hot = len(subset) > aff.min_subset
        exempt_tokens = self.guard_exempt_ratio * inp if inp > 0 and not hot else _INF

        sticky = self.sticky_cache
        skipped = 0
        lim = self.scan_limit
        if lim and n > lim:
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
        kvd = self._kv
        int_seq, int_kv = self.int_seq, self.int_kv
        interf = int_seq > 0 or int_kv > 0
        busy = self._busy  # replicas with at least ``slot_from`` requests in flight (usually none)
        chunk = float(self.chunk_tokens)
        spt = full / inp if inp > 0 else 0.0  # MU per prompt token
        tps = self.prefill_tps
        # Seconds per MU of this request's prefill when the engine's prefill throughput is known.
        sec_per_mu = 1.0 / (spt * tps) if tps and spt > 0 else 0.0
        ttft_rule = self.pick_rule == "ttft"
        engine_q = self.engine_queue
        kv_full = self.engine_queue_kv
        cw = self.cache_weight
        while True:  # a second pass without the guard only if the guard left nothing (a huge request)
            best_i = deep_i = sub_i = -1
            best_t = deep_t = sub_t = _INF
            best_v = sub_v = _INF
            best_s = _INF
            deep_d = 0
            sub_rank = 1 << 30
            for i, r in enumerate(cands):
                name = r.name
                cap = r.capacity_mu_per_min / 60.0
                if cap <= 0.0:
                    cap = 1e-9
                # Time to first token: prefill queued ahead (virtual finish time) + own uncached prefill.
                st = reps.get(name)
                if st is None:
                    v = 0.0
                    wait = 0.0
                else:
                    v = st[0] * k
                    wait = st[1] - now if st[1] > now else 0.0
                if window:
                    v = sums.get(name, 0.0)
                w = r.engine_waiting if engine_q else 0
                if w and r.inflight_requests > 0 and (r.engine_kv_usage or 0.0) >= kv_full:
                    # Requests the engine has not started (queued or memory-bound): the replica may be far
                    # slower than the fluid model believes (KV thrashing), so trust the larger estimate.
                    ww = w * r.inflight_mu / r.inflight_requests * (sec_per_mu or 1.0 / cap)
                    if ww > wait:
                        wait = ww
                pre = full
                d = 0
                if depths:
                    d = depths.get(name, 0)
                    if d:
                        cached = d * bt
                        pre -= save_per_token * (cached if cached < inp else inp)
                own_s = pre * sec_per_mu if sec_per_mu else pre / cap
                t = wait + own_s
                if interf:
                    kv = kvd.get(name)
                    if kv is not None and kv[0] > 0:
                        # Each chunk (ahead of and of this request) also runs the in-flight decodes.
                        unc = inp - (d * bt if d * bt < inp else inp)
                        t += (
                            (int_seq * kv[0] + int_kv * kv[1])
                            / chunk
                            * (wait + (unc if unc > chunk else chunk) * spt / cap)
                        )
                if busy:
                    pen = busy.get(name)
                    if pen is not None:
                        t += pen  # waiting for a sequence slot
                if (
                    v > rel_lim
                    and v + own - mean > slack * cap
                    and (d * bt < exempt_tokens or v > rel_lim_cached)
                ):
                    skipped += 1
                    continue
                if ttft_rule:
                    # Lowest TTFT plus ``cache_weight`` x the prefill work this request adds to the
                    # replica (a cache hit also saves every request queued behind it later); ties: less
                    # recent load, then the key's subset in ring order.
                    sc = t + cw * own_s
                    rk = rank_of.get(name, 1 << 30)
                    if sc < best_s or (sc == best_s and (v, rk) < (best_v, sub_rank)):
                        best_i, best_t, best_v, best_s, sub_rank = i, t, v, sc, rk
                    continue
                if t < best_t or (t == best_t and v < best_v):
                    best_i, best_t, best_v = i, t, v
                if (
                    d
                    and sticky
                    and (d > deep_d or (d == deep_d and t < deep_t))
                    and (not hot or name in rank_of)
                ):
                    deep_i, deep_d, deep_t = i, d, t
                rank = rank_of.get(name)
                if rank is not None and (t < sub_t or (t == sub_t and (v, rank) < (sub_v, sub_rank))):
                    sub_i, sub_t, sub_v, sub_rank = i, t, v, rank
            if best_i >= 0:
                break
            self.guarded += 1
            rel_lim = rel_lim_cached = _INF
        self.skips += skipped
        if ttft_rule:
            chosen, t, reason = best_i, best_t, "fleetgate:ttft"
        else:
            if deep_i >= 0 and deep_d >= self.sticky_min_blocks:
                sub_i, sub_t = deep_i, deep_t  # the replica expected to hold the most of the prompt leads
                factor, slack_s = self.spill_factor, self.spill_slack_s
            else:
                # Nothing of the prompt is cached anywhere: the subset only keeps keys apart, the cache
                # leader will find the next turn wherever this one goes, so the fastest may take it.
                factor, slack_s = self.spill_factor_new, self.spill_slack_new_s
            if sub_i >= 0 and sub_t <= factor * best_t + slack_s:
                chosen, t, reason = sub_i, sub_t, "fleetgate:affinity"
            else:
                chosen, t, reason = best_i, best_t, "fleetgate:spill"
                self.spills += 1
        rep = cands[chosen]
        name = rep.name
        cached_blocks = depths.get(name, 0) if depths else 0
        cached = min(cached_blocks * bt, inp)
        pmu = full - save_per_token * cached
        self._memo = (request, name, pmu, _cap(rep), pmu * sec_per_mu if sec_per_mu else pmu / _cap(rep))
        return RouteDecision(
            name,
            {"est_ttft_s": t, "cached_blocks": float(cached_blocks), "subset_size": float(len(subset))},
            reason,
        )

    # -- feedback ------------------------------------------------------------------------------------

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        if request.prefix_hashes:
            if self.index is None:
                blocks = max(1, self.cache_tokens_per_replica // max(request.prefix_block_tokens, 1))
                self.index = PrefixIndex(blocks)
            self.index.insert(replica, request.prefix_hashes)
        full = self.prefill_mu(request)
        memo = self._memo
        if memo[0] is request and memo[1] == replica:
            pre, cap, pre_s = memo[2], memo[3], memo[4]
        else:
            pre, cap = full, self._cap_rate
            pre_s = self._prefill_s(request, full, cap)
        # Expected settled cost: the estimate, less the prefill the expected cache hit saves.
        cost = request.cost_mu - full + pre if request.cost_mu > 0 else pre + self.gamma
        self._cap_rate = cap
        self.loads.queue(replica, pre_s, now)
        if self.load_signal == "window":
            self.replica_load.add(replica, cost, now)
        self.loads.add(replica, cost, now)
        if request.request_id:
            if len(self._charged) > 100_000:  # outcomes that never came back: forget them
                self._charged.clear()
                self._kv_of.clear()
                self._kv.clear()
                self._busy.clear()
                self._expect.clear()
            self._charged[request.request_id] = cost
            out = request.estimated_output_tokens or request.max_output_tokens or self.default_output
            tokens = request.input_tokens + 0.5 * min(out, 4 * self.default_output)
            self._release(request.request_id)  # a retry without an outcome for the first attempt
            kv = self._kv.get(replica)
            if kv is None:
                kv = self._kv[replica] = [0.0, 0.0]
            kv[0] += 1.0
            kv[1] += tokens
            self._kv_of[request.request_id] = (replica, tokens)
            if self.first_token_feedback:
                self._expect[request.request_id] = (
                    replica,
                    self.loads.reps[replica][1],
                    self._shift.get(replica, 0.0),
                )
            self._update_busy(replica, kv[0])
        aff = self.affinity
        key = self._key(request)
        state = aff.keys.get(key)
        if state is None:
            subset = self._pending.pop(key, None) or [replica]
            state = aff.commit(key, subset, now)
        state.last_seen = now
        if replica not in state.subset:
            self.off_subset += 1
        self.key_rates.add(key, cost, now)
        members = len(self._cands) or 1
        kr = self.key_rates.rate(key, now)
        size = aff.desired_size(kr, self._cap_rate, members)
        if size > len(state.subset):
            names = {r.name for r in self._cands}
            aff.ensure_ring(names)
            aff.grow(key, names, members, size)
        elif aff.should_shrink(kr, self._cap_rate, len(state.subset)):
            aff.shrink(key)
        if self.outliers is not None and self.outliers.blocking:
            self.outliers.on_dispatch(replica, now)
        if self._next_maintenance is None:
            self._next_maintenance = now + self.rebalance_interval_s
        elif now >= self._next_maintenance:
            self.maintain(now)
            self._next_maintenance = now + self.rebalance_interval_s

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        """The request's first token arrived: its prefill (and, first come first served, everything queued
        before it) is done. Move the replica's fluid queue by how far off its expected end was, so the
        backlog (and the dispatch gate) follows the engine's real pace. Corrections already applied since the
        request was queued are counted, so a constant delay (network, first decode step) does not add up."""
        exp = self._expect.pop(request.request_id, None)
        if exp is None or exp[0] != replica:
            return
        st = self.loads.reps.get(replica)
        if st is None:
            return
        shift = self._shift.get(replica, 0.0)
        drift = now - (exp[1] + shift - exp[2])
        st[1] += drift
        self._shift[replica] = shift + drift

    def on_complete(self, request: RequestInfo, replica: str, now: float, cost_mu: float, ok: bool) -> None:
        if self.outliers is not None:
            self.outliers.record(replica, ok, now)
        charged = self._charged.pop(request.request_id, None)
        self._release(request.request_id)
        if charged is not None and ok and cost_mu > 0:
            # Settle: the load signal follows what the request really cost, not its estimate.
            self.loads.add(replica, cost_mu - charged, now)
            if self.load_signal == "window":
                self.replica_load.add(replica, cost_mu - charged, now)

    def _release(self, request_id: str) -> None:
        """Take a request out of its replica's in-flight count (completed, failed or re-dispatched)."""
        self._expect.pop(request_id, None)
        held = self._kv_of.pop(request_id, None)
        if held is not None:
            kv = self._kv.get(held[0])
            if kv is not None:
                kv[0] = max(kv[0] - 1.0, 0.0)
                kv[1] = max(kv[1] - held[1], 0.0)
                self._update_busy(held[0], kv[0])

    def _update_busy(self, replica: str, inflight: float) -> None:
        """Keep ``_busy`` (the slot-wait penalty of replicas near their sequence-slot limit) current."""
        start = self.slot_from
        if start and self.slot_wait_s > 0 and inflight >= start:
            self._busy[replica] = (inflight + 1 - start) * self.slot_wait_s
        else:
            self._busy.pop(replica, None)

    def inflight(self, replica: str) -> int:
        """Requests this policy dispatched to ``replica`` that have not completed yet."""
        kv = self._kv.get(replica)
        return 0 if kv is None else int(kv[0])

    # -- maintenance ---------------------------------------------------------------------------------

    def maintain(self, now: float) -> None:
        """Expire and shrink keys, drop departed replicas from subsets, then rebalance (see module doc)."""
        aff = self.affinity
        present = {r.name for r in self._replicas}
        members = [r.name for r in self._cands]
        member_set = set(members)
        n = len(members) or 1
        cap = self._cap_rate
        ttl_edge = now - self.key_ttl_s
        kscale = self.key_rates.scale(now)
        kvals = self.key_rates.values
        for name in [m for m in self.loads.reps if m not in present]:
            self.loads.discard(name)  # departed: no longer part of the mean
        for key, state in list(aff.keys.items()):
            if state.last_seen < ttl_edge:
                aff.forget(key)
                self.key_rates.discard(key)
                continue
            for name in [m for m in state.subset if m not in present]:
                aff.drop_member(key, name)
            kr = kvals.get(key, 0.0) * kscale
            while aff.should_shrink(kr, cap, len(state.subset)):
                aff.shrink(key)
            if len(state.subset) < aff.min_subset and members:
                aff.grow(key, member_set, n, min(aff.min_subset, n))
        if members:
            self.rebalance(now, members)

    def rebalance(self, now: float, members: list[str]) -> int:
        """Move the fewest keys off replicas above the band; returns how many slots moved."""
        aff = self.affinity
        rr = self.loads
        rate = {m: rr.rate(m, now) for m in members}
        mean = sum(rate.values()) / len(members)
        if mean <= 0:
            return 0
        hi = (1.0 + self.rebalance_band) * mean
        slack = self.guard_min_util * self._cap_rate
        kscale = self.key_rates.scale(now)
        kvals = self.key_rates.values
        moved = 0
        for src in sorted(members, key=lambda m: -rate[m]):
            if rate[src] <= hi or rate[src] - mean <= slack or moved >= self.max_moves:
                break
            contrib = []
            for key in aff.replica_keys.get(src, ()):
                st = aff.keys[key]
                contrib.append((kvals.get(key, 0.0) * kscale / len(st.subset), key))
            contrib.sort(reverse=True)
            for c, key in contrib:
                excess = rate[src] - mean
                if excess <= self.rebalance_band * mean / 2 or moved >= self.max_moves:
                    break
                if c <= 0 or c > excess * 1.000001:
                    continue
                cold = {m for m in members if rate[m] + c <= hi and m != src}
                if not cold:
                    break
                st = aff.keys[key]
                target = aff.walk(key, cold, len(members), 1, st.subset)
                if not target:
                    continue
                dst = target[0]
                aff.replace(key, src, dst)
                rr.shift(src, dst, c, now)
                rate[src] -= c
                rate[dst] += c
                moved += 1
        return moved


_PARAMS: dict[str, Any] = {
    "key": str,
    "key_prefix_tokens": int,
    "min_subset": int,
    "max_subset": int,
    "hot_share": float,
    "shrink_ratio": float,
    "bound_eps": float,
    "vnodes": int,
    "rate_tau_s": float,
    "load_window_s": float,
    "load_signal": str,
    "load_bound": float,
    "guard_min_util": float,
    "rebalance_band": float,
    "rebalance_interval_s": float,
    "max_moves": int,
    "key_ttl_s": float,
    "spill_factor": float,
    "spill_slack_s": float,
    "spill_factor_new": float,
    "spill_slack_new_s": float,
    "cache_tokens_per_replica": int,
    "sticky_cache": lambda v: v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes", "on"),
    "guard_exempt_ratio": float,
    "cached_load_bound": float,
    "sticky_min_blocks": int,
    "chunk_tokens": int,
    "interference_seq_tokens": float,
    "interference_kv_tokens": float,
    "max_running": int,
    "slot_fraction": float,
    "scan_limit": int,
    "slot_wait_s": float,
    "pick_rule": str,
    "engine_queue_kv": float,
    "engine_queue": lambda v: v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes", "on"),
    "cache_weight": float,
    "prefill_tokens_per_s": float,
    "profile": str,
    "prefill_mu_per_token": float,
    "cache_discount": float,
    "gate": lambda v: ("on" if v else "off") if isinstance(v, bool) else str(v),
    "gate_lead_s": float,
    "gate_aging": float,
    "gate_max_queued": int,
    "gate_max_wait_s": float,
    "first_token_feedback": lambda v: ("on" if v else "off") if isinstance(v, bool) else str(v),
}


def build_fleetgate(params: dict[str, Any], det: OutlierDetector | None) -> FleetgatePolicy:
    return FleetgatePolicy(outliers=det, **parse_params("fleetgate", params, _PARAMS, keep_none=True))
