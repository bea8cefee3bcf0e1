"""The time-to-first-token estimate: a scorer with its own state, kept current by the request hooks.

For a candidate replica the estimate is

    prefill queued ahead of the request  (a fluid queue per replica: fed at dispatch, reset at first token)
  + this request's own prefill           (uncached tokens given what the replica is expected to hold)
  + a sequence-slot wait                 (when the replica is near its ``max_running`` limit)

raised to the engine's own waiting queue when the scrape shows one *and* the engine is short of KV memory.
Prefill seconds are uncached tokens / the engine's prefill rate when one is known (``prefill_tokens_per_s``
when configured, else the rate the gateway learned online for that replica,
``ReplicaSnapshot.learned_prefill_tokens_per_s``, taken through ``PooledRates`` when
``learned_rate_noise`` > 1), else prefill MU / the replica's MU rate.

State (all fed by ``on_dispatch`` / ``on_first_token`` / ``on_complete``): the expected prefix cache
(``PrefixIndex`` of blocks routed to each replica, LRU-bounded by ``cache_tokens_per_replica``), the fluid
queues (``ReplicaLoads``' finish times, shared with the load signal), the in-flight requests and KV tokens
per replica, and first-token feedback. As a plain pipeline scorer (``least_requests``, ``p2c``) it scores
``lower_is_better`` of the estimate; the ``fleetgate`` policy reads the seconds themselves.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Literal

from pydantic import Field, field_validator

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.pipeline import PickContext, StageBase
from fleetgate.core.routing.prefix_index import PrefixIndex
from fleetgate.core.routing.rates import ReplicaLoads
from fleetgate.core.routing.scorers.normalize import lower_is_better
from fleetgate.core.types import HealthState, ReplicaSnapshot, RequestInfo
from fleetgate.core.units import CostProfile

_HEALTHY = HealthState.HEALTHY
_SUSPECT = HealthState.SUSPECT

Switch = Literal["auto", "on", "off"]


def switch(value: object) -> object:
    """YAML booleans for an auto/on/off switch: ``true`` -> ``on``, ``false`` -> ``off``."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


class TtftEstimateParams(PluginParams):
    """The TTFT estimate (engine prefill rate, expected cache, sequence slots, engine queue)."""

    prefill_tokens_per_s: float | None = Field(
        default=None,
        gt=0,
        description="The engines' prefill throughput (prompt tokens/s). Unset: the rate learned online per "
        "replica when there is one, else the cost profile's MU rate. Setting it also turns the dispatch "
        "gate on (`gate: auto`).",
    )
    cache_tokens_per_replica: int = Field(
        default=400_000, ge=1, description="Prefix-cache tokens one replica is expected to hold (LRU)."
    )
    prefill_mu_per_token: float | None = Field(
        default=None, description="Overrides the cost profile's `alpha` for the estimate."
    )
    cache_discount: float | None = Field(
        default=None, description="Overrides the cost profile's cached-token discount for the estimate."
    )
    max_running: int | None = Field(
        default=None,
        ge=0,
        description="Sequence slots per engine (vLLM `max_num_seqs`); default from the profile (64 without "
        "a perf block); 0 disables the slot term.",
    )
    slot_fraction: float = Field(
        default=0.75, gt=0, le=1, description="Share of the slots in use from which a slot wait is added."
    )
    slot_wait_s: float | None = Field(
        default=None,
        ge=0,
        description="Seconds each in-flight request above the threshold adds (default: twice the mean time "
        "between two finishes on a full replica).",
    )
    engine_queue: bool = Field(
        default=True, description="Raise the estimate to the engine's scraped waiting queue when short of KV."
    )
    engine_queue_kv: float = Field(
        default=0.8, description="KV usage from which the engine's waiting queue is trusted."
    )
    first_token_feedback: Switch = Field(
        default="auto",
        description="Correct the fluid queue by the real first-token time; `auto`: with the dispatch gate.",
    )
    learned_rate_noise: float = Field(
        default=1.0,
        ge=1.0,
        description="How far apart (a factor) the learned prefill rates of identical replicas may be by "
        "noise alone. A replica's learned rate within this factor of the median over the candidates counts "
        "as the median; beyond it, its difference is shrunk on the log scale (d -> d - log(f)^2 / d: 4x "
        "the median with 1.5 counts as 3.6x); a replica not learned yet gets the median. 1: each "
        "replica's own rate. Not used with `prefill_tokens_per_s`.",
    )

    learned_rate_scale: Literal["seconds", "relative"] = Field(
        default="seconds",
        description="How a learned prefill rate enters the estimate: `seconds`, uncached prompt tokens / "
        "the rate; `relative`, the cost profile's prefill MU / the replica's MU rate (the scale replicas "
        "without a learned rate are on) times the median learned rate over the candidates / the "
        "replica's (pooled per `learned_rate_noise`; a replica not learned yet counts as the median), so "
        "learned rates only say which replica is faster. Not used with `prefill_tokens_per_s`.",
    )

    _switch = field_validator("first_token_feedback", mode="before")(switch)


