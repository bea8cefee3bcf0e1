"""Per-replica health state machine: black-box evidence in, states and actions out (sans-IO, like h11).

Engines hang silently (vLLM's ``/health`` stays 200 while the engine loop is stuck), and naive probes kill
healthy servers under load, which cascades. So health is judged on *evidence of progress*, not on one probe:

* a real request that completed, or a generated-token counter (scraped from /metrics) that grew, proves the
  replica works; probes are only sent when no such evidence arrived for ``probe_idle_s``;
* a probe is a minimal end-to-end request (1 output token, highest engine priority), so it exercises the
  same path as real traffic;
* a replica is declared unhealthy only after ``failures_to_unhealthy`` consecutive failed probes **and** no
  progress for ``progress_grace_s``: a busy replica that answers one probe slowly but keeps producing tokens
  is never judged by that probe;
* unhealthy replicas leave routing at once, are remediated (restart) with exponential backoff when they crash
  in a loop, and come back only after ``successes_to_healthy`` consecutive successful probes.

States: ``starting`` (new or restarted; not routable) -> ``healthy`` <-> ``suspect`` (routable, probed often)
-> ``unhealthy`` (not routable) -> ``restarting`` (remediation running / engine coming back) -> ``healthy``.

Every method takes ``now`` (seconds, any monotonic origin) and returns the events it produced:
:class:`Transition` (log, metric), :class:`ProbeNow` (the shell sends a probe and later calls
:meth:`ReplicaHealth.on_probe`) and :class:`Remediate` (the shell restarts the replica through its provider
and calls :meth:`ReplicaHealth.on_remediation_done`). See docs/health.md for the defaults and the 30 s budget.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from fleetgate.core.types import HealthState


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """Thresholds and timings; defaults chosen so a hung replica serves again within 30 s (docs/health.md)."""

    probe_idle_s: float = 5.0
    probe_timeout_s: float = 5.0
    suspect_probe_interval_s: float = 1.0
    failures_to_unhealthy: int = 2
    progress_grace_s: float = 10.0
    slow_probe_s: float = 2.0
    min_progress_tokens: float = 16.0
    successes_to_healthy: int = 2
    starting_probe_interval_s: float = 0.5
    startup_timeout_s: float = 120.0
    error_window: int = 20
    error_window_s: float = 30.0
    error_min_requests: int = 10
    error_ratio_suspect: float = 0.2
    error_ratio_unhealthy: float = 0.5
    remediate: bool = True
    backoff_base_s: float = 5.0
    backoff_max_s: float = 300.0
    crash_loop_window_s: float = 600.0

    def __post_init__(self) -> None:
        for name, v in asdict(self).items():
            if isinstance(v, bool):
                continue
            if isinstance(v, int | float) and v < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.probe_timeout_s <= 0 or self.probe_idle_s <= 0:
            raise ValueError("probe_timeout_s and probe_idle_s must be > 0")
        if self.failures_to_unhealthy < 1 or self.successes_to_healthy < 1:
            raise ValueError("failures_to_unhealthy and successes_to_healthy must be >= 1")
        if not 0 < self.error_ratio_suspect <= self.error_ratio_unhealthy <= 1:
            raise ValueError("need 0 < error_ratio_suspect <= error_ratio_unhealthy <= 1")

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> HealthPolicy:
        params = dict(params or {})
        unknown = sorted(set(params) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown health parameter(s): {', '.join(unknown)}")
        return cls(**params)

    def detection_bound_s(self) -> float:
        """Worst-case seconds from a hang to the unhealthy verdict (no traffic, no progress)."""
        first = self.probe_idle_s + self.probe_timeout_s
        rest = (self.failures_to_unhealthy - 1) * (self.suspect_probe_interval_s + self.probe_timeout_s)
        return max(first + rest, self.progress_grace_s)


@dataclass(frozen=True, slots=True)
class Transition:
    """A state change, with the evidence that caused it (logged as one event line, counted in metrics)."""

    replica: str
    old: HealthState
    new: HealthState
    reason: str
    at_s: float


@dataclass(frozen=True, slots=True)
class ProbeNow:
    """Send one probe now; report it with ``on_probe``."""

    replica: str
    reason: str


@dataclass(frozen=True, slots=True)
class Remediate:
    """Restart the replica (local: kill and restart on the same address; Kubernetes: delete the pod)."""

    replica: str
    reason: str
    attempt: int


HealthEvent = Transition | ProbeNow | Remediate


class RemediationDeclined(Exception):
    """A remediator that declines on purpose (a follower gateway leaves the replica to the leader): logged
    at info level, not as a failure; the replica's remediation is retried later as after a failure."""


_ROUTABLE = (HealthState.HEALTHY, HealthState.SUSPECT)


