"""Pure, deterministic performance model of a continuous-batching LLM engine (vLLM-like).

Used by the simulated engine server (``fleetgate engine sim``) and by the fleet simulator (``fleetgate.sim``).
No asyncio, clocks or randomness: the caller passes time in, so the same inputs give the same outputs.

Vocabulary
----------
*iteration*: one forward pass of the engine. Every running request gets either one decode token or a chunk of
its prompt (prefill); the iteration's duration comes from :class:`PerfParams` (equations below).
*segment*: what the model has in flight. Either one iteration (when prefills, admissions or preemptions are
involved), or a *macro* run of ``k`` pure-decode iterations during which the batch does not change (no
request finishes, nothing can be admitted, the KV cache does not overflow). A macro segment is applied
lazily, so its cost is O(batch) however many tokens it covers; that is what makes fleet simulation fast.

Iteration time (seconds)::

    dt = step_overhead_s
       + decode_s_per_seq * D + decode_s_per_kv_token * K
       + prefill_s_per_token * P + prefill_s_per_token_sq * sum_i n_i * (2 c_i + n_i)

with ``D`` decode requests in the batch, ``K`` the KV tokens those decode requests hold before the iteration,
``P`` prompt tokens computed in the iteration and, per prefill chunk ``i``, ``n_i`` new tokens after ``c_i``
already-computed ones. The attention term ``n (2c + n) = (c + n)^2 - c^2`` makes a whole prompt of ``L``
tokens cost ``prefill_s_per_token_sq * L^2`` however it is chunked. During a macro segment ``K`` grows by
``D`` per iteration, so ``k`` iterations take ``k * dt_0 + decode_s_per_kv_token * D * k * (k - 1) / 2``.

Scheduling (vLLM V1 semantics, simplified)
------------------------------------------
- Running requests are served in rank order ``(priority, arrival sequence)``: lower ``priority`` first, as in
  vLLM's ``--scheduling-policy priority`` (with equal priorities this is FCFS).
- A token budget per iteration (``max_num_batched_tokens``, chunked prefill; ``None`` = unlimited) is spent on
  running requests in rank order (one decode token, or the next prompt chunk, each), then on admitting
  waiting requests.
- KV cache: ``kv_capacity_tokens`` in blocks of ``block_tokens``. A request holds
  ``ceil((computed prompt tokens + generated tokens) / block_tokens)`` blocks. Waiting requests are admitted
  at the head of the priority queue only (head-of-line blocking, like vLLM) while there are free sequence
  slots (``max_num_seqs``), budget and blocks for the first chunk. When a running request needs a block and
  none is free, the lowest-ranked running request is preempted (recompute: its blocks are freed and it goes
  back to the waiting queue keeping its generated tokens, which it re-prefills). No admission happens in an
  iteration that preempted.
- Prefix cache: an LRU of block hashes (``prefix_cache_blocks`` entries; a separate pool from the KV
  accounting, a simplification of vLLM's shared pool). At admission the leading hashes of the request that
  are cached give ``cached_tokens = matched_blocks * hash_block_tokens`` (at most prompt - 1: the last prompt
  token is always recomputed); those tokens skip prefill. When a prompt's prefill completes its hashes are
  inserted. ``prefix_cache_queries`` / ``prefix_cache_hits`` count tokens, like vLLM's counters.
- The iteration that completes a prompt samples the first output token (TTFT = end of that iteration). A
  request generates exactly ``max_output_tokens`` tokens (callers decide EOS/stop lengths up front).

Time semantics
--------------
Scheduling decisions of an iteration are taken (and applied to the state) when it starts; its outputs
(tokens, first-token times, finishes) are reported when it ends. A request submitted while an iteration runs
joins at the next iteration boundary (a macro segment in flight is cut at that boundary). Planning is lazy:
the next segment is planned only when ``next_event_time()`` is asked or ``advance`` moves past its start, so
every request submitted at the same instant (before that question) joins the same iteration. Gauges
(``num_running``) count requests of planned iterations; requests not yet planned count as waiting.

API
---
``model = EngineModel(PerfParams(...))``

- ``model.submit(EngineRequest(...), now)``: enqueue; starts work at ``now`` if the engine was idle.
- ``model.cancel(request_id, now=None) -> bool``: drop a waiting or running request (client disconnect).
- ``model.next_event_time() -> float | None``: end of the segment in flight (when the batch changes next if
  nothing is submitted), ``None`` when idle. A discrete-event simulator schedules one event there.
- ``model.advance(until) -> StepResult``: apply every iteration that ends at or before ``until`` (starting
  the following segments as it goes); an iteration still running at ``until`` stays in flight.
  ``advance(model.next_event_time())`` completes exactly the segment in flight.
- ``model.step() -> StepResult``: complete the segment in flight, whatever its end time.
- Counters: ``num_running``, ``num_waiting``, ``kv_usage`` (0..1), ``prefix_cache_queries``,
  ``prefix_cache_hits``, ``prompt_tokens``, ``generation_tokens``, ``preemptions``, ``requests_finished``,
  ``requests_cancelled``; ``stats()`` returns them all as an :class:`EngineStats`.

``EngineModel(params, macro=False)`` runs one iteration per segment; results are identical up to float
rounding (the unit tests check it).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from operator import attrgetter
from pathlib import Path
from typing import Any

__all__ = [
    "EngineModel",
    "EngineRequest",
    "EngineStats",
    "PerfParams",
    "PrefixCache",
    "StepResult",
]


@dataclass(frozen=True, slots=True)
class PerfParams:
    """Engine parameters. Defaults sketch an 8B model on one datacenter GPU (documented in docs/simengine.md).

    ``prefix_cache_blocks=None`` means as many blocks as the KV cache has; 0 disables the prefix cache.
    ``max_num_batched_tokens=None`` disables chunked prefill (a whole prompt is computed in one iteration).
    """

    max_num_seqs: int = 256
    kv_capacity_tokens: int = 131_072
    block_tokens: int = 16
    max_num_batched_tokens: int | None = 8192
    prefix_cache_blocks: int | None = None
    step_overhead_s: float = 0.004
    prefill_s_per_token: float = 5e-5
    prefill_s_per_token_sq: float = 0.0
    decode_s_per_seq: float = 1.2e-4
    decode_s_per_kv_token: float = 1e-8
    max_model_len: int = 32_768

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        if self.kv_capacity_tokens < self.block_tokens:
            raise ValueError("kv_capacity_tokens must hold at least one block")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1 or null")
        if self.prefix_cache_blocks is not None and self.prefix_cache_blocks < 0:
            raise ValueError("prefix_cache_blocks must be >= 0 or null")
        if self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        for name, value in (
            ("step_overhead_s", self.step_overhead_s),
            ("prefill_s_per_token", self.prefill_s_per_token),
            ("prefill_s_per_token_sq", self.prefill_s_per_token_sq),
            ("decode_s_per_seq", self.decode_s_per_seq),
            ("decode_s_per_kv_token", self.decode_s_per_kv_token),
        ):
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0")
        if self.step_overhead_s <= 0:
            raise ValueError("step_overhead_s must be > 0 (every iteration takes some time)")

    @property
    def kv_blocks(self) -> int:
        """KV cache size in blocks."""
        return self.kv_capacity_tokens // self.block_tokens

    @property
    def cache_blocks(self) -> int:
        """Prefix cache capacity in block hashes."""
        return self.kv_blocks if self.prefix_cache_blocks is None else self.prefix_cache_blocks

    def with_overrides(self, **overrides: Any) -> PerfParams:
        """A copy with some fields replaced (``None`` values are ignored)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PerfParams:
        """Build from a mapping of field names; unknown keys are an error (typos should not pass silently)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"unknown perf parameter(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**dict(data))

    @classmethod
    def from_yaml(cls, path: str | Path) -> PerfParams:
        """Load a YAML profile: a mapping of field names (optionally under a top-level ``perf:`` key)."""
        import yaml

        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: a perf profile must be a YAML mapping")
        if "perf" in data and isinstance(data["perf"], Mapping):
            data = data["perf"]
        return cls.from_mapping(data)

    def iteration_time(
        self, decode_seqs: int, decode_kv_tokens: int, prefill_chunks: Iterable[tuple[int, int]]
    ) -> float:
        """Duration of one iteration; ``prefill_chunks`` holds ``(new_tokens, already_computed)`` pairs."""
        dt = (
            self.step_overhead_s
            + self.decode_s_per_seq * decode_seqs
            + self.decode_s_per_kv_token * decode_kv_tokens
        )
        for n, c in prefill_chunks:
            dt += self.prefill_s_per_token * n + self.prefill_s_per_token_sq * n * (2 * c + n)
        return dt


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One request as the engine sees it.

    ``block_hashes`` are chained prefix hashes of the prompt (``core.tokenize.block_hashes`` or a trace's
    ``hash_ids``), each covering ``hash_block_tokens`` tokens (default: the engine's ``block_tokens``).
    ``max_output_tokens`` is the exact number of tokens the request will generate. ``prompt_tokens``: the
    engine's own token ids of the prompt where the caller knows them (``simengine.llamaserver`` matches token
    prefixes with them; this model uses the block hashes only).
    """

    request_id: str
    input_tokens: int
    max_output_tokens: int
    block_hashes: tuple[int, ...] = ()
    priority: int = 0
    hash_block_tokens: int | None = None
    prompt_tokens: tuple[int, ...] = ()


