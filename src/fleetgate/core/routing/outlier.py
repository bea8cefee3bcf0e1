"""Outlier ejection / circuit breaking per replica, as a pure object fed with outcomes and ``now``.

Like Envoy's outlier detection with a circuit breaker's half-open state:

- **closed** (normal): a replica is ejected after ``consecutive_failures`` failures in a row, or when its
  error rate over the last ``error_rate_window_s`` reaches ``error_rate_threshold`` with at least
  ``error_rate_min_requests`` outcomes in the window;
- **open** (ejected) for ``base_ejection_s * backoff ** (ejections - 1)`` seconds, capped at
  ``max_ejection_s``; the ejection count resets after the replica has stayed healthy for ``max_ejection_s``;
- **half-open** afterwards: up to ``half_open_probes`` trial requests are let through; a success closes the
  breaker, a failure ejects again with the next, longer, ejection time.

Never ejects more than ``max_ejected_fraction`` of the replicas it knows, and the routable filter ignores
ejection altogether when it would leave no replica (a panic mode), so ejection alone never empties the fleet.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import Field, model_validator

from fleetgate.core.plugins import PluginParams


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class OutlierParams(PluginParams):
    """Outlier ejection / circuit breaking per replica (`core.routing.outlier`); every policy has it."""

    enabled: bool = Field(default=True, description="Eject replicas that fail (false: never).")
    consecutive_failures: int = Field(default=5, ge=1, description="Failures in a row that eject.")
    error_rate_threshold: float = Field(default=0.5, gt=0, le=1, description="Error rate that ejects.")
    error_rate_window_s: float = Field(default=30.0, gt=0, description="Window of the error rate.")
    error_rate_min_requests: int = Field(default=10, ge=1, description="Outcomes needed in the window.")
    base_ejection_s: float = Field(default=30.0, gt=0, description="First ejection's length.")
    max_ejection_s: float = Field(default=300.0, gt=0, description="Longest ejection.")
    backoff: float = Field(default=2.0, ge=1, description="Growth of each further ejection.")
    half_open_probes: int = Field(default=1, ge=1, description="Trial requests after an ejection.")
    max_ejected_fraction: float = Field(
        default=0.5, ge=0, le=1, description="Share of replicas ejected at most."
    )

    @model_validator(mode="after")
    def _ejection_order(self) -> OutlierParams:
        if self.max_ejection_s < self.base_ejection_s:
            raise ValueError("need base_ejection_s <= max_ejection_s")
        return self

    def detector(self) -> OutlierDetector | None:
        """A new detector, or ``None`` when ejection is off."""
        if not self.enabled:
            return None
        return OutlierDetector(self)


@dataclass(slots=True)
class _Replica:
    state: BreakerState = BreakerState.CLOSED
    consecutive: int = 0
    window: deque[tuple[float, bool]] = field(default_factory=deque)
    failures_in_window: int = 0
    ejections: int = 0
    ejected_until: float = 0.0
    last_ejection_end: float = float("-inf")
    trials_in_flight: int = 0


class OutlierDetector:
    """Per-replica breaker state. ``blocking`` lists replicas not currently closed (usually empty)."""

    def __init__(self, config: OutlierParams | None = None) -> None:
        self.config = config or OutlierParams()
        self._replicas: dict[str, _Replica] = {}
        self.blocking: dict[str, _Replica] = {}
        self.ejection_count = 0

    def _get(self, name: str) -> _Replica:
        rep = self._replicas.get(name)
        if rep is None:
            rep = self._replicas[name] = _Replica()
        return rep

    def state(self, name: str, now: float) -> BreakerState:
        """The breaker state of ``name`` at ``now`` (an expired ejection reads as half-open)."""
        rep = self._replicas.get(name)
        if rep is None:
            return BreakerState.CLOSED
        if rep.state is BreakerState.OPEN and now >= rep.ejected_until:
            return BreakerState.HALF_OPEN
        return rep.state

    def allows(self, name: str, now: float) -> bool:
        """Whether a new request may go to ``name`` now (closed, or half-open with a free trial slot)."""
        rep = self.blocking.get(name)
        if rep is None:
            return True
        if rep.state is BreakerState.OPEN:
            if now < rep.ejected_until:
                return False
            rep.state = BreakerState.HALF_OPEN
            rep.trials_in_flight = 0
        return rep.trials_in_flight < self.config.half_open_probes

    def on_dispatch(self, name: str, now: float) -> None:
        """A request went to ``name``: in half-open it takes one trial slot."""
        rep = self.blocking.get(name)
        if rep is not None and self.allows(name, now) and rep.state is BreakerState.HALF_OPEN:
            rep.trials_in_flight += 1

    def record(self, name: str, ok: bool, now: float) -> None:
        """One outcome from ``name`` (``ok`` False: connection error, 5xx, timeout before the first byte)."""
        cfg = self.config
        if not cfg.enabled:
            return
        rep = self._replicas.get(name) or self._get(name)  # (once per completion: the lookup written out)
        if rep.state is BreakerState.OPEN and now >= rep.ejected_until:
            rep.state = BreakerState.HALF_OPEN
            rep.trials_in_flight = max(rep.trials_in_flight, 1)
        if rep.state is BreakerState.OPEN:
            return  # late outcomes of requests sent before the ejection say nothing new
        if rep.state is BreakerState.HALF_OPEN:
            rep.trials_in_flight = max(0, rep.trials_in_flight - 1)
            if ok:
                self._close(rep, name, now)
            else:
                self._eject(rep, name, now, force=True)
            return
        win = rep.window
        win.append((now, ok))
        if not ok:
            rep.failures_in_window += 1
        horizon = now - cfg.error_rate_window_s
        while win and win[0][0] < horizon:
            _, old_ok = win.popleft()
            if not old_ok:
                rep.failures_in_window -= 1
        rep.consecutive = 0 if ok else rep.consecutive + 1
        if ok:
            return
        if rep.consecutive >= cfg.consecutive_failures or (
            len(win) >= cfg.error_rate_min_requests
            and rep.failures_in_window >= cfg.error_rate_threshold * len(win)
        ):
            self._eject(rep, name, now, force=False)

    def _eject(self, rep: _Replica, name: str, now: float, *, force: bool) -> None:
        cfg = self.config
        if not force and len(self.blocking) + 1 > cfg.max_ejected_fraction * len(self._replicas):
            return  # ejecting it would take out too much of the fleet: keep it, keep counting
        if now - rep.last_ejection_end > cfg.max_ejection_s and rep.state is BreakerState.CLOSED:
            rep.ejections = 0
        rep.ejections += 1
        duration = min(cfg.base_ejection_s * cfg.backoff ** (rep.ejections - 1), cfg.max_ejection_s)
        rep.state = BreakerState.OPEN
        rep.ejected_until = now + duration
        rep.trials_in_flight = 0
        self.blocking[name] = rep
        self.ejection_count += 1

    def _close(self, rep: _Replica, name: str, now: float) -> None:
        rep.state = BreakerState.CLOSED
        rep.consecutive = 0
        rep.window.clear()
        rep.failures_in_window = 0
        rep.last_ejection_end = now
        self.blocking.pop(name, None)

    def forget(self, name: str) -> None:
        """Drop a replica that left the fleet."""
        self._replicas.pop(name, None)
        self.blocking.pop(name, None)
