"""The asyncio shell around a deployment's dispatch gate (``core.routing.gate``, driven through
``core.lifecycle.Lifecycle``): held requests wait on a future, one timer wakes the gate when the policy
expects a replica to be free.

A released request resumes in the same loop turn, before the next drain runs (``call_soon`` is FIFO), and
its pick and ``on_dispatch`` are synchronous, so the backlog the next drain reads already counts it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fleetgate.core.lifecycle import Lifecycle
from fleetgate.core.types import RequestInfo

#: ``call_later(delay_s, callback) -> handle with cancel()``: the event loop's, or a test's virtual timer.
CallLater = Callable[[float, Callable[[], None]], Any]


class GateShell:
    """Drives the gate of one deployment's ``lifecycle`` with futures and a timer. ``clock`` and
    ``call_later`` are the shell's only reads of time (default timer: the running loop's ``call_later``)."""

    def __init__(
        self,
        lifecycle: Lifecycle[asyncio.Future[None]],
        clock: Callable[[], float],
        call_later: CallLater | None = None,
    ) -> None:
        self.lifecycle = lifecycle
        self.clock = clock
        self._call_later = call_later
        self._timer: Any = None
        self._timer_at: float | None = None
        self._drain_soon = False

    def held(self) -> int:
        return self.lifecycle.held()

    async def wait_turn(self, info: RequestInfo) -> float:
        """Return when the request may be routed; the seconds it was held (0.0 when not held)."""
        now = self.clock()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self.lifecycle.hold(fut, info, now):
            return 0.0
        self._drain()
        try:
            await fut
        except asyncio.CancelledError:
            self.lifecycle.forget(fut)  # the client left while held: nothing was sent anywhere
            raise
        return self.clock() - now

    def _drain(self) -> None:
        """Release the next held request if a replica is (nearly) free, else arm the timer."""
        self._drain_soon = False
        now = self.clock()
        lifecycle = self.lifecycle
        backlog = lifecycle.backlog_s(now)
        while True:
            fut = lifecycle.release(backlog, now)
            if fut is None:
                break
            if fut.done():  # cancelled between its release and now
                continue
            fut.set_result(None)
            # The released request routes (and raises the backlog) when its task runs; drain again after it.
            self._drain_soon = True
            asyncio.get_running_loop().call_soon(self._drain)
            return
        wake = lifecycle.next_wake(backlog, now)
        if wake is None:
            return
        if self._timer is not None:
            if self._timer_at is not None and self._timer_at <= wake:
                return  # an earlier (or the same) wake-up is already armed
            self._timer.cancel()
        self._timer_at = wake
        call_later = self._call_later or asyncio.get_running_loop().call_later
        self._timer = call_later(max(wake - now, 0.0), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if not self._drain_soon:
            self._drain()

    def close(self) -> None:
        """Release everything still held (shutdown): the requests go on to routing, none is dropped."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self.lifecycle.held():
            fut = self.lifecycle.release(0.0, self.clock())
            if fut is None:
                break
            if not fut.done():
                fut.set_result(None)