class PooledRates:
    """Learned prefill rates shrunk toward the deployment's median (``learned_rate_noise``).

    The online learner gives each replica its own estimate, and on identical replicas those estimates scatter
    (the same engine read 1.5-2.4x apart on a shared machine: docs/benchmarks.md, session 6), so a TTFT
    estimate that divides by them sends more to whichever replica happened to look fast. On the log scale, a
    replica's distance ``d`` from the median is shrunk to ``d - s^2 / d`` beyond the noise ``s = log(noise)``
    and to 0 within it (positive-part James-Stein shrinkage): identical replicas get one rate, a replica
    much faster than the noise keeps most of its difference (4x the median with noise 1.5: 3.6x).
    ``update`` is called once per pick with the candidates; the median is recomputed only when their rates
    changed.
    """

    __slots__ = ("_log_noise", "_memo", "_per_mu", "_rates", "median", "noise")

    def __init__(self, noise: float) -> None:
        self.noise = noise
        self._log_noise = math.log(noise)
        self.median: float | None = None
        self._rates: list[float | None] = []
        self._memo: dict[float, float] = {}
        # MU rate -> own learned rate -> seconds per prefill MU on the relative scale (``relative_per_mu``).
        self._per_mu: dict[float, dict[float | None, float]] = {}

    def update(self, candidates: Sequence[ReplicaSnapshot]) -> None:
        rates = [r.learned_prefill_tokens_per_s for r in candidates]
        if rates == self._rates:
            return
        self._rates = rates
        known = [x for x in rates if x]
        med = statistics.median(known) if known else None
        if med != self.median:
            self.median = med
            self._memo = {}
            self._per_mu = {}

    def rate(self, own: float | None) -> float | None:
        """The rate to use for a replica whose own learned rate is ``own`` (``None``: not learned yet)."""
        med = self.median
        if med is None:
            return own
        if not own:
            return med
        got = self._memo.get(own)
        if got is None:
            d = math.log(own / med)
            s = self._log_noise
            got = med if -s <= d <= s else med * math.exp(d - s * s / d)
            self._memo[own] = got
        return got

    def per_mu_table(self, cap: float) -> dict[float | None, float]:
        """The seconds per MU ``relative_per_mu`` gave so far at MU rate ``cap``, by own learned rate (valid
        while the median holds): the fused pick reads it and asks ``relative_per_mu`` only on a miss."""
        table = self._per_mu.get(cap)
        if table is None:
            table = self._per_mu[cap] = {}
        return table

    def relative_per_mu(self, own: float | None, cap: float) -> float:
        """``learned_rate_scale: relative``: seconds per prefill MU on a replica whose own learned rate is
        ``own`` and MU rate ``cap``: the median / its pooled rate / ``cap`` (``TtftEstimate.sec_per_mu``'s
        rule; 0 without a median). Request-independent, so kept in ``per_mu_table(cap)``."""
        med = self.median
        rate = self.rate(own)
        got = med / (rate * cap) if med and rate else 0.0
        table = self.per_mu_table(cap)
        if len(table) >= 4096:  # rates keep being relearned: forget old ones
            table.clear()
        table[own] = got
        return got


