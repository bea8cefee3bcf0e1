"""Background tasks of the asyncio shells: the one way they are stopped."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` (``None``: nothing to do) and wait until it has finished; the ``CancelledError`` it
    ends with is not raised here."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
