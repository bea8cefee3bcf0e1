"""The routing interface shared by the live gateway and the simulator.

A policy is a plain object: ``pick`` is a pure function of its arguments plus the policy's own bookkeeping,
which it updates only through ``on_dispatch`` / ``on_complete``. It never sees HTTP, clocks or global state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fleetgate.core.types import RandomSource, ReplicaSnapshot, RequestInfo, RouteDecision


class RoutingPolicy(Protocol):
    """Chooses a replica for a request. Raise ``ServiceUnavailableError`` when none is routable."""

    name: str

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

    def on_complete(self, request: RequestInfo, replica: str, now: float, cost_mu: float, ok: bool) -> None:
        """The request finished on ``replica`` with settled cost ``cost_mu``.

        ``ok`` is False when the replica failed it (connection error, 5xx, timeout before the first byte):
        policies feed this to their outlier detector. Client errors and disconnects count as ``ok``.
        """
        ...
