"""Lifecycle observers: code that wants to see every request's dispatch, first token and completion.

An observer is given to ``Lifecycle`` at construction (never attached later) and is called after the
routing policy's own hook, with the same arguments plus what is known at that point: the real token counts
(``usage``, ``None`` when the engine reported none) and the settled cost at completion. Subclass
``ObserverBase`` and override only the events you need; the others are no-ops. Observers run on the request
path (the gateway's event loop, the simulator's main loop): keep them O(1) and never let them raise.
"""

from __future__ import annotations

from typing import Protocol

from fleetgate.core.types import RequestInfo, Usage


class LifecycleObserver(Protocol):
    """What ``Lifecycle`` tells its observers; times are the driver's clock (gateway) or simulated time."""

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        """``request`` was sent to ``replica`` (once per attempt: a retry dispatches again)."""
        ...

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        """The first output of ``request`` arrived from ``replica`` (streamed requests only)."""
        ...

    def on_complete(
        self, request: RequestInfo, replica: str, now: float, usage: Usage | None, cost_mu: float, ok: bool
    ) -> None:
        """The attempt on ``replica`` ended: ``ok`` False when the replica failed it; ``cost_mu`` is the
        settled cost (from ``usage`` when known, else the estimate)."""
        ...


class ObserverBase:
    """No-op defaults for every ``LifecycleObserver`` event."""

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        return None

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        return None

    def on_complete(
        self, request: RequestInfo, replica: str, now: float, usage: Usage | None, cost_mu: float, ok: bool
    ) -> None:
        return None