@dataclass(slots=True)
class StepResult:
    """What became visible between two calls: times are model time (seconds).

    ``emitted``: output tokens per request (first token included); ``first_token``: request -> time of its
    first token; ``finished``: request -> completion time; ``cached_tokens``: prefix-cache hit tokens of
    requests admitted for the first time; ``admitted``: request -> time it first started running;
    ``preempted``: ids preempted (in order); ``iterations``: iterations completed; ``start``/``end``: the
    model time span covered.
    """

    start: float
    end: float
    iterations: int = 0
    emitted: dict[str, int] = field(default_factory=dict)
    first_token: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    cached_tokens: dict[str, int] = field(default_factory=dict)
    admitted: dict[str, float] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)


def _new_result(start: float, end: float) -> StepResult:
    """``StepResult(start=start, end=end)`` without the generated ``__init__`` (keyword arguments, a factory
    call per container): ``advance`` builds one per call, several per simulated request."""
    res: StepResult = _new_object(StepResult)
    res.start = start
    res.end = end
    res.iterations = 0
    res.emitted = {}
    res.first_token = {}
    res.finished = {}
    res.cached_tokens = {}
    res.admitted = {}
    res.preempted = []
    return res


_new_object = object.__new__


@dataclass(frozen=True, slots=True)
class EngineStats:
    """The model's gauges and counters at one moment (vLLM metric equivalents in docs/simengine.md)."""

    num_running: int
    num_waiting: int
    kv_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    requests_finished: int
    requests_cancelled: int


