"""Engine rates learned online: each replica's prefill throughput and decode time (sans-IO).

The router's TTFT estimate and the dispatch gate need how fast a replica prefills (prompt tokens per
second) and how long a decode step takes. Nobody should have to configure that: the gateway sees it.
Two kinds of evidence, both per replica:

* **request timing** (lifecycle events ``on_dispatch`` / ``on_first_token`` / ``on_complete`` with the
  engine's ``usage``): a streamed request that ran *alone* on its replica (nothing else in flight there
  from dispatch to first token) prefilled ``prompt_tokens - cached_tokens`` tokens in its time to first
  token; the slope of that time against the tokens is the prefill rate (the intercept soaks up network,
  parsing and scheduling overhead). Every streamed request gives the time per output token after the first.
  A non-streamed request that ran alone counts once the decode time is known (its latency minus its decode).
* **the engine's own counters** (``on_counters``, from the /metrics scraper): llama.cpp's
  ``prompt_seconds_total`` / ``prompt_tokens_total``, vLLM's prefill-time histogram sum over the prompt
  tokens it computed, and the decode equivalents. An engine sums those times per request, so two prompts
  prefilled in one batch count the batch twice: an interval is used only when this gateway had at most one
  request in flight on the replica throughout.

With ``busy=True`` (``BusyRateLearner``, opt-in: ``rate_learning: busy`` in the fleetgate policy's params)
request timing also learns from replicas that are never idle, reading the scraped queue gauges
(``on_engine_load``) to tell a wait for admission from prefill work: see ``BusyRateLearner``.

Estimates are exponentially forgetting sums (``forget`` per observation, not per second, so an idle replica
keeps what was learned). The engine's counters win over request timing when both are known. The **drift**
of the deployment's cost profile is the learned seconds per prefill token over the profile's (alpha in
replica seconds): 1.0 when the profile matches the engine; an alert is raised once when it stayed outside
``1 +- drift_alert`` for ``drift_alert_after`` updates in a row (a change of engine speed moves the fit
through transient values), and again only after it came back. Time is passed in; nothing here reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from fleetgate.core.types import RequestInfo, Usage
from fleetgate.core.units import CostProfile

#: Scrape intervals with prefill work before the engine's counters are trusted (each sums many requests).
_MIN_COUNTER_INTERVALS = 2
#: Below this coefficient of variation of the prompt sizes the slope is ill-conditioned: use the ratio.
_MIN_SPREAD = 0.2
_INF = math.inf
#: Completions kept per replica between first tokens (``BusyRateLearner``)
_MAX_RECENT = 256


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """Cumulative counters from one scrape of an engine's /metrics (``None`` where it has none)."""

    prefill_tokens: float | None = None
    prefill_seconds: float | None = None
    decode_tokens: float | None = None
    decode_seconds: float | None = None


class LearnedRates(NamedTuple):
    """What is known about one replica; ``None`` until enough observations. (Immutable; a named tuple, not a
    frozen dataclass: one is built per completed request, and a tuple builds several times faster.)"""

    prefill_tokens_per_s: float | None = None
    decode_s_per_token: float | None = None
    prefill_source: str = ""  # "counters" | "timing" | ""
    prefill_samples: int = 0
    decode_samples: int = 0
    timing_prefill_tokens_per_s: float | None = None
    counter_prefill_tokens_per_s: float | None = None
    drift: float | None = None

    def as_dict(self) -> dict[str, float | int | str | None]:
        return {
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "decode_s_per_token": self.decode_s_per_token,
            "prefill_source": self.prefill_source,
            "prefill_samples": self.prefill_samples,
            "decode_samples": self.decode_samples,
            "timing_prefill_tokens_per_s": self.timing_prefill_tokens_per_s,
            "counter_prefill_tokens_per_s": self.counter_prefill_tokens_per_s,
            "profile_drift": self.drift,
        }


@dataclass(frozen=True, slots=True)
class DriftAlert:
    """The profile's seconds per prefill token is off by more than the threshold on ``replica``."""

    replica: str
    drift: float
    learned_tokens_per_s: float
    profile_tokens_per_s: float


