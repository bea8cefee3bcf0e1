"""``core.admission.headroom.LatencyHeadroom``: learning the solo baseline, both targets, the AIMD limit and
its dead band, and what the ledger reports; plus the admission core holding best-effort at the limit."""

from __future__ import annotations

import itertools
import random
from collections import deque

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fleetgate.admission.latency import LatencyCollector
from fleetgate.core.admission import AdmissionMachine, CapacityView, Resolve, TakeCharges, TenantLimits
from fleetgate.core.admission.buckets import MemoryBuckets
from fleetgate.core.admission.headroom import (
    ClassTargets,
    HeadroomParams,
    LatencyHeadroom,
    SortedWindow,
    quantile,
)
from fleetgate.core.types import Priority, RequestInfo, Usage

_ids = itertools.count()


def _req(priority: Priority, at: float, stream: bool = True) -> RequestInfo:
    return RequestInfo(f"r{next(_ids)}", "m", priority=priority, stream=stream, arrival_s=at)


def _reserved(h: LatencyHeadroom, at: float, ttft: float, tokens: int = 21, decode_s: float = 0.2) -> float:
    """One streamed reserved request: dispatched at ``at``, first token after ``ttft``, ``tokens`` in all
    over ``decode_s`` after the first. Returns when it ended."""
    r = _req(Priority.INTERACTIVE, at)
    h.on_dispatch(r, "a", at)
    h.on_first_token(r, "a", at + ttft)
    end = at + ttft + decode_s
    h.on_complete(r, "a", end, Usage(prompt_tokens=10, completion_tokens=tokens), 1.0, True)
    return end


def _be_start(h: LatencyHeadroom, at: float) -> RequestInfo:
    r = _req(Priority.BEST_EFFORT, at)
    h.on_dispatch(r, "a", at)
    return r


def _learn(h: LatencyHeadroom, t: float, n: int = 10, ttft: float = 0.1) -> float:
    for _ in range(n):
        t = _reserved(h, t, ttft) + 0.01
    return t


def test_no_limit_while_no_reserved_traffic_is_active() -> None:
    h = LatencyHeadroom(HeadroomParams(active_s=5.0))
    assert h.best_effort_limit(0.0) is None
    for i in range(20):  # best-effort alone: never limited
        r = _be_start(h, float(i))
        h.on_complete(r, "a", i + 0.5, Usage(prompt_tokens=1, completion_tokens=10), 1.0, True)
    assert h.best_effort_limit(20.0) is None
    end = _reserved(h, 30.0, 0.1)
    assert h.best_effort_limit(end) == 0  # reserved active, nothing learned yet: hold best-effort
    assert h.best_effort_limit(end + 5.1) is None  # idle again after active_s


def test_disabled_never_limits() -> None:
    h = LatencyHeadroom(HeadroomParams(enabled=False))
    _learn(h, 0.0)
    assert h.best_effort_limit(1.0) is None


def test_learns_solo_baseline_then_grows_only_while_the_limit_binds() -> None:
    h = LatencyHeadroom(HeadroomParams(min_samples=8))
    t = _learn(h, 0.0, n=8)  # solo: no best-effort on the engines
    assert h.report(t)["classes"]["reserved"]["ttft_p95_s_solo"] == pytest.approx(0.1)
    assert h.limit == 1  # the 8th solo sample had full headroom and the limit (0) bound
    t = _learn(h, t, n=8)  # still nothing on the engines: the limit of 1 does not bind, so it stays
    assert h.limit == 1
    be = [_be_start(h, t)]
    t = _learn(h, t, n=8)  # one best-effort running, reserved as fast as solo: grow
    assert h.limit == 2
    be.append(_be_start(h, t))
    t = _learn(h, t, n=8)
    assert h.limit == 3
    assert h.decisions == {"grow": 3, "cut": 0}


def _grow_to(h: LatencyHeadroom, t: float, limit: int) -> float:
    """Best-effort fills the limit and reserved stays as fast as solo until the limit reaches ``limit``."""
    t = _learn(h, t, n=h.params.min_samples)
    while h.limit < limit:
        while h.best_effort_on_engines < h.limit:
            _be_start(h, t)
        t = _learn(h, t, n=h.params.min_samples)
    assert h.limit == limit
    return t


def test_ttft_beyond_target_halves_the_limit_and_old_samples_do_not_count_twice() -> None:
    h = LatencyHeadroom(HeadroomParams(min_samples=8))
    t = _grow_to(h, 0.0, 8)  # 0 -> 1 -> 2 -> ... -> 8 (a quarter, at least 1, per verdict)
    t = _learn(h, t, n=8, ttft=0.13)  # 30 % slower than solo: beyond the 10 % target
    assert h.limit == 4
    assert h.decisions["cut"] == 1
    # the next verdict waits for 8 new samples of requests that arrived after the cut
    t = _learn(h, t, n=7, ttft=0.13)
    assert h.limit == 4
    _learn(h, t, n=1, ttft=0.13)
    assert h.limit == 2


