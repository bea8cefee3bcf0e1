"""One background step run every few seconds, started and stopped with the gateway (``server.add_service``).

Stopping lets a step under way finish (up to ``stop_timeout_s``) instead of cancelling it midway: a Redis
call cancelled in the middle can leave the client's connection pool waiting for good. A step that raises
is logged and the next one runs on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from fleetgate.tasks import cancel_and_wait

log = logging.getLogger("fleetgate.periodic")


class Periodic:
    """``step()`` every ``interval_s`` (first after one interval) between ``start()`` and ``stop()``."""

    def __init__(
        self,
        name: str,
        step: Callable[[], Awaitable[None]],
        interval_s: float,
        *,
        stop_timeout_s: float = 5.0,
        quiet: tuple[type[BaseException], ...] = (),
    ) -> None:
        """``quiet``: exceptions logged at debug level only (an unreachable store, retried next round)."""
        self.name = name
        self.step = step
        self.interval_s = interval_s
        self.stop_timeout_s = stop_timeout_s
        self.quiet = quiet
        self.errors_total = 0
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is None:
            self._stopping = asyncio.Event()
            self._task = asyncio.create_task(self._run(), name=f"fleetgate-{self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), self.stop_timeout_s)
        except TimeoutError:
            await cancel_and_wait(task)

    async def _run(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.interval_s)
            if self._stopping.is_set():
                return
            try:
                await self.step()
            except self.quiet as exc:
                self.errors_total += 1
                log.debug("%s: step failed: %s", self.name, exc)
            except Exception:  # keep stepping; the next round may succeed
                self.errors_total += 1
                log.exception("%s: step failed", self.name)