_NOTHING = LearnedRates()
_new_rates = tuple.__new__


class _Fit:
    """Forgetting least squares of ``y`` on ``x`` (with intercept), plus the ratio ``sum y / sum x``."""

    __slots__ = ("n", "sw", "sx", "sxx", "sxy", "sy")

    def __init__(self) -> None:
        self.n = 0
        self.sw = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def add(self, x: float, y: float, forget: float) -> None:
        f = forget
        self.n += 1
        self.sw = self.sw * f + 1.0
        self.sx = self.sx * f + x
        self.sy = self.sy * f + y
        self.sxx = self.sxx * f + x * x
        self.sxy = self.sxy * f + x * y

    def ratio(self) -> float | None:
        """``sum y / sum x`` (seconds per token through the origin)."""
        return self.sy / self.sx if self.sx > 0 and self.sy > 0 else None

    def regression(self) -> float | None:
        """Seconds per token from the regression, when the x values spread enough (``None`` otherwise): the
        intercept takes the fixed overhead, so this is the engine's own rate."""
        if self.n >= 3:
            mx = self.sx / self.sw
            var = self.sxx / self.sw - mx * mx
            if mx > 0 and var > (_MIN_SPREAD * mx) ** 2:
                b = (self.sxy / self.sw - mx * (self.sy / self.sw)) / var
                if b > 0 and self.sy / self.sw - b * mx >= 0:  # a negative intercept: noise, not overhead
                    return b
        return None

    def slope(self) -> float | None:
        """Seconds per token from the regression when the x values spread enough, else the ratio."""
        b = self.regression()
        return b if b is not None else self.ratio()


#: ``LearnedRates``' prefill fields (see ``EngineRateLearner._prefill_part``)
_PrefillPart = tuple[float | None, str, int, float | None, float | None, float | None]


@dataclass(slots=True)
class _Pending:
    replica: str
    dispatched_s: float
    alone: bool
    epoch: int
    first_token_s: float | None = None
    alone_at_first_token: bool = False
    ahead: int = 0  # (``BusyRateLearner``) requests in flight on the replica when this one was dispatched
    done_before: int = 0  # (``BusyRateLearner``) completions on the replica before this one's dispatch


@dataclass(slots=True)
class _Replica:
    inflight: int = 0
    epoch: int = 0  # dispatches so far: a change means something else was sent here meanwhile
    busiest_since_scrape: int = 0
    prefill_timing: _Fit = field(default_factory=_Fit)
    prefill_counters: _Fit = field(default_factory=_Fit)
    decode_timing: _Fit = field(default_factory=_Fit)
    decode_counters: _Fit = field(default_factory=_Fit)
    last_counters: EngineCounters | None = None
    off_streak: int = 0  # consecutive updates with the drift beyond the threshold
    last_first_token_s: float = -_INF  # (``BusyRateLearner``) the latest first token seen here
    #: (``BusyRateLearner``) completions since the latest first token: (time, the engine then had requests
    #: waiting for admission, or nobody knew)
    recent_completions: list[tuple[float, bool]] = field(default_factory=list)
    completions: int = 0  # (``BusyRateLearner``) completions so far
    completions_at_first_token: int = 0  # (``BusyRateLearner``) ``completions`` at the latest first token
    #: (``BusyRateLearner``) the latest scrape's count of requests the engine had not admitted (None: unknown)
    engine_waiting: float | None = None
    waits_for_slots: bool = False  # (``BusyRateLearner``) the engine's waiting requests wait for a slot only
    slots: int = 0  # (``BusyRateLearner``) sequence slots: what it ran while requests waited (0: not seen)
    alerted: bool = False
    #: (prefill_timing.n, prefill_counters.n, profile, ``_prefill_part``) of the last computation
    prefill_held: tuple[int, int, CostProfile | None, _PrefillPart] = (
        -1,
        -1,
        None,
        (None, "", 0, None, None, None),
    )


