"""The routing interface shared by the live gateway and the simulator.

A policy is a plain object: ``pick`` is a pure function of its arguments plus the policy's own bookkeeping,
which it updates only through the hooks ``on_dispatch`` / ``on_first_token`` / ``on_complete``. It never sees
HTTP, clocks or global state. ``core.lifecycle.Lifecycle`` calls every hook unconditionally; ``PolicyBase``
gives the no-op defaults (and "no dispatch gate"), so a policy defines only what it uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from fleetgate.core.routing.gate import DispatchGate
from fleetgate.core.types import RandomSource, ReplicaSnapshot, RequestInfo, RouteDecision


class RoutingPolicy(Protocol):
    """Chooses a replica for a request. Raise ``ServiceUnavailableError`` when none is routable."""

    name: str
    #: The dispatch gate (``core.routing.gate``) in front of this policy's picks, or ``None`` (no gate).
    gate: DispatchGate[Any] | None
    #: Whether it reads ``RequestInfo.prefix_hashes`` (the gateway hashes prompts only for those that do).
    uses_prefix_hashes: bool
    #: Whether the deployment's engine-rate learner should also learn from busy replicas
    #: (``core.engine_rates.BusyRateLearner``; fleetgate's ``rate_learning: busy``).
    learns_rates_busy: bool

    def pick(
        self,
        request: RequestInfo,
        replicas: Sequence[ReplicaSnapshot],
        now: float,
        rng: RandomSource,
        exclude: frozenset[str] = frozenset(),
    ) -> RouteDecision:
        """Pick one replica; ``exclude`` holds replicas already tried for this request (retries)."""
        ...

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        """The request was sent to ``replica``."""
        ...

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        """The first output of the request arrived from ``replica`` (its prefill is done)."""
        ...

    def on_complete(self, request: RequestInfo, replica: str, now: float, cost_mu: float, ok: bool) -> None:
        """The request finished on ``replica`` with settled cost ``cost_mu``.

        ``ok`` is False when the replica failed it (connection error, 5xx, timeout before the first byte):
        policies feed this to their outlier detector. Client errors and disconnects count as ``ok``.
        """
        ...

    def backlog_s(self, replicas: Sequence[ReplicaSnapshot], now: float) -> float:
        """Seconds until the least-loaded replica can start a new prefill (drives ``gate``)."""
        ...

    def gate_prefill_s(self, request: RequestInfo) -> float:
        """The request's expected prefill seconds (the gate's shortest-first order)."""
        ...

    def tail_bound_drops(self) -> int:
        """Candidate replicas its tail bound (``filters.tail_bound``) dropped since start; 0 without one."""
        ...


class PolicyBase:
    """No-op defaults for the optional parts of ``RoutingPolicy``: hooks that ignore their event, no gate."""

    gate: DispatchGate[Any] | None = None
    #: reads ``RequestInfo.prefix_hashes`` (unknown policies: yes; the gateway skips hashing otherwise)
    uses_prefix_hashes: bool = True
    #: the engine-rate learner learns from requests that ran alone only (the default learner)
    learns_rates_busy: bool = False

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        return None

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        return None

    def on_complete(self, request: RequestInfo, replica: str, now: float, cost_mu: float, ok: bool) -> None:
        return None

    def backlog_s(self, replicas: Sequence[ReplicaSnapshot], now: float) -> float:
        return 0.0

    def gate_prefill_s(self, request: RequestInfo) -> float:
        return 0.0

    def tail_bound_drops(self) -> int:
        return 0
