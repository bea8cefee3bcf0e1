"""Latency headroom: best-effort work is admitted only while reserved traffic keeps its measured latency.

The MU meters say whether a deployment has *capacity* left; they cannot see that a replica whose batch is
full of best-effort decodes serves a reserved tenant's prompt more slowly (every decode step is longer).
``LatencyHeadroom`` measures that directly, from the gateway's own observations of each request (a
lifecycle observer: first-token and completion times, never engine or simulator internals), and turns it
into one number the admission core enforces: how many best-effort requests may be in flight on the
deployment (``best_effort_limit``; ``None``: no limit).

Signals, per tenant class (``reserved``: every class but best-effort; ``best_effort``)
    TTFT: first content chunk minus arrival (streamed), or the whole response (not streamed: the time to
    its first byte). OTPS: output tokens after the first divided by the time after the first, one sample
    per stream of at least ``otps_min_tokens`` (16) tokens (the rate of a 3-token stream is the relay's
    jitter, not the engine's decode rate).

Targets
    Reserved: TTFT p95 and OTPS p10 within ``tolerance`` (10 %) of what reserved requests get *solo*,
    learned online from the samples of requests during which no best-effort request was on the engines
    (``baseline``), unless the config gives absolute targets. Best-effort: absolute targets when configured
    (none by default: best-effort promises no latency); they are measured and reported, not enforced.

Headroom
    In units of the tolerance: ``(target - observed) / (tolerance * reference)`` for TTFT (``reference``:
    the solo baseline, or the absolute target), the mirror for OTPS. 1 means "as fast as solo", 0 "at the
    target", negative "beyond it". The ledger reports it for p95 TTFT / p10 OTPS over the recent samples;
    the controller uses a steadier statistic of the samples since its last change (p75 TTFT, p25 OTPS;
    p90 / p10 once 20 samples are in).

Controller (an AIMD limit with a dead band, so admission does not oscillate)
    While no reserved request has been on the deployment for ``active_s``: no limit (best-effort gets the
    whole idle fleet, as far as the MU meters allow). While reserved traffic is active: the limit starts
    at 0 until ``min_samples`` solo samples give a baseline, then, each time ``min_samples`` reserved
    samples arrived since the last change: headroom < ``close_headroom`` on either signal -> halve it;
    headroom >= ``open_headroom`` on both (each with its samples) and the limit binds -> grow it by a
    quarter (at least 1); in between -> keep it. Only samples
    of requests that arrived after a change judge it, so one slow burst is not counted twice.

Pure: time comes in with every event; per reserved sample a bisect into two sorted windows and a verdict
of table lookups (quantile indices precomputed per window length), no sorting.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fleetgate.core.types import Priority, RequestInfo, Usage

RESERVED = "reserved"
BEST_EFFORT = "best_effort"
_INF = math.inf


@dataclass(frozen=True, slots=True)
class ClassTargets:
    """Latency targets of one tenant class; ``None``: learned (reserved) or none (best-effort)."""

    ttft_p95_s: float | None = None
    otps_p10: float | None = None


@dataclass(frozen=True, slots=True)
class HeadroomParams:
    """Knobs of ``LatencyHeadroom`` (config: ``admission.latency_headroom``)."""

    enabled: bool = True
    reserved: ClassTargets = field(default_factory=ClassTargets)
    best_effort: ClassTargets = field(default_factory=ClassTargets)
    tolerance: float = 0.10
    open_headroom: float = 0.5
    close_headroom: float = 0.2
    min_samples: int = 8
    baseline_samples: int = 200
    window_samples: int = 200
    active_s: float = 5.0
    otps_min_tokens: int = 16
    max_limit: int = 100_000


def _rank(q: float, n: int) -> int:
    """Index of the nearest-rank ``q`` quantile in a sorted list of ``n`` values."""
    return max(0, min(n - 1, math.ceil(q * n) - 1))


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile of a non-empty list (sorted here)."""
    xs = sorted(values)
    return xs[_rank(q, len(xs))]