class PrefixCache:
    """LRU set of chained block hashes; a prompt hits as far as its leading hashes are present."""

    __slots__ = ("_lru", "capacity")

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._lru

    def match(self, hashes: Iterable[int]) -> int:
        """Number of leading hashes present (no LRU update)."""
        lru = self._lru
        n = 0
        for h in hashes:
            if h not in lru:
                break
            n += 1
        return n

    def touch(self, hashes: Iterable[int]) -> None:
        """Mark present hashes as recently used."""
        lru = self._lru
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)

    def insert(self, hashes: Iterable[int]) -> None:
        """Add (or refresh) hashes, evicting the least recently used beyond capacity."""
        if self.capacity <= 0:
            return
        lru = self._lru
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        while len(lru) > self.capacity:
            lru.popitem(last=False)


class _Req:
    """Mutable per-request state inside the model."""

    __slots__ = (
        "blocks",
        "cached",
        "cancelled",
        "computed",
        "first_token_time",
        "generated",
        "hashes",
        "hbt",
        "input_tokens",
        "kv",
        "max_out",
        "priority",
        "rid",
        "seq",
        "started",
        "target",
    )

    def __init__(self, req: EngineRequest, seq: int, hbt: int) -> None:
        self.rid = req.request_id
        self.input_tokens = req.input_tokens
        self.max_out = req.max_output_tokens
        self.hashes = req.block_hashes
        self.hbt = hbt
        self.priority = req.priority
        self.seq = seq
        self.generated = 0
        self.computed = 0
        self.target = req.input_tokens  # tokens to (re)compute before the next sample
        self.kv = 0
        self.blocks = 0
        self.cached = 0
        self.first_token_time: float | None = None
        self.started = False
        self.cancelled = False


