"""Dispatch gate: hold requests in front of a saturated fleet and release the shortest prefill first.

Engines run their waiting requests first come, first served, and a prefill that has started cannot be
overtaken, so a short prompt sent to a replica behind a long one waits for all of it. The gate keeps such
requests at the gateway while every replica still has prefill queued (the policy's own estimate, see
``FleetgatePolicy.backlog_s``) and, when one drains to within ``lead_s``, releases the waiting request with
the smallest ``prefill_s - aging * waited_s`` (shortest job first, with aging so no request starves); the
policy then picks where it goes, at the moment a replica can start it (late binding).

Sans-IO: the caller passes the fleet's backlog and the time; the gate never sleeps or reads a clock. The
gateway's shell (``gateway/gate.py``) and the simulator (``sim/des.py``) drive the same object.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
_EPS = 1e-6  # seconds: a wake-up computed from the backlog lands within float rounding of the lead


@dataclass(frozen=True, slots=True)
class GateParams:
    """``lead_s``: release when the least-loaded replica's queued prefill ends within this many seconds (the
    request's own trip to the engine overlaps it); ``aging``: seconds of priority gained per second waited
    (0: pure shortest-first, large: first come, first served); ``max_queued``: beyond this many held
    requests new ones go straight to routing (never refuse because of the gate); ``max_wait_s``: a request
    held this long is released whatever the estimate says (a safety valve for a wrong engine rate)."""

    lead_s: float = 0.05
    aging: float = 0.25
    max_queued: int = 4096
    max_wait_s: float = 10.0

    def __post_init__(self) -> None:
        if self.lead_s < 0 or self.aging < 0 or self.max_queued < 0 or self.max_wait_s <= 0:
            raise ValueError("gate needs lead_s >= 0, aging >= 0, max_queued >= 0 and max_wait_s > 0")


class DispatchGate(Generic[T]):
    """Held requests ordered by ``prefill_s + aging * enqueued_at`` (the same order as ``prefill_s - aging *
    waited`` at any instant, so a heap keeps it without re-sorting). Removal is lazy: a released or removed
    request leaves the live map and its heap and arrival-order entries are skipped when they come up."""

    def __init__(self, params: GateParams | None = None) -> None:
        self.params = params or GateParams()
        self._heap: list[tuple[float, int]] = []  # (order key, seq)
        self._fifo: deque[int] = deque()  # seqs in arrival order (for the max-wait valve)
        self._live: dict[int, tuple[float, T]] = {}  # seq -> (enqueued_at, item), for items still held
        self._seq = itertools.count()
        self._of: dict[int, int] = {}  # id(item) -> seq, for remove()
        self.held_total = 0
        self.released_total = 0
        self.timed_out = 0

    def __len__(self) -> int:
        return len(self._live)

    def should_hold(self, backlog_s: float) -> bool:
        """Whether a new request must wait: others already wait (no overtaking them on arrival), or every
        replica has more than ``lead_s`` of prefill queued. Never when the queue is full."""
        if len(self._live) >= self.params.max_queued:
            return False
        return bool(self._live) or backlog_s > self.params.lead_s + _EPS

    def push(self, item: T, prefill_s: float, now: float) -> None:
        seq = next(self._seq)
        heapq.heappush(self._heap, (prefill_s + self.params.aging * now, seq))
        self._fifo.append(seq)
        self._live[seq] = (now, item)
        self._of[id(item)] = seq
        self.held_total += 1

    def remove(self, item: T) -> bool:
        """Forget a held item (its client went away); False if it was not held."""
        seq = self._of.pop(id(item), None)
        return seq is not None and self._live.pop(seq, None) is not None

    def _oldest(self) -> int | None:
        fifo, live = self._fifo, self._live
        while fifo and fifo[0] not in live:
            fifo.popleft()
        return fifo[0] if fifo else None

    def _take(self, seq: int) -> T:
        _, item = self._live.pop(seq)
        self._of.pop(id(item), None)
        self.released_total += 1
        return item

    def pop(self, backlog_s: float, now: float) -> T | None:
        """The next request to release, or ``None`` while the fleet is saturated (or nothing is held)."""
        oldest = self._oldest()
        if oldest is None:
            return None
        if self._live[oldest][0] + self.params.max_wait_s <= now:
            self.timed_out += 1
            return self._take(oldest)  # the valve: out of heap order
        if backlog_s > self.params.lead_s + _EPS:
            return None
        heap, live = self._heap, self._live
        while heap:
            seq = heapq.heappop(heap)[1]
            if seq in live:
                return self._take(seq)
        return None

    def next_wake(self, backlog_s: float, now: float) -> float | None:
        """When ``pop`` may next release something (``None``: nothing held)."""
        oldest = self._oldest()
        if oldest is None:
            return None
        return min(
            now + max(backlog_s - self.params.lead_s, 0.0), self._live[oldest][0] + self.params.max_wait_s
        )