class SortedWindow:
    """The last ``maxlen`` samples, also kept sorted: ``quantile`` is an index, not a sort of the window.

    The controller asks for quantiles of the baseline and of the samples since its last change at every
    reserved sample (twice per streamed request); sorting a 200-sample window each time cost more than the
    rest of the request's way through the gateway. Same answers as ``quantile(list(window), q)``.
    """

    __slots__ = ("items", "maxlen", "ordered")

    def __init__(self, maxlen: int) -> None:
        self.items: deque[float] = deque(maxlen=maxlen)
        self.ordered: list[float] = []
        self.maxlen = maxlen

    def append(self, value: float) -> None:
        items = self.items
        if len(items) == self.maxlen:  # the deque drops its oldest value on append
            if not self.maxlen:
                return
            del self.ordered[bisect_left(self.ordered, items[0])]
        items.append(value)
        insort(self.ordered, value)

    def clear(self) -> None:
        self.items.clear()
        self.ordered.clear()

    def __len__(self) -> int:
        return len(self.items)

    def quantile(self, q: float) -> float:
        """Nearest-rank quantile (the window must not be empty)."""
        xs = self.ordered
        return xs[_rank(q, len(xs))]


@dataclass(slots=True)
class _Signal:
    """Recent samples of one quantity of one class, and the solo baseline (reserved only)."""

    higher_is_better: bool
    recent: deque[float]
    baseline: SortedWindow
    since: SortedWindow  # samples of requests that arrived after the controller's last change


def _signal(higher_is_better: bool, p: HeadroomParams) -> _Signal:
    return _Signal(
        higher_is_better,
        deque(maxlen=p.window_samples),
        SortedWindow(p.baseline_samples),
        SortedWindow(4 * p.min_samples),
    )


@dataclass(frozen=True, slots=True)
class _Verdict:
    """What the controller's verdict on one reserved signal needs that does not change per sample: the
    absolute target (``None``: learned), ``1 +- tolerance``, and the nearest-rank index of its quantile for
    every length of the ``since`` window (p75 TTFT / p25 OTPS, p90 / p10 from 20 samples on) and of the
    baseline (the same quantile, so two tables: under and from 20 ``since`` samples)."""

    ttft: bool
    signal: _Signal
    since: list[float]  # ``signal.since.ordered`` (the same list for the window's life)
    baseline: list[float]  # ``signal.baseline.ordered``
    fixed: float | None
    factor: float
    since_at: tuple[int, ...]
    base_body_at: tuple[int, ...]
    base_tail_at: tuple[int, ...]


def _verdict(kind: str, signal: _Signal, p: HeadroomParams) -> _Verdict:
    ttft = kind == "ttft"
    body, tail = (0.75, 0.9) if ttft else (0.25, 0.1)
    since_n = range(4 * p.min_samples + 1)
    base_n = range(p.baseline_samples + 1)
    return _Verdict(
        ttft,
        signal,
        signal.since.ordered,
        signal.baseline.ordered,
        p.reserved.ttft_p95_s if ttft else p.reserved.otps_p10,
        (1 + p.tolerance) if ttft else (1 - p.tolerance),
        tuple(_rank(tail if n >= 20 else body, n) for n in since_n),
        tuple(_rank(body, n) for n in base_n),
        tuple(_rank(tail, n) for n in base_n),
    )