class EngineRateLearner:
    """Learns, per replica of one deployment, prefill tokens per second and decode seconds per token.

    A lifecycle observer (``on_dispatch``, ``on_first_token``, ``on_complete``) plus ``on_counters`` for
    the scraper; ``rates(replica)`` reads the estimate, ``take_alerts()`` the drift alerts raised since the
    last call. ``profile`` is the deployment's cost profile (the drift reference).
    """

    def __init__(
        self,
        profile: CostProfile | None = None,
        *,
        forget: float = 0.97,
        min_samples: int = 3,
        drift_alert: float = 0.2,
        drift_alert_after: int = 8,
        max_pending: int = 100_000,
    ) -> None:
        if not 0.0 < forget <= 1.0:
            raise ValueError("forget must be in (0, 1]")
        if min_samples < 1 or drift_alert <= 0:
            raise ValueError("need min_samples >= 1 and drift_alert > 0")
        self.profile = profile
        self.forget = forget
        self.min_samples = min_samples
        self.drift_alert = drift_alert
        self.drift_alert_after = drift_alert_after
        self.max_pending = max_pending
        self._replicas: dict[str, _Replica] = {}
        self._pending: dict[str, _Pending] = {}
        self._alerts: list[DriftAlert] = []
        #: the latest estimate per replica, recomputed when evidence arrives (the router reads it per pick)
        self.current: dict[str, LearnedRates] = {}
        self._ref_profile: CostProfile | None = None  # the profile ``_ref`` was computed from
        self._ref: float | None = None if profile is None else self.profile_prefill_s_per_token()
        self._ref_profile = profile

    def _rep(self, name: str) -> _Replica:
        rep = self._replicas.get(name)
        if rep is None:
            rep = self._replicas[name] = _Replica()
        return rep

    # -- lifecycle observer ---------------------------------------------------------------------------

    # (These three run for every request, in the gateway and the simulator: lookups and arithmetic are
    # written out rather than spread over helper calls.)

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        rep = self._replicas.get(replica) or self._rep(replica)
        alone = rep.inflight == 0
        rep.inflight += 1
        rep.epoch += 1
        if rep.inflight > rep.busiest_since_scrape:
            rep.busiest_since_scrape = rep.inflight
        pending = self._pending
        if len(pending) >= self.max_pending:  # lost completions must not grow this without bound
            pending.pop(next(iter(pending)))
        pending[request.request_id] = _Pending(replica, now, alone, rep.epoch)

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        p = self._pending.get(request.request_id)
        if p is None or p.replica != replica or p.first_token_s is not None:
            return
        p.first_token_s = now
        if p.alone:
            rep = self._replicas.get(replica) or self._rep(replica)
            p.alone_at_first_token = rep.epoch == p.epoch
        else:
            p.alone_at_first_token = False

    def on_complete(
        self, request: RequestInfo, replica: str, now: float, usage: Usage | None, cost_mu: float, ok: bool
    ) -> None:
        p = self._pending.get(request.request_id)
        if p is None or p.replica != replica:
            return
        del self._pending[request.request_id]
        rep = self._replicas.get(replica) or self._rep(replica)
        rep.inflight = rep.inflight - 1 if rep.inflight > 1 else 0
        if not ok or usage is None or usage.completion_tokens < 1:
            return
        prefilled = usage.prompt_tokens - usage.cached_tokens
        if prefilled < 0:
            prefilled = 0
        f = self.forget
        first = p.first_token_s
        if first is not None:
            if p.alone_at_first_token and prefilled > 0:
                rep.prefill_timing.add(prefilled, max(first - p.dispatched_s, 0.0), f)
            tokens = usage.completion_tokens
            if tokens >= 2 and now > first:  # (``decode_timing.add`` written out: nearly every completion)
                x = tokens - 1
                y = now - first
                fit = rep.decode_timing
                fit.n += 1
                fit.sw = fit.sw * f + 1.0
                fit.sx = fit.sx * f + x
                fit.sy = fit.sy * f + y
                fit.sxx = fit.sxx * f + x * x
                fit.sxy = fit.sxy * f + x * y
        elif p.alone and rep.epoch == p.epoch and prefilled > 0:
            decode = self._decode_s(rep)
            if decode is not None:  # a solo non-streamed request: latency minus its decode is its prefill
                prefill_s = now - p.dispatched_s - decode * (usage.completion_tokens - 1)
                if prefill_s > 0:
                    rep.prefill_timing.add(prefilled, prefill_s, f)
        self._updated(replica, rep)

    # -- the engine's own counters --------------------------------------------------------------------

    def on_counters(self, replica: str, now: float, counters: EngineCounters | None) -> None:
        """A scrape of ``replica``'s /metrics (``None``: the scrape failed; the next one starts afresh)."""
        rep = self._rep(replica)
        previous, rep.last_counters = rep.last_counters, counters
        quiet = rep.busiest_since_scrape <= 1
        rep.busiest_since_scrape = rep.inflight
        if previous is None or counters is None:
            return
        f = self.forget
        dt = _delta(previous.prefill_tokens, counters.prefill_tokens)
        ds = _delta(previous.prefill_seconds, counters.prefill_seconds)
        if quiet and dt is not None and ds is not None and dt > 0 and ds > 0:
            rep.prefill_counters.add(dt, ds, f)
        dt = _delta(previous.decode_tokens, counters.decode_tokens)
        ds = _delta(previous.decode_seconds, counters.decode_seconds)
        if dt is not None and ds is not None and dt > 0 and ds > 0:
            rep.decode_counters.add(dt, ds, f)
        self._updated(replica, rep)

    def on_engine_load(
        self, replica: str, now: float, waiting: float | None, running: float | None, waits_for_slots: bool
    ) -> None:
        """The engine's queue gauges from a scrape of ``replica`` (requests it had not admitted, requests it
        ran; ``None``: not reported or the scrape failed). ``waits_for_slots``: its dialect admits a waiting
        request whenever a running one finishes (llama.cpp's slots). Only ``BusyRateLearner`` reads them."""

    # -- reading --------------------------------------------------------------------------------------

    def _decode_s(self, rep: _Replica) -> float | None:
        if rep.decode_counters.n >= _MIN_COUNTER_INTERVALS:
            return rep.decode_counters.ratio()
        if rep.decode_timing.n >= self.min_samples:
            return rep.decode_timing.ratio()
        return None

    def rates(self, replica: str) -> LearnedRates:
        """The latest estimate for ``replica`` (all ``None`` before any evidence)."""
        return self.current.get(replica, _NOTHING)

    def _prefill_part(self, timing_fit: _Fit, counter_fit: _Fit) -> _PrefillPart:
        """``LearnedRates``' prefill fields: (tokens/s, source, samples, timing tokens/s, counter tokens/s,
        drift)."""
        min_samples = self.min_samples
        regression = timing = None
        if timing_fit.n >= min_samples:
            regression = timing_fit.regression()
            timing = regression if regression is not None else timing_fit.ratio()
        counters = None
        if counter_fit.n >= _MIN_COUNTER_INTERVALS:
            sx, sy = counter_fit.sx, counter_fit.sy
            counters = sy / sx if sx > 0 and sy > 0 else None
            prefill_s, source = counters, "counters"
        elif timing_fit.n >= min_samples:
            prefill_s, source = timing, "timing"
        else:
            prefill_s, source = None, ""
        # The drift compares prefill work alone with the profile's: from the engine's counters or a regression
        # whose intercept took the overhead. The ratio of equal-sized prompts' times to first token holds the
        # fixed per-request overhead too (a slowed engine's whole first step: "+9714%" against a profile that
        # was right), so it gives no drift.
        drift = None
        judged = counters if source == "counters" else regression
        if judged is not None and judged > 0:
            ref = self._reference()
            if ref is not None:
                drift = judged / ref
        return (
            1.0 / prefill_s if prefill_s is not None and 0 < prefill_s < _INF else None,
            source if prefill_s else "",
            counter_fit.n if source == "counters" else timing_fit.n,
            1.0 / timing if timing is not None and 0 < timing < _INF else None,
            1.0 / counters if counters is not None and 0 < counters < _INF else None,
            drift,
        )

    def _reference(self) -> float | None:
        """``profile_prefill_s_per_token``, computed once per profile."""
        profile = self.profile
        if profile is not self._ref_profile:
            self._ref_profile = profile
            self._ref = self.profile_prefill_s_per_token()
        return self._ref

    def profile_prefill_s_per_token(self) -> float | None:
        """Seconds per prefilled token the cost profile implies (alpha in replica seconds)."""
        p = self.profile
        if p is None or p.alpha <= 0:
            return None
        return p.replica_seconds(p.alpha)

    def _updated(self, name: str, rep: _Replica) -> None:
        """Recompute ``current[name]`` from the replica's fits; raise a drift alert when one is due."""
        # (the counters' ratio, ``_decode_s``, ``_Fit.ratio``, the inverses and the drift written out: this
        # runs once per completed request; same arithmetic)
        timing_fit, counter_fit = rep.prefill_timing, rep.prefill_counters
        # The prefill half changes only with a prefill sample (most completions bring a decode sample only):
        # kept from the last computation while both prefill fits and the profile are as they were.
        held = rep.prefill_held
        if held[0] == timing_fit.n and held[1] == counter_fit.n and held[2] is self.profile:
            prefill = held[3]
        else:
            prefill = self._prefill_part(timing_fit, counter_fit)
            rep.prefill_held = (timing_fit.n, counter_fit.n, self.profile, prefill)
        decode: float | None = None
        counted = rep.decode_counters
        timed = rep.decode_timing
        if counted.n >= _MIN_COUNTER_INTERVALS or timed.n >= self.min_samples:
            fit = counted if counted.n >= _MIN_COUNTER_INTERVALS else timed
            decode = fit.sy / fit.sx if fit.sx > 0 and fit.sy > 0 else None
        # (``LearnedRates(...)`` without the named tuple's Python ``__new__``; the samples ``max(...)``)
        tokens_per_s, p1, p2, p3, p4, drift = prefill
        self.current[name] = _new_rates(
            LearnedRates,
            (tokens_per_s, decode, p1, p2, counted.n if counted.n >= timed.n else timed.n, p3, p4, drift),
        )
        if drift is None or tokens_per_s is None:
            return
        if abs(drift - 1.0) <= self.drift_alert:
            rep.off_streak = 0
            rep.alerted = False
            return
        rep.off_streak += 1
        if rep.off_streak >= self.drift_alert_after and not rep.alerted:
            ref = self.profile_prefill_s_per_token()
            assert ref is not None
            self._alerts.append(DriftAlert(name, drift, tokens_per_s, 1.0 / ref))
            rep.alerted = True

    def take_alerts(self) -> list[DriftAlert]:
        """Drift alerts raised since the last call (each once per excursion beyond the threshold)."""
        out, self._alerts = self._alerts, []
        return out

    def replicas(self) -> list[str]:
        return list(self._replicas)

    def forget_replica(self, replica: str) -> None:
        """A replica left (or was replaced): drop what was learned about it."""
        self._replicas.pop(replica, None)
        self.current.pop(replica, None)
        for rid in [rid for rid, p in self._pending.items() if p.replica == replica]:
            del self._pending[rid]


