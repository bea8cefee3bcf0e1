"""core.health: the replica state machine driven on a simulated clock (no sockets, no sleeps)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from fleetgate.core.health import HealthPolicy, ProbeNow, Remediate, ReplicaHealth, Transition
from fleetgate.core.types import HealthState as H

#: An engine model: given the time a probe is sent, (ok, latency_s, error).
Engine = Callable[[float], tuple[bool, float, str]]


def healthy(_: float) -> tuple[bool, float, str]:
    return True, 0.05, ""


@dataclass
class Driver:
    """Plays the asyncio shell's part: sends probes, enforces the timeout, runs remediations."""

    rh: ReplicaHealth
    engine: Engine = healthy
    restart_s: float = 2.0
    now: float = 0.0
    transitions: list[Transition] = field(default_factory=list)
    remediations: list[tuple[float, Remediate]] = field(default_factory=list)
    probes: list[float] = field(default_factory=list)
    _probe_done: tuple[float, bool, float, str] | None = None
    _restart_done: float | None = None
    on_restart: Callable[[], None] | None = None

    def _take(self, events: list) -> None:  # type: ignore[type-arg]
        for ev in events:
            if isinstance(ev, Transition):
                self.transitions.append(ev)
            elif isinstance(ev, ProbeNow):
                self.probes.append(self.now)
                self.rh.on_probe_started(self.now)
                ok, lat, err = self.engine(self.now)
                timeout = self.rh.policy.probe_timeout_s
                if lat >= timeout:
                    ok, lat, err = False, timeout, "timeout"
                self._probe_done = (self.now + lat, ok, lat, err)
            elif isinstance(ev, Remediate):
                self.remediations.append((self.now, ev))
                self._restart_done = self.now + self.restart_s

    def run_until(self, end: float, dt: float = 0.05, each: Callable[[float], None] | None = None) -> None:
        while self.now < end:
            self.now = round(self.now + dt, 6)
            if self._probe_done and self.now >= self._probe_done[0]:
                _, ok, lat, err = self._probe_done
                self._probe_done = None
                self._take(self.rh.on_probe(self.now, ok, lat, err))
            if self._restart_done is not None and self.now >= self._restart_done:
                self._restart_done = None
                if self.on_restart:
                    self.on_restart()
                self._take(self.rh.on_remediation_done(self.now, True))
            if each:
                each(self.now)
            self._take(self.rh.poll(self.now))

    def first(self, state: H, after: float = 0.0) -> float:
        return next(t.at_s for t in self.transitions if t.new == state and t.at_s >= after)


def test_defaults_meet_the_30s_budget_on_paper() -> None:
    p = HealthPolicy()
    # Detection, plus a few seconds to restart a process, plus the consecutive successes to come back.
    assert p.detection_bound_s() + 5.0 + p.successes_to_healthy * p.starting_probe_interval_s + 1 <= 30.0


def test_starting_replica_needs_consecutive_successes() -> None:
    rh = ReplicaHealth("r", now=0.0)
    assert rh.state == H.STARTING and not rh.routable
    d = Driver(rh)
    d.run_until(0.6)
    assert rh.state == H.STARTING  # one success is not enough
    d.run_until(2.0)
    assert rh.state == H.HEALTHY and rh.routable
    assert [t.new for t in d.transitions] == [H.HEALTHY]


def test_hang_detected_removed_restarted_and_back_within_30s() -> None:
    hung = {"on": False}

    def engine(_: float) -> tuple[bool, float, str]:
        return (False, 1e9, "") if hung["on"] else (True, 0.05, "")

    rh = ReplicaHealth("r", now=0.0, initial=H.HEALTHY)
    d = Driver(rh, engine=engine, restart_s=3.0)
    d.on_restart = lambda: hung.update(on=False)
    d.run_until(20.0)
    assert rh.state == H.HEALTHY and not d.remediations
    hung["on"] = True
    t_hang = d.now
    d.run_until(t_hang + 40.0)
    t_unhealthy = d.first(H.UNHEALTHY, t_hang)
    assert t_unhealthy - t_hang <= rh.policy.detection_bound_s() + 1e-6
    assert len(d.remediations) == 1 and "no_progress" in d.remediations[0][1].reason
    t_back = d.first(H.HEALTHY, t_unhealthy)
    assert t_back - t_hang <= 30.0
    assert rh.state == H.HEALTHY


def test_busy_replica_with_slow_probes_is_never_killed() -> None:
    """Every probe times out (a long prefill hogs the engine), but tokens keep flowing: never remediate."""

    def engine(_: float) -> tuple[bool, float, str]:
        return False, 1e9, ""

    rh = ReplicaHealth("r", now=0.0, initial=H.HEALTHY)
    counter = {"tokens": 0.0, "last": 0.0}

    def progress(now: float) -> None:
        if now - counter["last"] >= 1.0:  # a scrape per second sees the generated-token counter grow
            counter["last"] = now
            counter["tokens"] += 50
            d._take(rh.on_progress(now, counter["tokens"]))

    d = Driver(rh, engine=engine)
    d.run_until(600.0, dt=0.1, each=progress)
    assert not d.remediations
    assert all(t.new in (H.HEALTHY, H.SUSPECT) for t in d.transitions)
    assert rh.routable


def test_busy_replica_proven_by_completions_is_not_even_probed() -> None:
    rh = ReplicaHealth("r", now=0.0, initial=H.HEALTHY)
    d = Driver(rh, engine=lambda _: (False, 1e9, ""))
    d.run_until(100.0, dt=0.1, each=lambda now: d._take(rh.on_request(now, True)))
    assert d.probes == [] and rh.state == H.HEALTHY