_STEP = 0
_MACRO = 1


class _Segment:
    """The work in flight: one iteration (applied at start) or ``k`` lazily-applied decode iterations."""

    __slots__ = (
        "admitted",
        "base",
        "changed",
        "d",
        "emits",
        "end",
        "finishing",
        "first",
        "k",
        "kind",
        "kv0",
        "preempted",
        "reqs",
        "slope",
        "start",
    )

    def __init__(self, kind: int, start: float, end: float) -> None:
        self.kind = kind
        self.start = start
        self.end = end
        self.k = 1
        self.base = 0.0  # macro: duration of the first iteration
        self.slope = 0.0  # macro: growth of the iteration time per iteration
        self.d = 0  # macro: requests in the batch
        self.kv0 = 0  # macro: KV tokens the batch holds at ``start``
        self.changed = False  # macro: a request was submitted or cancelled while it was in flight
        # The lists are set by the planner of each kind (``_try_macro``: ``reqs``; ``_plan_step``: the rest),
        # so that a segment allocates only what it uses.
        self.reqs: list[_Req]  # macro: the batch
        self.emits: list[_Req]  # step: requests that emit one token at the end
        self.first: list[_Req]  # step: requests whose first token comes at the end
        self.finishing: list[_Req]
        self.admitted: list[tuple[str, int]]  # step: (request id, cached tokens) admitted first time
        self.preempted: list[str]

    def cum(self, j: int) -> float:
        """Duration of the first ``j`` iterations of a macro segment."""
        return j * self.base + self.slope * (j * (j - 1) / 2)

    def iterations_ending_by(self, until: float) -> int:
        """Largest ``j <= k`` with ``start + cum(j) <= until``."""
        if self.end <= until:  # ``end`` is always ``start + cum(k)``
            return self.k
        x = until - self.start
        if x <= 0 or self.start + self.base > until:  # cum(1) == base
            return 0
        if self.slope > 0:
            a, b = self.slope / 2, self.base - self.slope / 2
            j = int((-b + math.sqrt(b * b + 4 * a * x)) / (2 * a))
        else:
            j = int(x / self.base)
        j = max(0, min(j, self.k))
        while j < self.k and self.start + self.cum(j + 1) <= until:
            j += 1
        while j > 0 and self.start + self.cum(j) > until:
            j -= 1
        return j

    def first_boundary_at_or_after(self, now: float) -> int:
        """Smallest ``j >= 1`` with ``start + cum(j) >= now`` (capped at ``k``)."""
        j = max(1, self.iterations_ending_by(now))
        while j < self.k and self.start + self.cum(j) < now:
            j += 1
        return j