def test_dead_band_keeps_the_limit() -> None:
    h = LatencyHeadroom(HeadroomParams(min_samples=8, tolerance=0.10, open_headroom=0.5, close_headroom=0.2))
    t = _grow_to(h, 0.0, 4)
    grown = h.decisions["grow"]
    t = _learn(h, t, n=24, ttft=0.1065)  # 6.5 % slower: headroom 0.35, between close and open
    assert h.limit == 4
    assert h.decisions == {"grow": grown, "cut": 0}
    assert h.last_headroom == pytest.approx(0.35, abs=0.01)


def test_otps_drop_alone_cuts_the_limit() -> None:
    h = LatencyHeadroom(HeadroomParams(min_samples=8))
    t = _grow_to(h, 0.0, 6)  # 20 tokens after the first in 0.2 s: 100 tokens/s solo
    for _ in range(8):  # first token as fast as solo, the stream 25 % slower
        t = _reserved(h, t, 0.1, decode_s=0.25) + 0.01
    assert h.limit == 3
    rep = h.report(t)["classes"]["reserved"]
    assert rep["otps_p10_target"] == pytest.approx(90.0)
    assert rep["otps_p10"] == pytest.approx(80.0)
    assert rep["otps_headroom"] < 0
    assert rep["ttft_headroom"] == pytest.approx(1.0)


def test_absolute_targets_need_no_baseline() -> None:
    params = HeadroomParams(min_samples=8, reserved=ClassTargets(ttft_p95_s=0.5, otps_p10=10.0))
    h = LatencyHeadroom(params)
    _be_start(h, 0.0)  # never solo
    t = 0.01
    for _ in range(8):
        t = _reserved(h, t, 0.2) + 0.01  # well inside 0.5 s and 100 tok/s
    assert h.limit == 1
    rep = h.report(t)["classes"]["reserved"]
    assert rep["ttft_p95_s_target"] == 0.5 and rep["ttft_p95_s_solo"] is None
    assert rep["ttft_headroom"] == pytest.approx((0.5 - 0.2) / 0.05)


def test_non_streamed_time_to_first_byte_probes_ignored_best_effort_reported_not_controlling() -> None:
    params = HeadroomParams(min_samples=4, best_effort=ClassTargets(ttft_p95_s=2.0))
    h = LatencyHeadroom(params)
    for i in range(4):
        r = _req(Priority.INTERACTIVE, float(i), stream=False)
        h.on_dispatch(r, "a", float(i))
        h.on_complete(r, "a", i + 0.3, Usage(prompt_tokens=5, completion_tokens=50), 1.0, True)
    assert h.report(5.0)["classes"]["reserved"]["ttft_p95_s"] == pytest.approx(0.3)
    assert h.limit == 1
    probe = _req(Priority.PROBE, 6.0)
    h.on_dispatch(probe, "a", 6.0)
    h.on_complete(probe, "a", 9.0, None, 0.0, True)
    assert h.reserved_on_engines == 0 and h.report(9.0)["classes"]["reserved"]["ttft_samples"] == 4
    for i in range(10):  # best-effort far beyond its target: reported, never cuts the limit
        r = _be_start(h, 10.0 + i)
        h.on_first_token(r, "a", 14.0 + i)
    be = h.report(30.0)["classes"]["best_effort"]
    assert be["ttft_p95_s"] == pytest.approx(4.0) and be["ttft_headroom"] < 0
    assert h.limit == 1 and h.decisions["cut"] == 0


def test_a_failed_attempt_gives_no_sample() -> None:
    h = LatencyHeadroom()
    r = _req(Priority.INTERACTIVE, 0.0, stream=False)
    h.on_dispatch(r, "a", 0.0)
    h.on_complete(r, "a", 5.0, None, 0.0, False)
    assert h.report(5.0)["classes"]["reserved"]["ttft_samples"] == 0
    assert h.reserved_on_engines == 0


def _run(machine: AdmissionMachine, rnd: object, buckets: MemoryBuckets, now: float) -> None:
    while (cmd := rnd.next()) is not None:  # type: ignore[attr-defined]
        if isinstance(cmd, TakeCharges):
            rnd.taken(buckets.take(cmd.charges, now))  # type: ignore[attr-defined]
        elif isinstance(cmd, Resolve):
            pass


