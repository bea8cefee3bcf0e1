"""The simulated engine's driver: runs the pure performance model against a real-time clock.

One asyncio task runs the :class:`~fleetgate.simengine.perfmodel.EngineModel`. Model time is mapped to real
time by the time scale (real seconds per model second; 0 = as fast as possible): the driver sleeps until the
model's next event (or at most ``quantum_s`` so long decode runs still stream smoothly), advances the model
to "now" and hands the emitted tokens to the waiting HTTP handlers through their :class:`Live` records. When
idle it waits on a future that a new request resolves, so an idle engine costs nothing. A hung engine
freezes the clock; a slow one scales it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from fleetgate.simengine.metrics import EngineMetrics
from fleetgate.simengine.perfmodel import EngineModel, EngineRequest, StepResult
from fleetgate.tasks import cancel_and_wait


class Live:
    """One sequence on its way through the engine (one choice of a request), shared by the driver and the
    HTTP handler. ``waiter`` is the handler's wake-up future; a request's choices share one."""

    __slots__ = ("arrival", "cached", "done", "model_id", "tokens", "waiter")

    def __init__(self, model_id: str, arrival: float) -> None:
        self.model_id = model_id
        self.arrival = arrival
        self.tokens = 0  # tokens emitted so far
        self.cached = 0  # prompt tokens served from the prefix cache
        self.done = False
        self.waiter: asyncio.Future[None] | None = None


class EngineDriver:
    """Owns the model, its clock mapping and the live sequences; ``start()`` inside a running loop."""

    def __init__(self, model: EngineModel, metrics: EngineMetrics, *, time_scale: float, quantum_s: float):
        self.model = model
        self.metrics = metrics
        self.quantum_s = quantum_s
        self.live: dict[str, Live] = {}
        self.scale = time_scale
        self._hung = False
        self._vclock = 0.0  # model time reached by the driver (frozen while hung)
        self._v0 = 0.0  # model time at real time _r0 (when the time scale is > 0)
        self._r0 = 0.0
        self._wake_fut: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._task is not None:
            return
        self.loop = asyncio.get_running_loop()
        self._r0 = self.loop.time()
        self._task = asyncio.create_task(self._drive(), name="simengine-driver")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def now(self) -> float:
        """Real (loop) time."""
        return self.loop.time() if self.loop is not None else 0.0

    # ------------------------------------------------------------------ clock
    def vnow(self) -> float:
        """Current model time."""
        if self._hung or self.scale == 0 or self.loop is None:
            return self._vclock
        return self._v0 + (self.loop.time() - self._r0) / self.scale

    def set_clock(self, *, scale: float, hung: bool) -> None:
        """Change the clock mapping (a slow or hung fault) without a jump in model time, and wake every
        waiting handler (streams stalled by a previous fault resume when it is cleared)."""
        v = self.vnow()
        self._vclock = v
        self._v0 = v
        self._r0 = self.now()
        self.scale = scale
        self._hung = hung
        self.wake()
        for live in self.live.values():
            _resolve_waiter(live)

    def wake(self) -> None:
        fut = self._wake_fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def _sleep(self, delay: float | None) -> None:
        """Sleep up to ``delay`` seconds (forever when None) or until ``wake``."""
        assert self.loop is not None
        fut: asyncio.Future[None] = self.loop.create_future()
        self._wake_fut = fut
        handle = self.loop.call_later(delay, _resolve, fut) if delay is not None else None
        try:
            await fut
        finally:
            if handle is not None:
                handle.cancel()
            self._wake_fut = None

    # ------------------------------------------------------------------ sequences
    def submit(self, live: Live, request: EngineRequest) -> None:
        self.live[live.model_id] = live
        self.model.submit(request, self.vnow())
        self.wake()

    def release(self, live: Live) -> None:
        """Forget ``live``; cancel it in the model if it has not finished."""
        self.live.pop(live.model_id, None)
        if not live.done:
            self.model.cancel(live.model_id, self.vnow())
            self.wake()

    async def wait(self, lives: Iterable[Live]) -> None:
        """Until the driver has news for any of ``lives`` (tokens, finish) or the fault changes."""
        assert self.loop is not None
        fut: asyncio.Future[None] = self.loop.create_future()
        group = list(lives)
        for live in group:
            live.waiter = fut
        try:
            await fut
        finally:
            for live in group:
                live.waiter = None

    # ------------------------------------------------------------------ driver
    async def _drive(self) -> None:
        assert self.loop is not None
        loop = self.loop
        model = self.model
        while True:
            if self._hung:
                await self._sleep(None)
                continue
            t_next = model.next_event_time()
            if t_next is None:
                await self._sleep(None)
                continue
            scale = self.scale
            if scale == 0:
                res = model.advance(t_next)
                self._vclock = t_next
                self._publish(res)
                await asyncio.sleep(0)
                continue
            due = self._r0 + (t_next - self._v0) * scale
            now = loop.time()
            if due > now:
                await self._sleep(min(due - now, self.quantum_s))
                if self._hung or self.scale != scale:
                    continue
                now = loop.time()
            v = self._v0 + (now - self._r0) / scale
            if now >= due:
                v = max(v, t_next)
            res = model.advance(v)
            self._vclock = v
            if res.emitted or res.finished:
                self._publish(res)

    def _publish(self, res: StepResult) -> None:
        live_map = self.live
        for rid, cached in res.cached_tokens.items():
            live = live_map.get(rid)
            if live is not None:
                live.cached = cached
        ttft = self.metrics.ttft
        now = self.now()
        for rid, n in res.emitted.items():
            live = live_map.get(rid)
            if live is not None:
                if live.tokens == 0:
                    ttft.observe(now - live.arrival)
                live.tokens += n
                _resolve_waiter(live)
        for rid in res.finished:
            live = live_map.get(rid)
            if live is not None:
                live.done = True
                _resolve_waiter(live)


def _resolve_waiter(live: Live) -> None:
    waiter = live.waiter
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