def _blocks(tokens: int, bt: int) -> int:
    return -(-tokens // bt)


class EngineModel:
    """Step-based continuous-batching engine; see the module docstring for the model and the API."""

    def __init__(
        self, params: PerfParams | None = None, *, macro: bool = True, track_emitted: bool = True
    ) -> None:
        self.params = params or PerfParams()
        self.macro = macro
        # ``False`` leaves ``StepResult.emitted`` empty (callers that only need first tokens and finishes,
        # such as the fleet simulator, skip one dict update per request and iteration).
        self.track_emitted = track_emitted
        self.cache = PrefixCache(self.params.cache_blocks)
        self._total_blocks = self.params.kv_blocks
        self._used_blocks = 0
        self._reqs: dict[str, _Req] = {}
        self._running: list[_Req] = []  # kept sorted by rank
        self._waiting: list[tuple[int, int, _Req]] = []  # heap of (priority, seq, req)
        self._n_waiting = 0
        self._n_prefilling = 0  # running requests still computing their prompt
        self._seq = 0
        self._seg: _Segment | None = None
        self._pending: float | None = None  # start time of a segment not planned yet
        self._now = 0.0
        # counters
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.requests_finished = 0
        self.requests_cancelled = 0

    # ------------------------------------------------------------------ gauges
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return self._n_waiting

    @property
    def kv_usage(self) -> float:
        return self._used_blocks / self._total_blocks

    @property
    def busy(self) -> bool:
        return self._seg is not None or self._pending is not None

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._reqs

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            kv_usage=self.kv_usage,
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens,
            preemptions=self.preemptions,
            requests_finished=self.requests_finished,
            requests_cancelled=self.requests_cancelled,
        )

    def fits(self, input_tokens: int, max_output_tokens: int) -> bool:
        """Whether a request of this size can ever complete here (prompt + output within the KV cache)."""
        return (  # (``_blocks`` written out: twice per simulated request)
            input_tokens >= 1
            and max_output_tokens >= 1
            and -(-(input_tokens + max_output_tokens) // self.params.block_tokens) <= self._total_blocks
        )

    # ------------------------------------------------------------------ inputs
    def submit(self, request: EngineRequest, now: float) -> None:
        """Enqueue ``request`` at model time ``now``; ``ValueError`` for invalid or impossible requests."""
        if request.request_id in self._reqs:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.input_tokens < 1 or request.max_output_tokens < 1:
            raise ValueError("input_tokens and max_output_tokens must be >= 1")
        if not self.fits(request.input_tokens, request.max_output_tokens):
            raise ValueError(
                f"request needs {request.input_tokens + request.max_output_tokens} KV tokens, "
                f"more than the engine's {self.params.kv_capacity_tokens}"
            )
        if self._pending is not None and now > self._pending:
            self._ensure_planned()
        self._now = max(self._now, now)
        r = _Req(request, self._seq, request.hash_block_tokens or self.params.block_tokens)
        self._seq += 1
        self._reqs[r.rid] = r
        heapq.heappush(self._waiting, (r.priority, r.seq, r))
        self._n_waiting += 1
        self._changed(now)

    def cancel(self, request_id: str, now: float | None = None) -> bool:
        """Drop a request (client disconnect); returns False if unknown or already finished."""
        if request_id not in self._reqs:
            return False
        if now is None:
            now = self._now
        if self._pending is not None and now > self._pending:
            self._ensure_planned()
        self._now = max(self._now, now)
        r = self._reqs.pop(request_id)
        r.cancelled = True
        self.requests_cancelled += 1
        if r.started and r in self._running:
            self._running.remove(r)
            self._used_blocks -= r.blocks
            r.blocks = 0
            if r.computed < r.target:
                self._n_prefilling -= 1
            self._changed(now)
        else:
            self._n_waiting -= 1  # lazily removed from the heap
            self._changed(now)  # the queue head may change, and with it what can be admitted
        return True

    def _changed(self, now: float) -> None:
        """The requests changed at ``now``: schedule a start if idle, or cut a macro segment in flight."""
        seg = self._seg
        if seg is None:
            if self._pending is None:
                self._pending = now
        elif seg.kind == _MACRO:
            seg.changed = True
            if seg.k > 1:
                j = seg.first_boundary_at_or_after(now)
                if j < seg.k:
                    seg.k = j
                    seg.end = seg.start + seg.cum(j)

    def _ensure_planned(self) -> None:
        """Plan the segment due at the pending start time (planning is lazy so same-time arrivals join)."""
        t = self._pending
        if t is not None:
            self._pending = None
            self._start_segment(t)

    # ------------------------------------------------------------------ time
    def next_event_time(self) -> float | None:
        """End of the segment in flight, or ``None`` when idle.

        This commits the next iteration's schedule: submit every arrival of a given instant before asking.
        """
        t = self._pending  # (``_ensure_planned`` written out: the simulator asks after every change)
        if t is not None:
            self._pending = None
            self._start_segment(t)
        seg = self._seg
        return None if seg is None else seg.end

    def advance(self, until: float) -> StepResult:
        """Apply every iteration ending at or before ``until``; see the module docstring."""
        seg = self._seg
        start = seg.start if seg is not None else (self._pending if self._pending is not None else until)
        res = _new_result(start, until)
        last_end = start
        while True:
            if self._pending is not None:
                if self._pending >= until:
                    break
                self._ensure_planned()
            seg = self._seg
            if seg is None:
                break
            if seg.kind == _STEP:
                if seg.end > until:
                    break
                self._finish_step(seg, res)
                last_end = seg.end
            else:
                j = seg.iterations_ending_by(until)
                if j == 0:
                    break
                last_end = self._apply_macro(seg, j, res)
                if j < seg.k and last_end < until and not seg.changed:
                    # Nothing was submitted or cancelled: planning at ``last_end`` would give the same batch
                    # for the remaining iterations (no finish before the k-th, free blocks only shrink, the
                    # queue head and the cache are unchanged), so continue the segment without replanning.
                    self._rebase_macro(seg, j, last_end)
                    break
            self._seg = None
            if self._running or self._n_waiting:
                self._pending = last_end
        if until != math.inf:
            self._now = max(self._now, until)
            res.end = until
        else:
            res.end = last_end
            self._now = max(self._now, last_end)
        return res

    def step(self) -> StepResult:
        """Complete the segment in flight (if any)."""
        end = self.next_event_time()
        if end is None:
            return StepResult(start=self._now, end=self._now)
        return self.advance(end)

    def run_until_idle(self, max_segments: int = 10_000_000) -> StepResult:
        """Run everything submitted to completion (tests and offline use)."""
        total = StepResult(start=self._now, end=self._now)
        for _ in range(max_segments):
            if self.next_event_time() is None:
                break
            _merge(total, self.step())
        return total

    # ------------------------------------------------------------------ internals
    def _peek_waiting(self) -> _Req | None:
        w = self._waiting
        while w and w[0][2].cancelled:
            heapq.heappop(w)
        return w[0][2] if w else None

    def _admission(self, r: _Req, budget: int) -> tuple[int, int, int, int]:
        """For waiting ``r``: (matched blocks, cached tokens, chunk tokens, blocks needed)."""
        matched = self.cache.match(r.hashes) if r.hashes and self.cache.capacity > 0 else 0
        cached = min(matched * r.hbt, r.target - 1)
        n = min(r.target - cached, budget)
        completes = 1 if cached + n == r.target else 0
        return matched, cached, n, _blocks(cached + n + completes, self.params.block_tokens)

    def _start_segment(self, t: float) -> None:
        self._seg = None
        if not self._running and self._n_waiting == 0:
            return
        if self.macro and self._running and self._n_prefilling == 0 and self._try_macro(t):
            return
        self._plan_step(t)

    def _try_macro(self, t: float) -> bool:
        p = self.params
        running = self._running
        d = len(running)
        budget = p.max_num_batched_tokens if p.max_num_batched_tokens is not None else 1 << 62
        if d > budget:
            return False
        bt = p.block_tokens
        total = self._total_blocks
        need_head = -1
        if self._n_waiting and d < p.max_num_seqs and budget - d > 0:
            head = self._peek_waiting()
            if head is not None:
                need_head = self._admission(head, budget - d)[3]
                # The first iteration needs at most one new block per request (need0 below <= used + d):
                # the head is admissible whatever the exact count, so no macro (and no pass over the batch).
                if need_head <= total - self._used_blocks - d:
                    return False
        # One pass: iterations until the first finish, blocks needed by the first iteration
        # (sum ceil((kv + 1) / bt)), KV tokens held.
        k_finish = 1 << 62
        need0 = 0
        kv_tokens = 0
        for r in running:
            rem = r.max_out - r.generated
            if rem < k_finish:
                k_finish = rem
            kv = r.kv
            kv_tokens += kv
            need0 += (kv + bt) // bt
        if need0 > total:
            return False  # a preemption is due: single step
        # Nothing admissible during the run (free blocks only shrink, the cache does not change).
        if need_head >= 0 and need_head <= total - need0:
            return False
        k = k_finish
        # sum ceil((kv + k) / bt) <= (kv_tokens + d (k + bt - 1)) / bt: the exact sum only when that bound
        # does not already show that the blocks last for all ``k`` iterations.
        if (kv_tokens + d * (k + bt - 1)) // bt > total and sum(
            _blocks(r.kv + k, bt) for r in running
        ) > total:
            lo, hi = 1, k  # feasible count lo, infeasible hi
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if sum(_blocks(r.kv + mid, bt) for r in running) <= total:
                    lo = mid
                else:
                    hi = mid
            k = lo
        seg = _Segment(_MACRO, t, t)
        seg.k = k
        seg.d = d
        seg.kv0 = kv_tokens
        seg.base = p.step_overhead_s + p.decode_s_per_seq * d + p.decode_s_per_kv_token * kv_tokens
        seg.slope = p.decode_s_per_kv_token * d
        seg.reqs = list(running)
        seg.end = t + seg.cum(k)
        self._seg = seg
        return True

    def _rebase_macro(self, seg: _Segment, j: int, t: float) -> None:
        """Keep the last ``k - j`` iterations of a macro segment in flight, starting at ``t``.

        Exactly what ``_try_macro(t)`` would plan after the first ``j`` (same batch, ``k - j`` iterations,
        the same float expressions), without its pass over the batch.
        """
        p = self.params
        d = seg.d
        kv_tokens = seg.kv0 + d * j
        seg.kv0 = kv_tokens
        seg.k -= j
        seg.start = t
        seg.base = p.step_overhead_s + p.decode_s_per_seq * d + p.decode_s_per_kv_token * kv_tokens
        seg.end = t + seg.cum(seg.k)

    def _apply_macro(self, seg: _Segment, j: int, res: StepResult) -> float:
        """Apply the first ``j`` iterations of a macro segment; returns their end time."""
        end = seg.start + seg.cum(j)
        bt = self.params.block_tokens
        bt1 = bt - 1
        emitted = res.emitted if self.track_emitted else None
        finished: list[_Req] = []
        used = self._used_blocks
        count = 0
        for r in seg.reqs:
            if r.cancelled:
                continue
            count += 1
            g = r.generated + j
            r.generated = g
            kv = r.kv + j
            r.kv = kv
            nb = (kv + bt1) // bt
            used += nb - r.blocks
            r.blocks = nb
            if emitted is not None:
                emitted[r.rid] = emitted.get(r.rid, 0) + j
            if g >= r.max_out:
                finished.append(r)
        self.generation_tokens += j * count
        self._used_blocks = used
        res.iterations += j
        if finished:
            for r in finished:
                self._retire(r)
                res.finished[r.rid] = end
        return end

    def _retire(self, r: _Req) -> None:
        self._running.remove(r)
        self._used_blocks -= r.blocks
        r.blocks = 0
        del self._reqs[r.rid]
        self.requests_finished += 1

    def _preempt(self, r: _Req) -> None:
        self._running.remove(r)
        if r.computed < r.target:
            self._n_prefilling -= 1
        self._used_blocks -= r.blocks
        r.blocks = 0
        r.kv = 0
        r.computed = 0
        r.target = r.input_tokens + r.generated
        self.preemptions += 1
        heapq.heappush(self._waiting, (r.priority, r.seq, r))
        self._n_waiting += 1

    def _plan_step(self, t: float) -> None:
        """Schedule one iteration at ``t``, applying its state changes now; outputs come at its end."""
        p = self.params
        bt = p.block_tokens
        budget = p.max_num_batched_tokens if p.max_num_batched_tokens is not None else 1 << 62
        seg = _Segment(_STEP, t, t)
        seg.emits = []
        seg.first = []
        seg.finishing = []
        running = self._running
        decode_seqs = 0
        decode_kv = 0
        chunks: list[tuple[int, int]] = []
        preempted: list[_Req] = []
        total = self._total_blocks
        bt1 = bt - 1
        emits = seg.emits
        i = 0
        while i < len(running):
            r = running[i]
            if r.computed >= r.target and budget >= 1 and r.kv % bt and r.generated + 1 < r.max_out:
                # Fast path of the common case below: a decode token that needs no new block and does not
                # finish the request (the general code gives exactly the same updates).
                budget -= 1
                decode_seqs += 1
                decode_kv += r.kv
                r.kv += 1
                r.generated += 1
                emits.append(r)
                i += 1
                continue
            decoding = r.computed >= r.target
            n = (1 if budget >= 1 else 0) if decoding else min(r.target - r.computed, budget)
            if n <= 0:  # no budget left for this request in this iteration
                i += 1
                continue
            completes = decoding or r.computed + n == r.target
            new_kv = r.kv + n + (1 if completes and not decoding else 0)
            need = (new_kv + bt1) // bt - r.blocks
            self_preempted = False
            while need > total - self._used_blocks:
                victim = running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is r:
                    self_preempted = True
                    break
            if self_preempted:
                break  # r was the last running request
            self._used_blocks += need
            r.blocks += need
            budget -= n
            if decoding:
                decode_seqs += 1
                decode_kv += r.kv
                r.kv = new_kv
                r.generated += 1
                seg.emits.append(r)
            else:
                chunks.append((n, r.computed))
                r.computed += n
                r.kv = new_kv
                if completes:
                    self._n_prefilling -= 1
                    r.generated += 1
                    seg.emits.append(r)
                    seg.first.append(r)
                    self.cache.insert(r.hashes)
            if r.generated >= r.max_out:
                seg.finishing.append(r)
            i += 1
        admitted: list[tuple[_Req, int]] = []
        if not preempted:
            while budget > 0 and len(running) < p.max_num_seqs and self._n_waiting:
                head = self._peek_waiting()
                if head is None:
                    break
                matched, cached, n, need = self._admission(head, budget)
                if need > self._total_blocks - self._used_blocks:
                    break
                heapq.heappop(self._waiting)
                self._n_waiting -= 1
                if matched:
                    self.cache.touch(head.hashes[:matched])
                self.prefix_cache_queries += head.target
                self.prefix_cache_hits += cached
                if not head.started:
                    head.started = True
                    head.cached = cached
                    self.prompt_tokens += head.input_tokens
                    admitted.append((head, cached))
                head.computed = cached + n
                head.kv = cached + n
                head.blocks = need
                self._used_blocks += need
                budget -= n
                chunks.append((n, cached))
                running.append(head)
                if head.computed == head.target:
                    head.kv += 1
                    head.generated += 1
                    seg.emits.append(head)
                    seg.first.append(head)
                    self.cache.insert(head.hashes)
                    if head.generated >= head.max_out:
                        seg.finishing.append(head)
                else:
                    self._n_prefilling += 1
        if preempted or admitted:
            running.sort(key=_RANK)
        if not chunks and decode_seqs == 0:
            # Defensive: everything was preempted (cannot happen for requests that pass fits()); replan now.
            self._seg = None
            if preempted and (self._running or self._n_waiting):
                self._plan_step(t)
                if self._seg is not None:
                    self._seg.preempted[:0] = [r.rid for r in preempted]
            return
        seg.end = t + p.iteration_time(decode_seqs, decode_kv, chunks)
        seg.admitted = [(r.rid, c) for r, c in admitted]
        seg.preempted = [r.rid for r in preempted]
        self._seg = seg

    def _finish_step(self, seg: _Segment, res: StepResult) -> None:
        end = seg.end
        res.iterations += 1
        if self.track_emitted:
            emitted = res.emitted
            for r in seg.emits:
                if r.cancelled:
                    continue
                emitted[r.rid] = emitted.get(r.rid, 0) + 1
                self.generation_tokens += 1
        elif self.requests_cancelled == 0:
            self.generation_tokens += len(seg.emits)
        else:
            self.generation_tokens += sum(1 for r in seg.emits if not r.cancelled)
        for r in seg.first:
            if r.cancelled or r.first_token_time is not None:
                continue
            r.first_token_time = end
            res.first_token[r.rid] = end
        for rid, cached in seg.admitted:
            if rid in self._reqs:  # not cancelled meanwhile (finishing ones are retired below)
                res.cached_tokens[rid] = cached
                res.admitted[rid] = seg.start
        res.preempted.extend(seg.preempted)
        for r in seg.finishing:
            if not r.cancelled:
                self._retire(r)
                res.finished[r.rid] = end


#: Running requests' order: ``(priority, arrival sequence)`` (a C-level key, no Python call per request).
_RANK = attrgetter("priority", "seq")


def _merge(total: StepResult, part: StepResult) -> None:
    total.end = max(total.end, part.end)
    total.iterations += part.iterations
    for rid, n in part.emitted.items():
        total.emitted[rid] = total.emitted.get(rid, 0) + n
    total.first_token.update(part.first_token)
    total.finished.update(part.finished)
    total.cached_tokens.update(part.cached_tokens)
    total.admitted.update(part.admitted)
    total.preempted.extend(part.preempted)