def test_admission_holds_best_effort_at_the_limit_never_reserved() -> None:
    """The core admits best-effort while fewer than ``best_effort_limit`` are in flight, then holds it
    (SATURATED: 503 at its deadline); a settle frees a slot; reserved tenants are never held by it."""
    limit = [2]
    machine = AdmissionMachine(capacity_of=lambda m: CapacityView(6000.0, 0.0, best_effort_limit=limit[0]))
    buckets = MemoryBuckets()
    free = TenantLimits("free", Priority.BEST_EFFORT, best_effort_mu_per_min=float("inf"))
    gold = TenantLimits("gold", reserved_mu_per_min={"m": 6000.0})
    decisions = []
    for i in range(3):
        req = RequestInfo(f"f{i}", "m", "free", cost_mu=0.01, priority=Priority.BEST_EFFORT)
        rnd = machine.submit(free, req, 0.0, deadline_s=0.0)
        _run(machine, rnd, buckets, 0.0)
        decisions.append((req, rnd.decision))
    assert [d is not None and d.allowed for _, d in decisions] == [True, True, False]
    held = decisions[2][1]
    assert held is not None and held.status == 503
    g = RequestInfo("g", "m", "gold", cost_mu=0.01)
    rnd = machine.submit(gold, g, 0.0)
    _run(machine, rnd, buckets, 0.0)
    assert rnd.decision is not None and rnd.decision.allowed  # reserved: never held by the limit
    req0, d0 = decisions[0]
    assert d0 is not None
    _run(machine, machine.settle(d0, free, req0, 0.01), buckets, 0.1)
    req = RequestInfo("f3", "m", "free", cost_mu=0.01, priority=Priority.BEST_EFFORT)
    rnd = machine.submit(free, req, 0.1, deadline_s=0.0)
    _run(machine, rnd, buckets, 0.1)
    assert rnd.decision is not None and rnd.decision.allowed
    limit[0] = 0
    rnd = machine.submit(free, RequestInfo("f4", "m", "free", cost_mu=0.01, priority=Priority.BEST_EFFORT),
                         0.2, deadline_s=0.0)  # fmt: skip
    _run(machine, rnd, buckets, 0.2)
    assert rnd.decision is not None and not rnd.decision.allowed


@pytest.mark.parametrize("maxlen", [0, 1, 7, 32])
def test_sorted_window_quantiles_equal_sorting_the_window(maxlen: int) -> None:
    """``SortedWindow`` (kept sorted as samples come and go) answers like sorting the window each time."""
    rng = random.Random(maxlen)
    window = SortedWindow(maxlen)
    plain: deque[float] = deque(maxlen=maxlen)
    for step in range(3000):
        if rng.random() < 0.01:
            window.clear()
            plain.clear()
        value = rng.choice([0.0, 1.0, 1.0, rng.random(), rng.expovariate(3.0)])
        window.append(value)
        plain.append(value)
        assert len(window) == len(plain)
        if plain:
            for q in (0.0, 0.1, 0.25, 0.5, 0.75, 0.95, 1.0):
                assert window.quantile(q) == quantile(list(plain), q), (step, q)


def test_short_streams_give_no_otps_sample() -> None:
    """A 4-token stream's rate is the relay's jitter: no OTPS sample below ``otps_min_tokens``."""
    h = LatencyHeadroom(HeadroomParams(otps_min_tokens=16))
    _reserved(h, 0.0, 0.1, tokens=4, decode_s=0.01)
    _reserved(h, 1.0, 0.1, tokens=16, decode_s=0.15)
    rep = h.report(2.0)["classes"]["reserved"]
    assert rep["ttft_samples"] == 2 and rep["otps_samples"] == 1
    assert rep["otps_p10"] == pytest.approx(100.0)


def test_a_tail_the_steady_quantile_misses_cuts_once_20_samples_are_in() -> None:
    """3 slow streams in 20 leave p25 OTPS as solo (no verdict but "keep": the limit does not bind), and
    put p10 beyond the target: the controller looks at the tail once 20 samples are in."""
    h = LatencyHeadroom(HeadroomParams(min_samples=8))
    t = _grow_to(h, 0.0, 4)
    done = _req(Priority.BEST_EFFORT, t)
    h.on_complete(done, "a", t, Usage(prompt_tokens=1, completion_tokens=20), 1.0, True)  # 3 of 4 on
    for i in range(1, 20):
        t = _reserved(h, t, 0.1, decode_s=0.25 if i in (5, 12, 19) else 0.2) + 0.01
    assert h.limit == 4 and h.decisions["cut"] == 0
    _reserved(h, t, 0.1)
    assert h.limit == 2 and h.decisions["cut"] == 1


