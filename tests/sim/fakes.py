"""A deliberately simple engine for testing the simulator's plumbing (not its performance model).

Fake because the point of these tests is the event loop, routing calls and bookkeeping; the real engine
model (simengine.perfmodel) is exercised by the other sim tests. Same interface as perfmodel.EngineModel.
"""

from __future__ import annotations

import heapq

from fleetgate.simengine.perfmodel import EngineRequest, StepResult


class FixedLatencyEngine:
    """Every request: first token after ``ttft`` s, then ``per_token`` s per output token; no queueing."""

    def __init__(self, ttft: float = 0.1, per_token: float = 0.01) -> None:
        self.ttft = ttft
        self.per_token = per_token
        self.now = 0.0
        self._events: list[tuple[float, int, str]] = []
        self.submitted: list[str] = []
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    def fits(self, input_tokens: int, max_output_tokens: int) -> bool:
        return True

    def submit(self, request: EngineRequest, now: float) -> None:
        self.now = max(self.now, now)
        self.submitted.append(request.request_id)
        first = self.now + self.ttft
        heapq.heappush(self._events, (first, 0, request.request_id))
        heapq.heappush(
            self._events, (first + self.per_token * request.max_output_tokens, 1, request.request_id)
        )

    def advance(self, until: float) -> StepResult:
        res = StepResult(start=self.now, end=until)
        while self._events and self._events[0][0] <= until:
            tt, kind, rid = heapq.heappop(self._events)
            if kind == 0:
                res.first_token[rid] = tt
                res.cached_tokens[rid] = 0
            else:
                res.finished[rid] = tt
        self.now = max(self.now, until)
        return res

    def next_event_time(self) -> float | None:
        return self._events[0][0] if self._events else None

    @property
    def num_waiting(self) -> int:
        return 0

    @property
    def num_running(self) -> int:
        return len(self._events) // 2

    @property
    def kv_usage(self) -> float:
        return 0.0