def test_crash_detected_fast() -> None:
    crashed = {"on": False}
    rh = ReplicaHealth("r", now=0.0, initial=H.HEALTHY)
    d = Driver(
        rh,
        engine=lambda _: (False, 0.001, "refused") if crashed["on"] else (True, 0.05, ""),
        restart_s=2.0,
    )
    d.on_restart = lambda: crashed.update(on=False)
    d.run_until(10.0)
    d._take(rh.on_request(d.now, True))  # a request just completed: fresh evidence of progress
    crashed["on"] = True
    d.run_until(40.0)
    t_bad = d.first(H.UNHEALTHY, 10.0)
    # Refused connections are not vetoed by recent progress: two probes, one second apart.
    assert t_bad - 10.0 <= rh.policy.probe_idle_s + rh.policy.suspect_probe_interval_s + 0.5
    assert d.transitions[-1].new == H.HEALTHY


def test_error_rate_makes_unhealthy_and_remediates() -> None:
    rh = ReplicaHealth("r", now=0.0, initial=H.HEALTHY)
    events = []
    for i in range(20):
        events += rh.on_request(i * 0.1, ok=(i % 3 == 0))  # two thirds fail
    assert rh.state == H.UNHEALTHY and not rh.routable
    assert any(isinstance(e, Transition) and "error_rate" in e.reason for e in events)
    out = rh.poll(2.5)
    assert any(isinstance(e, Remediate) for e in out) and rh.state == H.RESTARTING


def test_some_errors_only_make_suspect() -> None:
    rh = ReplicaHealth("r", now=0.0, initial=H.HEALTHY)
    for i in range(20):
        rh.on_request(i * 0.1, ok=(i % 4 != 0))  # a quarter fail
    assert rh.state == H.SUSPECT and rh.routable


def test_slow_idle_replica_is_suspect_but_not_killed() -> None:
    rh = ReplicaHealth("r", now=0.0, initial=H.HEALTHY)
    d = Driver(rh, engine=lambda _: (True, 3.0, ""))  # slower than slow_probe_s, faster than the timeout
    d.run_until(120.0)
    assert rh.state == H.SUSPECT and rh.routable and not d.remediations
    d.engine = healthy
    d.run_until(125.0)
    assert rh.state == H.HEALTHY


def test_unhealthy_comes_back_only_after_consecutive_successes() -> None:
    rh = ReplicaHealth("r", HealthPolicy(remediate=False, successes_to_healthy=3), now=0.0, initial=H.HEALTHY)
    rh.on_probe(5.0, False, 5.0, "timeout")
    rh.on_probe(11.0, False, 5.0, "timeout")
    assert rh.state == H.UNHEALTHY
    rh.on_probe(12.0, True, 0.1)
    rh.on_probe(13.0, True, 0.1)
    rh.on_probe(14.0, False, 0.1, "http_500")
    rh.on_probe(15.0, True, 0.1)
    rh.on_probe(16.0, True, 0.1)
    assert rh.state == H.UNHEALTHY
    rh.on_probe(17.0, True, 0.1)
    assert rh.state == H.HEALTHY
    assert rh.livez()[0]


def test_crash_loop_backs_off_exponentially() -> None:
    p = HealthPolicy(backoff_base_s=5.0, backoff_max_s=40.0, startup_timeout_s=10.0)
    rh = ReplicaHealth("r", p, now=0.0, initial=H.HEALTHY)
    d = Driver(rh, engine=lambda _: (False, 0.001, "refused"), restart_s=1.0)  # never comes back
    d.run_until(300.0)
    times = [t for t, _ in d.remediations]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Each gap: restart (1 s) + startup timeout (10 s) + backoff (5, 10, 20, 40, 40 ...).
    assert len(times) >= 5
    assert gaps[0] == pytest.approx(1 + 10 + 5, abs=0.2)
    assert gaps[1] == pytest.approx(1 + 10 + 10, abs=0.2)
    assert gaps[2] == pytest.approx(1 + 10 + 20, abs=0.2)
    assert max(gaps) <= 1 + 10 + 40 + 0.2
    assert [r.attempt for _, r in d.remediations][:3] == [1, 2, 3]


def test_sidecar_mode_fails_livez_instead_of_remediating() -> None:
    rh = ReplicaHealth("r", HealthPolicy(remediate=False), now=0.0, initial=H.HEALTHY)
    d = Driver(rh, engine=lambda _: (False, 1e9, ""))
    d.run_until(30.0)
    assert not d.remediations
    ok, reason = rh.livez()
    assert not ok and "no_progress" in reason


def test_progress_counter_reset_is_not_progress() -> None:
    rh = ReplicaHealth("r", now=0.0, initial=H.HEALTHY)
    rh.on_progress(1.0, 100.0)
    rh.on_progress(2.0, 150.0)
    assert rh.last_progress_s == 2.0
    rh.on_progress(3.0, 10.0)  # engine restarted: counter reset
    assert rh.last_progress_s == 2.0


def test_policy_validation() -> None:
    with pytest.raises(ValueError):
        HealthPolicy(probe_timeout_s=0)
    with pytest.raises(ValueError):
        HealthPolicy(error_ratio_suspect=0.9, error_ratio_unhealthy=0.5)
    with pytest.raises(ValueError, match="unknown"):
        HealthPolicy.from_params({"probe_timeout": 1})


def test_a_probes_own_tokens_are_not_progress() -> None:
    rh = ReplicaHealth("r", HealthPolicy(min_progress_tokens=16), now=0.0, initial=H.HEALTHY)
    rh.on_progress(1.0, 100.0)
    rh.on_progress(2.0, 103.0)  # one probe: a few prompt tokens and one output token
    rh.on_progress(3.0, 106.0)
    assert rh.last_progress_s == -float("inf")
    rh.on_progress(4.0, 140.0)  # real work
    assert rh.last_progress_s == 4.0