def _delta(old: float | None, new: float | None) -> float | None:
    if old is None or new is None or new < old:  # a counter that went back: the engine restarted
        return None
    return new - old


class BusyRateLearner(EngineRateLearner):
    """``EngineRateLearner`` whose request timing also learns from replicas that are never idle.

    Prefills on an engine run one after another in arrival order (vLLM's chunked prefill gives each step's
    token budget to the earliest unfinished prompts; the simulated engine does the same), so a replica's
    first tokens follow the queue's recursion ``first_i = max(dispatched_i, first_(i-1)) + service_i``: a
    request's own prefill time is its first token less the later of its dispatch and the previous first
    token on that replica. That service time against its uncached prompt tokens is the same regression as a
    solo request's (a solo request is the case ``dispatched_i > first_(i-1)``), so a streamed request on a
    busy replica is a sample too; the intercept is the per-request overhead that does not overlap with other
    prefills (the first decode step, the network on the gaps).

    A request may also have waited to be admitted at all, and it is admitted when a running one finishes.
    What the engine's scraped queue gauges say (``on_engine_load``) decides what such a completion means:

    * **the engine reported no request waiting** (at the latest scrape before the completion): the
      completion admitted nobody; the interval is a sample whatever finished in it. (Dropping every
      interval with a completion selects the short ones where service times vary for one prompt size:
      llama-server's 4 slots read 1.2-2.5x high that way, docs/benchmarks.md, session 8.)
    * **requests waited, for a sequence slot only** (a dialect whose waiting requests wait for nothing else:
      llama.cpp gives each slot its share of the context up front): slots admit first come, first served, so
      with ``S`` slots (what the engine ran while requests waited) and ``A`` requests ahead of this one at the
      start of its interval, it was admitted at the ``(A - S + 1)``-th completion after that start (at the
      start when ``A < S``); its service runs from there.
    * **requests waited for anything else, or nothing is known** (KV memory, vLLM's and the simulated
      engine's case; no scrape yet): an interval in which another request finished is not a sample, as the
      waiting one may have been admitted by the memory that one freed after several completions (agentic
      contexts in the simulator read 0.13-0.36x without this rule).

    Where prefills share steps the busy time is still split exactly over the requests, not by each one's own
    work. Under load the steps also carry the running requests' decodes, so the rate is the replica's prefill
    rate under that load, which is what a queue ahead of a new request drains at. A request without a first
    token (not streamed) is not a sample, and on a busy replica its prefill counts toward the next streamed
    request's service time.
    """

    def on_engine_load(
        self, replica: str, now: float, waiting: float | None, running: float | None, waits_for_slots: bool
    ) -> None:
        rep = self._rep(replica)
        rep.engine_waiting = waiting
        rep.waits_for_slots = waits_for_slots
        if waits_for_slots and waiting and running is not None and running > rep.slots:
            rep.slots = int(running)  # requests waited while it ran these: all its slots were taken

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        rep = self._replicas.get(replica) or self._rep(replica)
        ahead = rep.inflight
        super().on_dispatch(request, replica, now)
        p = self._pending[request.request_id]
        p.ahead = ahead
        p.done_before = rep.completions

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        p = self._pending.get(request.request_id)
        if p is None or p.replica != replica or p.first_token_s is not None:
            return
        p.first_token_s = now
        rep = self._replicas.get(replica) or self._rep(replica)
        start = p.dispatched_s
        ahead = p.ahead
        if rep.last_first_token_s > start:  # its prefill started when the one before it ended
            start = rep.last_first_token_s
            ahead -= rep.completions_at_first_token - p.done_before  # those finished by then
        rep.last_first_token_s = now
        rep.completions_at_first_token = rep.completions
        recent = rep.recent_completions
        sample = True
        if rep.waits_for_slots and rep.slots:
            admitted_after = ahead - rep.slots + 1  # completions it waited for, from ``start`` on
            if admitted_after > 0:
                later = [t for t, _ in recent if t > start]
                if len(later) >= admitted_after:
                    start = later[admitted_after - 1]
                else:  # the gateway's view and the engine's disagree (another client): no sample
                    sample = False
        else:
            for t, admitting in recent:
                if admitting and t > start:
                    sample = False
                    break
        recent.clear()
        p.dispatched_s = start
        # (``on_complete``: a sample, first token less ``dispatched_s``)
        p.alone_at_first_token = sample

    def on_complete(
        self, request: RequestInfo, replica: str, now: float, usage: Usage | None, cost_mu: float, ok: bool
    ) -> None:
        super().on_complete(request, replica, now, usage, cost_mu, ok)
        rep = self._replicas.get(replica)
        if rep is not None:
            rep.completions += 1
            waiting = rep.engine_waiting
            recent = rep.recent_completions
            recent.append((now, waiting is None or waiting > 0))
            if len(recent) > _MAX_RECENT:  # a replica serving no streamed request: keep the latest
                del recent[: _MAX_RECENT // 2]


def engine_rate_learner(profile: CostProfile | None = None, *, busy: bool = False) -> EngineRateLearner:
    """The learner for a deployment: ``busy`` (the routing policy's ``learns_rates_busy``) also learns from
    replicas that are never idle (``BusyRateLearner``)."""
    return BusyRateLearner(profile) if busy else EngineRateLearner(profile)