class TtftEstimate(StageBase):
    """The estimate and its state; ``score`` makes it a pipeline scorer (see the module docstring).

    ``feedback``: ``True``/``False``, or ``None`` for "when an engine prefill rate is known" (configured or
    learned), which is what ``first_token_feedback: auto`` means behind an automatic dispatch gate.
    """

    name = "ttft_estimate"
    uses_prefix_hashes = True

    def __init__(
        self,
        params: TtftEstimateParams,
        profile: CostProfile,
        loads: ReplicaLoads | None = None,
        *,
        feedback: bool | None = False,
    ) -> None:
        self.params = params
        self.alpha = (
            profile.alpha if params.prefill_mu_per_token is None else float(params.prefill_mu_per_token)
        )
        self.cache_discount = (
            profile.cache_discount if params.cache_discount is None else params.cache_discount
        )
        self.beta = profile.beta
        self.gamma = profile.gamma
        self.default_output = float(profile.default_output_tokens)
        perf = profile.perf or {}
        # Sequence slots: an engine runs at most ``max_running`` requests at once; beyond that a new request
        # waits for running ones to finish. From ``slot_fraction`` of the slots on, each in-flight request
        # adds ``slot_wait_s`` (default: twice the mean time between two finishes on a full replica), so the
        # estimate turns into count balancing before the engine queues. Without a perf block: the Splitwise
        # llama2-70b numbers (64 slots, 0.045 s decode step).
        mr = int(perf.get("max_batch") or 64) if params.max_running is None else params.max_running
        slot_wait_s = params.slot_wait_s
        if slot_wait_s is None:
            step = float(perf.get("decode_step_base_s", 0.029)) + float(
                perf.get("decode_step_per_seq_s", 2.4e-4)
            ) * max(mr, 1)
            slot_wait_s = 2.0 * step * self.default_output / mr if mr > 0 else 0.0
        self.max_running = mr
        self.slot_from = max(1, math.ceil(params.slot_fraction * mr)) if mr else 0
        self.slot_wait_s = float(slot_wait_s)
        self.prefill_tps = params.prefill_tokens_per_s
        self.engine_queue = params.engine_queue
        self.engine_queue_kv = params.engine_queue_kv
        self.cache_tokens_per_replica = params.cache_tokens_per_replica
        #: ``learned_rate_scale: relative``: learned rates scale the MU seconds by the pool's median / own.
        self.relative = params.learned_rate_scale == "relative" and params.prefill_tokens_per_s is None
        #: Learned rates shrunk toward the median (``None``: each replica's own rate, or a configured one).
        self.pool: PooledRates | None = (
            PooledRates(params.learned_rate_noise)
            if (params.learned_rate_noise > 1.0 or self.relative) and params.prefill_tokens_per_s is None
            else None
        )
        self.loads = loads if loads is not None else ReplicaLoads(60.0)
        self.index: PrefixIndex | None = None
        #: Whether a snapshot ever carried a learned prefill rate (turns the automatic gate and feedback on).
        self.learned_seen = False
        self._feedback = feedback
        # Per replica: [in-flight requests, in-flight KV tokens] dispatched through this estimate.
        self._kv: dict[str, list[float]] = {}
        self._kv_of: dict[str, tuple[str, float]] = {}
        self._busy: dict[str, float] = {}  # replica -> expected wait for a sequence slot (s)
        # First-token feedback: request id -> (replica, expected end of its prefill, the replica's correction
        # then); replica -> sum of the corrections applied to its fluid queue.
        self._expect: dict[str, tuple[str, float, float]] = {}
        self._shift: dict[str, float] = {}
        #: MU per second of the replica the last request went to (the fallback rate).
        self.cap_rate = 100.0 / 60.0
        # (request, replica, prefill MU given its expected cache, MU/s, prefill seconds) of the last pick.
        self.memo: tuple[RequestInfo | None, str, float, float, float] = (None, "", 0.0, 1.0, 0.0)
        # The same for every candidate of the last ``score`` call (when used as a plain pipeline scorer).
        self._memo_all: tuple[RequestInfo | None, dict[str, tuple[float, ReplicaSnapshot]]] = (None, {})

    # -- the estimate --------------------------------------------------------------------------------

    @property
    def rate_known(self) -> bool:
        """An engine prefill rate is configured, or was learned for some replica."""
        return self.prefill_tps is not None or self.learned_seen

    @property
    def busy(self) -> Mapping[str, float]:
        """Replica -> expected wait for a sequence slot (s), for replicas near their slot limit."""
        return self._busy

    @property
    def feedback(self) -> bool:
        return self.rate_known if self._feedback is None else self._feedback

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

    def sec_per_mu(self, rate: float | None, spt: float, cap: float) -> float:
        """Seconds per prefill MU on a replica whose (pooled) learned rate is ``rate`` tokens/s and MU rate
        ``cap`` (``spt``: the request's MU per prompt token); 0 when the MU rate applies as it is."""
        if not rate or spt <= 0:
            return 0.0
        if self.relative:
            med = self.pool.median if self.pool is not None else None
            return med / (rate * cap) if med else 0.0
        return 1.0 / (spt * rate)

    def reprefill_s(self, request: RequestInfo, replica: ReplicaSnapshot, tokens: float) -> float:
        """Seconds of prefill that ``tokens`` cached prompt tokens save on ``replica``, as this estimate reads
        its rate (configured, else its pooled learned rate on the estimate's scale, else the MU rate): the
        work a move of that context to (or from) it adds. The pool is the one of the last pick."""
        inp = request.input_tokens
        if tokens <= 0 or inp <= 0:
            return 0.0
        full = self.prefill_mu(request)
        save = full * (1.0 - self.cache_discount) / inp * (tokens if tokens < inp else inp)
        cap = replica.capacity_mu_per_min / 60.0
        if cap <= 0.0:
            cap = 1e-9
        if self.prefill_tps:
            return self.prefill_s(request, save, cap)
        spm = self.sec_per_mu(self.learned_rate(replica), full / inp, cap)
        return save * spm if spm else save / cap

    def prefill_s(self, request: RequestInfo, pre_mu: float, cap: float, tps: float | None = None) -> float:
        """Seconds of prefill for ``pre_mu`` (engine rate ``tps`` or the configured one, else the MU rate)."""
        if tps is None:
            tps = self.prefill_tps
        full = self.prefill_mu(request)
        inp = request.input_tokens
        if tps and full > 0 and inp > 0:
            return pre_mu * inp / (full * tps)
        return pre_mu / cap

    def depths(self, request: RequestInfo) -> tuple[dict[str, int] | None, AbstractSet[str]]:
        """Expected cached blocks per replica holding some of the prompt, and the deepest holders."""
        hashes = request.prefix_hashes
        if hashes and self.index is not None:
            return self.index.match(hashes)
        return None, frozenset()

    def estimates(
        self, request: RequestInfo, candidates: list[ReplicaSnapshot], now: float
    ) -> tuple[list[float], list[float], dict[str, int] | None]:
        """Per candidate: estimated TTFT (s) and this request's prefill MU there; plus the cache depths."""
        depths, _ = self.depths(request)
        inp = request.input_tokens
        full = self.prefill_mu(request)
        save_per_token = full * (1.0 - self.cache_discount) / inp if inp > 0 else 0.0
        bt = request.prefix_block_tokens
        spt = full / inp if inp > 0 else 0.0
        reps = self.loads.reps
        busy = self._busy
        pool = self.pool
        if pool is not None:
            pool.update(candidates)
        out_t: list[float] = []
        out_pre: list[float] = []
        for r in candidates:
            cap = r.capacity_mu_per_min / 60.0
            if cap <= 0.0:
                cap = 1e-9
            if r.learned_prefill_tokens_per_s:
                self.learned_seen = True
            if self.prefill_tps:
                sec_per_mu = 1.0 / (spt * self.prefill_tps) if spt > 0 else 0.0
            else:
                sec_per_mu = self.sec_per_mu(self.learned_rate(r), spt, cap)
            st = reps.get(r.name)
            wait = 0.0 if st is None else (st[1] - now if st[1] > now else 0.0)
            wait = self._engine_queue_wait(r, wait, sec_per_mu, cap)
            pre = full
            if depths:
                d = depths.get(r.name, 0)
                if d:
                    cached = d * bt
                    pre -= save_per_token * (cached if cached < inp else inp)
            t = wait + (pre * sec_per_mu if sec_per_mu else pre / cap)
            pen = busy.get(r.name)
            if pen is not None:
                t += pen
            out_t.append(t)
            out_pre.append(pre)
        return out_t, out_pre, depths

    def _engine_queue_wait(self, r: ReplicaSnapshot, wait: float, sec_per_mu: float, cap: float) -> float:
        w = r.engine_waiting if self.engine_queue else 0
        if w and r.inflight_requests > 0 and (r.engine_kv_usage or 0.0) >= self.engine_queue_kv:
            # Requests the engine has not started (queued or memory-bound): the replica may be far slower
            # than the fluid model believes (KV thrashing), so trust the larger estimate.
            ww = w * r.inflight_mu / r.inflight_requests * (sec_per_mu or 1.0 / cap)
            if ww > wait:
                return ww
        return wait

    def score(self, request: RequestInfo, candidates: list[ReplicaSnapshot], ctx: PickContext) -> list[float]:
        """Lower estimated TTFT scores higher (a plain pipeline scorer)."""
        times, pres, _ = self.estimates(request, candidates, ctx.now)
        self._memo_all = (request, {r.name: (p, r) for r, p in zip(candidates, pres, strict=True)})
        return lower_is_better(times)

    def remember(self, request: RequestInfo, replica: ReplicaSnapshot, pre_mu: float) -> None:
        """Record the pick (its prefill MU given the cache) for the ``on_dispatch`` that follows."""
        cap = replica.capacity_mu_per_min / 60.0
        if cap <= 0.0:
            cap = 1e-9
        if self.relative:
            full = self.prefill_mu(request)
            spt = full / request.input_tokens if request.input_tokens > 0 else 0.0
            spm = self.sec_per_mu(self.learned_rate(replica), spt, cap)
            pre_s = pre_mu * spm if spm else pre_mu / cap
        else:
            tps = self.prefill_tps or self.learned_rate(replica)
            pre_s = self.prefill_s(request, pre_mu, cap, tps)
        self.memo = (request, replica.name, pre_mu, cap, pre_s)

    def learned_rate(self, replica: ReplicaSnapshot) -> float | None:
        """The learned prefill rate the estimate uses for ``replica`` (pooled per ``learned_rate_noise``; the
        pool is the one of the last ``estimates`` / pick)."""
        own = replica.learned_prefill_tokens_per_s
        return own if self.pool is None else self.pool.rate(own)

    def backlog_s(self, replicas: Sequence[ReplicaSnapshot], now: float) -> float:
        """Seconds until the least-loaded of the ``replicas`` that may take a request has drained the prefill
        queued on it (0 for a replica with nothing in flight, so a too-slow rate never holds a request while a
        replica idles); ``inf`` for no such replica.

        "May take a request" is ``filters.routable``'s snapshot rule (healthy or suspect, not draining, not
        ejected), checked inline: the gate asks at every arrival, and one pass that stops at the first replica
        that is idle or has drained its queue (the answer is then 0) costs a fraction of filtering the list
        first and scanning it whole (128 replicas in ``bench/sim_speed.py``).
        The outlier detector's verdict is the caller's (``FleetgatePolicy.backlog_s``)."""
        reps = self.loads.reps
        best = math.inf
        for r in replicas:
            h = r.health
            if (h is not _HEALTHY and h is not _SUSPECT) or r.draining or r.ejected_until_s > now:
                continue
            if r.inflight_requests == 0:
                return 0.0  # nothing in flight there: idle, whatever the estimate says
            st = reps.get(r.name)
            if st is None:
                return 0.0  # no queue known there
            left = st[1] - now
            if left <= 0.0:
                return 0.0  # its queue has drained: nothing below 0 follows
            if left < best:
                best = left
        return best

    def gate_prefill_s(self, request: RequestInfo) -> float:
        """The request's prefill seconds on the replica expected to hold most of its prompt."""
        inp = request.input_tokens
        cached = 0
        depths, _ = self.depths(request)
        if depths:
            cached = min(max(depths.values()) * request.prefix_block_tokens, inp)
        full = self.prefill_mu(request)
        pre = full - (full * (1.0 - self.cache_discount) / inp * cached if inp > 0 else 0.0)
        return self.prefill_s(request, pre, self.cap_rate)

    # -- hooks ---------------------------------------------------------------------------------------

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> float:
        """Feed the expected cache, the fluid queue and the in-flight counts; returns the request's expected
        settled MU on ``replica``: its estimate less the prefill its expected cache hit saves (what the load
        signal charges)."""
        full = self.prefill_mu(request)
        if request.prefix_hashes:
            if self.index is None:
                blocks = max(1, self.cache_tokens_per_replica // max(request.prefix_block_tokens, 1))
                self.index = PrefixIndex(blocks)
            self.index.insert(replica, request.prefix_hashes)
        memo = self.memo
        if memo[0] is request and memo[1] == replica:
            pre, cap, pre_s = memo[2], memo[3], memo[4]
        else:
            held = self._memo_all[1].get(replica) if self._memo_all[0] is request else None
            if held is not None:
                self.remember(request, held[1], held[0])
                pre, cap, pre_s = self.memo[2], self.memo[3], self.memo[4]
            else:
                pre, cap = full, self.cap_rate
                pre_s = self.prefill_s(request, full, cap)
        self.cap_rate = cap
        self.loads.queue(replica, pre_s, now)
        rid = request.request_id
        if rid:
            if len(self._kv_of) > 100_000:  # outcomes that never came back: forget them
                self._kv_of.clear()
                self._kv.clear()
                self._busy.clear()
                self._expect.clear()
            out = request.estimated_output_tokens or request.max_output_tokens or self.default_output
            tokens = request.input_tokens + 0.5 * min(out, 4 * self.default_output)
            if rid in self._kv_of:  # a retry without an outcome for the first attempt (``_expect``'s keys
                self.release(rid)  # are a subset)
            kv = self._kv.get(replica)
            if kv is None:
                kv = self._kv[replica] = [0.0, 0.0]
            kv[0] += 1.0
            kv[1] += tokens
            self._kv_of[rid] = (replica, tokens)
            fb = self._feedback  # (``feedback`` written out: once per dispatch)
            if (self.prefill_tps is not None or self.learned_seen) if fb is None else fb:
                self._expect[rid] = (replica, self.loads.reps[replica][1], self._shift.get(replica, 0.0))
            self._update_busy(replica, kv[0])
        return request.cost_mu - full + pre if request.cost_mu > 0 else pre + self.gamma

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
        self.release(request.request_id)

    def release(self, request_id: str) -> None:
        """Take a request out of its replica's in-flight count (completed, failed or re-dispatched)."""
        self._expect.pop(request_id, None)
        held = self._kv_of.pop(request_id, None)
        if held is not None:
            kv = self._kv.get(held[0])
            if kv is not None:  # (``max(..., 0.0)`` as branches: once per request)
                left = kv[0] - 1.0
                kv[0] = 0.0 if left < 0.0 else left
                left = kv[1] - held[1]
                kv[1] = 0.0 if left < 0.0 else left
                self._update_busy(held[0], kv[0])

    def _update_busy(self, replica: str, inflight: float) -> None:
        """Keep ``_busy`` (the slot-wait penalty of replicas near their sequence-slot limit) current."""
        start = self.slot_from
        if start and self.slot_wait_s > 0 and inflight >= start:
            self._busy[replica] = (inflight + 1 - start) * self.slot_wait_s
        else:
            self._busy.pop(replica, None)

    def inflight(self, replica: str) -> int:
        """Requests dispatched to ``replica`` through this estimate that have not completed yet."""
        kv = self._kv.get(replica)
        return 0 if kv is None else int(kv[0])