def test_metrics_expose_both_signals_targets_and_the_limit() -> None:
    h = LatencyHeadroom(HeadroomParams(min_samples=8))
    t = _learn(h, 0.0, n=10)
    registry = CollectorRegistry()
    registry.register(LatencyCollector(lambda: {"m": h}, lambda: t))
    text = generate_latest(registry).decode()
    for line in (
        'fleetgate_latency_ttft_p95_seconds{class="reserved",deployment="m"}',
        'fleetgate_latency_ttft_p95_target_seconds{class="reserved",deployment="m"}',
        'fleetgate_latency_otps_p10{class="reserved",deployment="m"}',
        'fleetgate_latency_otps_p10_target{class="reserved",deployment="m"}',
        'fleetgate_latency_ttft_headroom{class="reserved",deployment="m"}',
        'fleetgate_latency_otps_headroom{class="reserved",deployment="m"}',
        'fleetgate_best_effort_limit{deployment="m"} 1.0',
        'fleetgate_best_effort_on_engines{deployment="m"} 0.0',
    ):
        assert line in text, line


class _PlainHeadroom(LatencyHeadroom):
    """The controller's verdict written out plainly (sorting the windows, the targets from ``_reference``):
    the reference for the table-driven ``_control_headroom``."""

    def _control_headroom(self) -> tuple[float | None, bool]:
        worst: float | None = None
        pending = False
        tol = self.params.tolerance
        for kind in ("ttft", "otps"):
            sig = self._signals[("reserved", kind)]
            since = list(sig.since.items)
            if len(since) < self.params.min_samples:
                pending = pending or bool(since)
                continue
            targets = self._reference(kind)
            if targets is None:
                continue
            target, ref = targets
            tail = len(since) >= 20
            q = (0.9 if tail else 0.75) if kind == "ttft" else (0.1 if tail else 0.25)
            observed = quantile(since, q)
            if not self._fixed(kind):
                ref = quantile(list(sig.baseline.items), q)
                target = ref * (1 + tol) if kind == "ttft" else ref * (1 - tol)
            h = self._headroom_of(kind, observed, target, ref)
            worst = h if worst is None else min(worst, h)
        return worst, pending


@pytest.mark.parametrize(
    "params",
    [
        HeadroomParams(),
        HeadroomParams(min_samples=3, baseline_samples=7, tolerance=0.2),
        HeadroomParams(min_samples=8, baseline_samples=40, reserved=ClassTargets(ttft_p95_s=0.12)),
        HeadroomParams(min_samples=5, reserved=ClassTargets(ttft_p95_s=0.15, otps_p10=80.0)),
    ],
)
def test_random_traffic_gives_the_plain_controllers_limits_and_decisions(params: HeadroomParams) -> None:
    """Reserved and best-effort streams (and some non-streamed, failed and probe requests) with random
    latencies through both controllers: the same limit, decisions and headroom after every event."""
    rng = random.Random(repr(params))
    fast, plain = LatencyHeadroom(params), _PlainHeadroom(params)
    t = 0.0
    open_: list[tuple[RequestInfo, float]] = []  # (request, first token time)
    prios = [Priority.INTERACTIVE, Priority.BATCH, Priority.BEST_EFFORT, Priority.PROBE]
    decided = 0
    for step in range(6000):
        t += rng.expovariate(40.0)
        if not open_ or (len(open_) < 12 and rng.random() < 0.5):
            stream = rng.random() < 0.9
            r = RequestInfo(f"x{step}", "m", priority=rng.choice(prios), stream=stream, arrival_s=t)
            first = t + 0.1 * (1.0 + 0.3 * fast.best_effort_on_engines * rng.random()) * rng.uniform(0.9, 1.1)
            for h in (fast, plain):
                h.on_dispatch(r, "a", t)
                if r.stream:
                    h.on_first_token(r, "a", first)
            open_.append((r, first))
        else:
            r, first = open_.pop(rng.randrange(len(open_)))
            end = max(t, first) + rng.uniform(0.1, 0.3)
            usage = Usage(prompt_tokens=5, completion_tokens=rng.choice([2, 16, 21, 40]))
            ok = rng.random() < 0.97
            for h in (fast, plain):
                h.on_complete(r, "a", end, usage, 1.0, ok)
        assert (fast.limit, fast.decisions, fast.last_headroom, fast.changed_s) == (
            plain.limit,
            plain.decisions,
            plain.last_headroom,
            plain.changed_s,
        ), step
        decided = fast.decisions["grow"] + fast.decisions["cut"]
    assert fast.report(t) == plain.report(t)
    assert decided > 10 and fast.decisions["cut"] > 0  # the sequence exercised the controller