class LatencyHeadroom:
    """One deployment's latency headroom and best-effort limit (see the module docstring).

    A ``core.lifecycle`` observer: give it to the deployment's ``Lifecycle``; read ``best_effort_limit``
    when admission needs it and ``report`` for the ledger.
    """

    def __init__(self, params: HeadroomParams | None = None) -> None:
        self.params = p = params or HeadroomParams()
        self._signals = {
            (RESERVED, "ttft"): _signal(False, p),
            (RESERVED, "otps"): _signal(True, p),
            (BEST_EFFORT, "ttft"): _signal(False, p),
            (BEST_EFFORT, "otps"): _signal(True, p),
        }
        self._reserved = {kind: self._signals[(RESERVED, kind)] for kind in ("ttft", "otps")}
        self._reserved_ttft = self._reserved["ttft"]
        self._verdicts = tuple(_verdict(kind, sig, p) for kind, sig in self._reserved.items())
        self._first: dict[str, float] = {}  # request id -> first token time (streamed, in flight)
        self.best_effort_on_engines = 0  # best-effort attempts dispatched and not complete
        self.reserved_on_engines = 0
        self._be_idle_since = -math.inf  # no best-effort on the engines since then (inf: busy now)
        self._reserved_seen_s = -math.inf  # last reserved dispatch or completion
        self.limit = 0
        self.changed_s = -math.inf
        self.decisions = {"grow": 0, "cut": 0}
        self.last_headroom: float | None = None

    # -- lifecycle events ---------------------------------------------------------------------------------
    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        priority = request.priority
        if priority == Priority.PROBE:
            return
        if priority == Priority.BEST_EFFORT:
            self.best_effort_on_engines += 1
            self._be_idle_since = math.inf
        else:
            self.reserved_on_engines += 1
            self._reserved_seen_s = now

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        priority = request.priority
        if priority == Priority.PROBE:
            return
        self._first[request.request_id] = now
        # (``self._sample(request, "ttft", now - started, started, now)`` written out: every stream)
        started = request.arrival_s
        value = now - started
        if not 0.0 <= value < _INF:
            return
        if priority == Priority.BEST_EFFORT:
            self._signals[(BEST_EFFORT, "ttft")].recent.append(value)
            return
        sig = self._reserved_ttft
        sig.recent.append(value)
        if self.best_effort_on_engines == 0 and self._be_idle_since <= started:
            sig.baseline.append(value)  # solo: no best-effort on the engines for the whole request
        if started >= self.changed_s:
            sig.since.append(value)
            self._decide(now)

    def on_complete(
        self, request: RequestInfo, replica: str, now: float, usage: Usage | None, cost_mu: float, ok: bool
    ) -> None:
        priority = request.priority
        if priority == Priority.PROBE:
            return
        first = self._first.pop(request.request_id, None)
        if priority == Priority.BEST_EFFORT:
            self.best_effort_on_engines = max(0, self.best_effort_on_engines - 1)
            if self.best_effort_on_engines == 0:
                self._be_idle_since = now
        else:
            self.reserved_on_engines = max(0, self.reserved_on_engines - 1)
            self._reserved_seen_s = now
        if not ok:
            return
        if not request.stream:
            self._sample(request, "ttft", now - request.arrival_s, request.arrival_s, now)
        elif (
            first is not None
            and usage is not None
            and usage.completion_tokens >= self.params.otps_min_tokens
            and now > first
        ):
            self._sample(request, "otps", (usage.completion_tokens - 1) / (now - first), first, now)

    # -- admission's question -----------------------------------------------------------------------------
    def reserved_active(self, now: float) -> bool:
        return self.reserved_on_engines > 0 or now - self._reserved_seen_s <= self.params.active_s

    def best_effort_limit(self, now: float) -> int | None:
        """Best-effort requests that may be in flight on the deployment now (``None``: no limit)."""
        if not self.params.enabled or not self.reserved_active(now):
            return None
        return self.limit

    # -- internals ----------------------------------------------------------------------------------------
    def _sample(self, request: RequestInfo, kind: str, value: float, started: float, now: float) -> None:
        if not 0.0 <= value < _INF:  # (``value < 0 or not math.isfinite(value)``: no sample)
            return
        if request.priority == Priority.BEST_EFFORT:
            self._signals[(BEST_EFFORT, kind)].recent.append(value)
            return
        sig = self._reserved[kind]
        sig.recent.append(value)
        if self.best_effort_on_engines == 0 and self._be_idle_since <= started:
            sig.baseline.append(value)  # solo: no best-effort on the engines for the whole request
        if started >= self.changed_s:
            sig.since.append(value)
            self._decide(now)

    def _reference(self, kind: str, cls: str = RESERVED) -> tuple[float, float] | None:
        """(target, reference) of a signal: absolute when configured, else learned from the baseline."""
        targets = self.params.reserved if cls == RESERVED else self.params.best_effort
        tol = self.params.tolerance
        fixed = targets.ttft_p95_s if kind == "ttft" else targets.otps_p10
        if fixed is not None:
            return fixed, fixed
        if cls != RESERVED:
            return None
        base = self._signals[(cls, kind)].baseline
        if len(base) < self.params.min_samples:
            return None
        ref = base.quantile(0.95 if kind == "ttft" else 0.10)
        return (ref * (1 + tol) if kind == "ttft" else ref * (1 - tol)), ref

    def _headroom_of(self, kind: str, observed: float, target: float, ref: float) -> float:
        span = self.params.tolerance * ref
        if span <= 0:
            return math.inf
        return (target - observed) / span if kind == "ttft" else (observed - target) / span

    def _decide(self, now: float) -> None:
        """The controller's verdict on the samples since its last change: the headroom ``h`` (the worse of
        TTFT and OTPS; none yet: no verdict), and whether a signal still waits for its ``min_samples``.

        Per reserved sample, so inline: the quantile indices and ``1 +- tolerance`` come from ``_Verdict``'s
        tables (the same nearest-rank formula and arithmetic as ``_reference`` and ``_headroom_of``)."""
        h: float | None = None
        pending = False
        n = self.params.min_samples
        tol = self.params.tolerance
        for v in self._verdicts:
            since = v.since
            m = len(since)
            if m < n:
                pending = pending or m > 0
                continue
            # the same shift applied to a steadier quantile of the few samples since the change; once
            # 20 are in (the limit held in the dead band), one nearer the target's tail
            observed = since[v.since_at[m]]
            if v.fixed is None:  # learned: compare like with like (the baseline's same quantile)
                base = v.baseline
                b = len(base)
                if b < n:
                    continue
                ref = base[v.base_tail_at[b] if m >= 20 else v.base_body_at[b]]
                target = ref * v.factor
            else:
                ref = target = v.fixed
            span = tol * ref
            if span <= 0:
                signal_h = math.inf
            else:
                signal_h = (target - observed) / span if v.ttft else (observed - target) / span
            if h is None or signal_h < h:
                h = signal_h
        if h is None:
            return
        self.last_headroom = h
        p = self.params
        if h < p.close_headroom:  # either signal alone may cut
            new = self.limit // 2
            self.decisions["cut"] += 1
        elif not pending and h >= p.open_headroom and self.best_effort_on_engines >= self.limit:
            new = min(p.max_limit, self.limit + max(1, self.limit // 4))
            self.decisions["grow"] += 1
        else:
            return  # in the dead band, or the limit does not bind: keep it, keep collecting
        self.limit = new
        self.changed_s = now
        for sig in self._signals.values():
            sig.since.clear()

    # -- the ledger ---------------------------------------------------------------------------------------
    def report(self, now: float) -> dict[str, Any]:
        """Per class: observed TTFT p95 and OTPS p10 over the recent samples, their targets and headroom;
        the best-effort limit and what is on the engines (JSON-ready)."""
        classes: dict[str, Any] = {}
        for cls in (RESERVED, BEST_EFFORT):
            row: dict[str, Any] = {}
            for kind, q, name in (("ttft", 0.95, "ttft_p95_s"), ("otps", 0.10, "otps_p10")):
                sig = self._signals[(cls, kind)]
                observed = quantile(list(sig.recent), q) if sig.recent else None
                targets = self._reference(kind, cls)
                row[name] = observed
                row[f"{name}_target"] = None if targets is None else targets[0]
                if cls == RESERVED:
                    row[f"{name}_solo"] = None if targets is None or self._fixed(kind) else targets[1]
                row[f"{kind}_headroom"] = (
                    None
                    if observed is None or targets is None
                    else self._headroom_of(kind, observed, targets[0], targets[1])
                )
                row[f"{kind}_samples"] = len(sig.recent)
            classes[cls] = row
        limit = self.best_effort_limit(now)
        return {
            "enabled": self.params.enabled,
            "reserved_active": self.reserved_active(now),
            "best_effort_limit": limit,
            "best_effort_on_engines": self.best_effort_on_engines,
            "reserved_on_engines": self.reserved_on_engines,
            "control_headroom": self.last_headroom,
            "decisions": dict(self.decisions),
            "classes": classes,
        }

    def _fixed(self, kind: str) -> bool:
        t = self.params.reserved
        return (t.ttft_p95_s if kind == "ttft" else t.otps_p10) is not None