class ReplicaHealth:
    """The health of one replica. Mutable, but deterministic: the same calls give the same events."""

    def __init__(
        self,
        name: str,
        policy: HealthPolicy | None = None,
        *,
        now: float = 0.0,
        initial: HealthState = HealthState.STARTING,
    ) -> None:
        self.name = name
        self.policy = policy or HealthPolicy()
        self.state = initial
        self.reason = "initial"
        self.since_s = now
        self.consecutive_failures = 0
        self.consecutive_successes = 0
        self.last_evidence_s = now  # last proof of work: ok request, probe ok, or progress
        self.last_progress_s = -math.inf
        self.progress_counter: float | None = None
        self.last_probe_end_s = -math.inf
        self.probe_inflight = False
        self.probe_started_s = -math.inf
        self.last_probe_latency_s: float | None = None
        self.results: deque[tuple[float, bool]] = deque(maxlen=self.policy.error_window)
        self.restarts: list[float] = []
        self.remediate_at_s: float | None = None
        self.remediation_inflight = False
        self.restart_done_s: float | None = None
        self.last_failure_reason = ""

    # -- queries -------------------------------------------------------------------------------------------

    @property
    def routable(self) -> bool:
        """Whether new requests may go here (suspect replicas still serve; routers may prefer others)."""
        return self.state in _ROUTABLE

    def error_ratio(self, now: float) -> tuple[float, int]:
        """Share of failed real requests in the recent window, and how many requests it covers."""
        recent = [ok for t, ok in self.results if now - t <= self.policy.error_window_s]
        if not recent:
            return 0.0, 0
        return sum(1 for ok in recent if not ok) / len(recent), len(recent)

    def livez(self) -> tuple[bool, str]:
        """Liveness for a sidecar: false once the replica is judged unhealthy (kubelet then restarts it)."""
        if self.state == HealthState.UNHEALTHY:
            return False, self.reason
        return True, self.state.value

    def progressing(self, now: float) -> bool:
        """Progress evidence (real completions or token counter growth) within the grace period."""
        return now - max(self.last_progress_s, self.last_evidence_s) <= self.policy.progress_grace_s

    # -- inputs --------------------------------------------------------------------------------------------

    def on_request(self, now: float, ok: bool) -> list[HealthEvent]:
        """A real request here finished; ``ok=False`` only for engine faults (5xx, reset, timeout)."""
        self.results.append((now, ok))
        if ok:
            self.last_evidence_s = now
            self.last_progress_s = now
            if self.state == HealthState.SUSPECT and self._errors_ok(now):
                return self._to(HealthState.HEALTHY, "request_ok", now)
            return []
        self.last_failure_reason = "request_error"
        return self._judge_errors(now)

    def on_progress(self, now: float, counter: float) -> list[HealthEvent]:
        """A generated-token (or prompt-token) counter scraped from /metrics; growth is evidence of work.

        Growth below ``min_progress_tokens`` is ignored (the baseline stays): a probe's own few tokens must
        not make an idle, slow replica look busy."""
        prev = self.progress_counter
        if prev is not None and prev <= counter < prev + self.policy.min_progress_tokens:
            return []  # too little to be real work (a probe's own few tokens); keep the baseline
        self.progress_counter = counter
        if prev is None or counter <= prev:
            return []  # first sample, no progress, or the counter reset (engine restarted)
        self.last_progress_s = now
        if self.state in _ROUTABLE:
            self.last_evidence_s = now
            self.consecutive_failures = 0
            if self.state == HealthState.SUSPECT and self._errors_ok(now):
                return self._to(HealthState.HEALTHY, "progress", now)
        return []

    def on_probe_started(self, now: float) -> None:
        self.probe_inflight = True
        self.probe_started_s = now

    def on_probe(self, now: float, ok: bool, latency_s: float, error: str = "") -> list[HealthEvent]:
        """A probe result: ``ok`` and its latency, or a failure (``error``: timeout, refused, http_503)."""
        self.probe_inflight = False
        self.last_probe_end_s = now
        self.last_probe_latency_s = latency_s
        p = self.policy
        if ok:
            busy = now - self.last_progress_s <= p.progress_grace_s
            self.consecutive_failures = 0
            self.consecutive_successes += 1
            self.last_evidence_s = now
            if self.state in (HealthState.STARTING, HealthState.RESTARTING, HealthState.UNHEALTHY):
                if self.consecutive_successes >= p.successes_to_healthy:
                    self.results.clear()
                    return self._to(HealthState.HEALTHY, "probe_ok", now)
                return []
            if self.state == HealthState.HEALTHY and latency_s >= p.slow_probe_s and not busy:
                return self._to(HealthState.SUSPECT, "slow_probe", now)
            if self.state == HealthState.SUSPECT and latency_s < p.slow_probe_s and self._errors_ok(now):
                return self._to(HealthState.HEALTHY, "probe_ok", now)
            return []
        self.consecutive_successes = 0
        self.consecutive_failures += 1
        self.last_failure_reason = f"probe_{error or 'failed'}"
        if self.state in (HealthState.STARTING, HealthState.RESTARTING, HealthState.UNHEALTHY):
            return []  # expected while an engine boots; the startup timeout covers a replica that never does
        if self.progressing(now) and error != "refused":
            # Busy, not broken: tokens are flowing, so one slow or failed probe is not a verdict.
            # (A refused connection is different: nothing listens, so nothing can be progressing.)
            if self.state == HealthState.HEALTHY:
                return self._to(HealthState.SUSPECT, f"probe_{error or 'failed'}_while_progressing", now)
            return []
        if self.consecutive_failures >= p.failures_to_unhealthy:
            return self._unhealthy(now, f"probe_{error or 'failed'}_no_progress")
        if self.state == HealthState.HEALTHY:
            return self._to(HealthState.SUSPECT, f"probe_{error or 'failed'}", now)
        return []

    def on_probe_inconclusive(self, now: float) -> list[HealthEvent]:
        """The probe could not be sent (the gateway itself ran out of descriptors or memory): no evidence
        about the replica either way; the next probe is due as usual."""
        self.probe_inflight = False
        self.last_probe_end_s = now
        return []

    def on_remediation_done(self, now: float, ok: bool, error: str = "") -> list[HealthEvent]:
        """The provider finished (or failed) restarting; now wait for the engine to answer probes."""
        self.remediation_inflight = False
        if ok:
            self.restart_done_s = now
            self.consecutive_successes = 0
            self.consecutive_failures = 0
            self.progress_counter = None
            return []
        return self._unhealthy(now, f"remediation_failed: {error}" if error else "remediation_failed")

    def on_restarted_externally(self, now: float) -> list[HealthEvent]:
        """The provider replaced the replica on its own (e.g. a crashed process restarted, a new pod)."""
        self.restart_done_s = now
        self.consecutive_successes = 0
        self.progress_counter = None
        return self._to(HealthState.RESTARTING, "restarted", now)

    def poll(self, now: float) -> list[HealthEvent]:
        """Time passed: returns a probe to send and/or a remediation to start, when one is due."""
        p = self.policy
        out: list[HealthEvent] = []
        if self.state in (HealthState.STARTING, HealthState.RESTARTING):
            started = self.restart_done_s if self.restart_done_s is not None else self.since_s
            if not self.remediation_inflight and now - started > p.startup_timeout_s:
                return self._unhealthy(now, "startup_timeout")
        if (
            self.state == HealthState.UNHEALTHY
            and p.remediate
            and not self.remediation_inflight
            and self.remediate_at_s is not None
            and now >= self.remediate_at_s
        ):
            self.remediate_at_s = None
            self.remediation_inflight = True
            self.restart_done_s = None
            self.restarts.append(now)
            reason = self.reason
            out += self._to(HealthState.RESTARTING, f"remediate: {reason}", now)
            out.append(Remediate(self.name, reason, len(self._recent_restarts(now))))
            return out
        if self.probe_inflight or self.remediation_inflight:
            return out
        due = self._probe_due(now)
        if due:
            out.append(ProbeNow(self.name, due))
        return out

    # -- internals -----------------------------------------------------------------------------------------

    def _probe_due(self, now: float) -> str:
        p = self.policy
        since_probe = now - self.last_probe_end_s
        if self.state in (HealthState.STARTING, HealthState.RESTARTING, HealthState.UNHEALTHY):
            return "starting" if since_probe >= p.starting_probe_interval_s else ""
        if self.state == HealthState.SUSPECT:
            return "suspect" if since_probe >= p.suspect_probe_interval_s else ""
        if now - self.last_evidence_s >= p.probe_idle_s and since_probe >= p.probe_idle_s:
            return "idle"
        return ""

    def _errors_ok(self, now: float) -> bool:
        ratio, n = self.error_ratio(now)
        return n < self.policy.error_min_requests or ratio < self.policy.error_ratio_suspect

    def _judge_errors(self, now: float) -> list[HealthEvent]:
        p = self.policy
        if self.state not in _ROUTABLE:
            return []
        ratio, n = self.error_ratio(now)
        if n < p.error_min_requests:
            return []
        if ratio >= p.error_ratio_unhealthy:
            self.last_failure_reason = "error_rate"
            return self._unhealthy(now, f"error_rate {ratio:.2f} over {n} requests")
        if ratio >= p.error_ratio_suspect and self.state == HealthState.HEALTHY:
            return self._to(HealthState.SUSPECT, f"error_rate {ratio:.2f} over {n} requests", now)
        return []

    def _recent_restarts(self, now: float) -> list[float]:
        return [t for t in self.restarts if now - t <= self.policy.crash_loop_window_s]

    def _unhealthy(self, now: float, reason: str) -> list[HealthEvent]:
        p = self.policy
        self.restarts = self._recent_restarts(now)
        n = len(self.restarts)
        delay = 0.0 if n == 0 else min(p.backoff_max_s, p.backoff_base_s * 2 ** (n - 1))
        self.remediate_at_s = now + delay
        self.consecutive_successes = 0
        return self._to(HealthState.UNHEALTHY, reason, now)

    def _to(self, new: HealthState, reason: str, now: float) -> list[HealthEvent]:
        if new == self.state:
            self.reason = reason
            return []
        old = self.state
        self.state = new
        self.reason = reason
        self.since_s = now
        if new == HealthState.HEALTHY:
            self.consecutive_failures = 0
            self.last_evidence_s = now
        return [Transition(self.name, old, new, reason, now)]
