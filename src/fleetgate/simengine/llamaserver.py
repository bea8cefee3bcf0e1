"""Performance model of one ``llama-server`` replica (llama.cpp's HTTP server) for the fleet simulator.

``simengine.perfmodel`` models a vLLM-like engine: a paged KV cache and a prefix cache of whole hash blocks.
llama-server works differently, and on a llama fleet those differences decide the hit rate and the queueing
(docs/benchmarks.md, "Session 11: a llama-server engine model"). What this model follows, as learned from
llama.cpp's ``tools/server`` (the version ``scripts/build_llama_server.sh`` builds):

- ``--parallel`` *slots*, each with ``ctx_size / parallel`` tokens of context (no unified KV when the slot
  count is given). A slot keeps the tokens of its last request (its prompt and the generated tokens fed
  back) after it finishes.
- *Slot selection* when a request is taken from the queue: among idle slots that hold tokens, the one whose
  longest common token prefix with the new prompt is the largest fraction of the prompt, if that fraction
  exceeds ``--slot-prompt-similarity``; otherwise the least recently used idle slot. No idle slot: the
  request is deferred, first in first out, and taken when a slot is released.
- *Prompt reuse*: the prompt's tokens up to its common prefix with the slot's tokens are kept, at least one
  token is always evaluated, the rest is evaluated (any token prefix, not whole blocks).
- The host-memory *prompt cache* (``--cache-ram`` MiB): when a slot is chosen by LRU, or by similarity but
  keeping under half of its tokens, its state is saved into the cache (unless an entry already holds all of
  it; entries it fully contains are dropped; the oldest entries go to make room), and the cached state that
  keeps the largest share of both itself (at least a quarter) and the new prompt, better than the slot's own,
  is loaded into the slot and leaves the cache. After a request starts, every idle slot's state is saved too
  (``--cache-idle-slots``, on by default with a prompt cache).
- *Continuous batching*: each iteration is one batch of at most ``--batch-size`` tokens: one decode token per
  generating slot, then prompt tokens of the slots still evaluating their prompt, in slot order (not
  arrival order), as many as fit. The iteration that evaluates a prompt's last token samples its first output
  token (the TTFT); a request with ``n`` output tokens then takes ``n - 1`` decode iterations and releases its
  slot when its last token is sampled. Requests that arrive during an iteration are taken at the next one.

Iteration time (seconds), calibrated on a live replica (``bench/llama_fleet.py``'s probe)::

    dt = step_s + token_s * T + attn_s * sum over the batch's tokens of (2 * position + 1) + sample_s * S

with ``T`` tokens in the batch, a token's ``position`` its place in its slot's sequence (a prompt chunk of
``n`` tokens after ``c`` adds ``n (2c + n)``, a decode token at ``K`` adds ``2K + 1``), and ``S`` the tokens
sampled (one per decode token and per completed prompt: the output logits and the sampler).

A request's tokens are ``EngineRequest.prompt_tokens`` (the engine's own token ids of the prompt); without
them each block hash stands for ``hash_block_tokens`` tokens and the tail after the last block is unique to
the request, so prefixes then match at block granularity only. Not modelled: context shift, speculative
decoding, multimodal chunks, context checkpoints (a plain transformer needs none), the prompt cache's
allocation failures. CPU contention between replicas on shared cores is opt-in: a ``SharedCpu``
(``simengine.contention``) given to every replica of a run stretches each iteration by the slowdown for the
replicas computing when it starts; without one the replicas run independently at the calibrated speed.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from fleetgate.simengine.contention import SharedCpu
from fleetgate.simengine.perfmodel import EngineRequest, EngineStats, StepResult

__all__ = ["LlamaServerModel", "LlamaServerParams", "common_prefix"]

_IDLE, _STARTED, _PROMPT, _GENERATING = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class LlamaServerParams:
    """One replica's flags (as ``llama-server`` is started) and its calibrated iteration cost."""

    parallel: int = 4
    ctx_size: int = 16384
    batch_size: int = 512
    slot_prompt_similarity: float = 0.1
    cache_ram_mib: int = 128  # 0: no prompt cache; < 0: no size limit
    kv_bytes_per_token: int = 2048  # one token's KV state (the model's layers x KV width x K and V)
    cache_idle_slots: bool = True
    step_s: float = 1e-3
    token_s: float = 2.5e-4
    attn_s: float = 2.5e-7
    sample_s: float = 5e-4

    def __post_init__(self) -> None:
        if self.parallel < 1:
            raise ValueError("parallel must be >= 1")
        if self.ctx_size // self.parallel < 2:
            raise ValueError("each slot needs a context of at least 2 tokens")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        costs = {
            "step_s": self.step_s,
            "token_s": self.token_s,
            "attn_s": self.attn_s,
            "sample_s": self.sample_s,
        }
        for name, v in costs.items():
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number >= 0")
        if self.step_s + self.token_s <= 0:
            raise ValueError("an iteration must take some time (step_s or token_s > 0)")

    @property
    def slot_ctx(self) -> int:
        """Context of one slot in tokens."""
        return self.ctx_size // self.parallel

    @property
    def cache_limit_bytes(self) -> int:
        """The prompt cache's size limit (0: none)."""
        return max(0, self.cache_ram_mib) * 2**20

    def iteration_time(self, tokens: int, attn_pairs: int, sampled: int) -> float:
        """One batch: ``tokens`` evaluated, ``attn_pairs`` = sum of (2 position + 1), ``sampled`` outputs."""
        return self.step_s + self.token_s * tokens + self.attn_s * attn_pairs + self.sample_s * sampled


def common_prefix(a: tuple[object, ...], b: tuple[object, ...]) -> int:
    """Length of the longest common prefix of two token sequences (tuple slices compare in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class _State:
    """What a slot (or a prompt-cache entry) holds: prompt tokens, then ``generated`` tokens of ``owner``
    (generated text matches no later prompt: the replay's prompts never contain it)."""

    __slots__ = ("generated", "owner", "tokens")

    def __init__(self, tokens: tuple[object, ...] = (), owner: int = -1, generated: int = 0) -> None:
        self.tokens = tokens
        self.owner = owner
        self.generated = generated

    def __len__(self) -> int:
        return len(self.tokens) + self.generated

    def lcp(self, prompt: tuple[object, ...]) -> int:
        return common_prefix(self.tokens, prompt)

    def contains(self, other: _State) -> bool:
        """Whether all of ``other``'s tokens are a prefix of this state's."""
        if other.generated:
            return (
                self.owner == other.owner
                and self.generated >= other.generated
                and self.tokens == other.tokens
            )
        return len(other.tokens) <= len(self.tokens) and self.tokens[: len(other.tokens)] == other.tokens

    def copy(self) -> _State:
        return _State(self.tokens, self.owner, self.generated)


class _Req:
    __slots__ = ("done", "generated", "n_out", "owner", "prompt", "rid")

    def __init__(self, rid: str, prompt: tuple[object, ...], n_out: int, owner: int) -> None:
        self.rid = rid
        self.prompt = prompt
        self.n_out = n_out
        self.owner = owner
        self.done = 0  # prompt tokens in the slot's KV
        self.generated = 0  # tokens sampled


class _Slot:
    __slots__ = ("id", "last_used", "req", "state", "status")

    def __init__(self, sid: int) -> None:
        self.id = sid
        self.state = _State()
        self.status = _IDLE
        self.req: _Req | None = None
        self.last_used = -1


class _Iteration:
    __slots__ = ("decoding", "end", "first", "start", "started")

    def __init__(self, start: float) -> None:
        self.start = start
        self.end = start
        self.decoding: list[_Slot] = []  # slots that sample a decode token at the end
        self.first: list[_Slot] = []  # slots whose prompt completes (first token)
        self.started: list[tuple[str, int]] = []  # (request, cached tokens) of prompts begun


class LlamaServerModel:
    """One llama-server replica: ``submit`` / ``advance`` / ``next_event_time`` like ``perfmodel.EngineModel``
    (the simulator's ``EngineModel`` protocol). Deterministic; time is passed in. ``cpu``: the machine this
    replica shares with the others of the run (CPU contention, opt-in); ``None``: its own cores."""

    def __init__(self, params: LlamaServerParams | None = None, cpu: SharedCpu | None = None) -> None:
        self.params = params or LlamaServerParams()
        self._cpu = cpu
        self._cpu_key = cpu.join() if cpu is not None else -1
        self.slots = [_Slot(i) for i in range(self.params.parallel)]
        self.cache: list[_State] = []  # the prompt cache, oldest first
        self._queue: deque[_Req] = deque()  # received, not yet in a slot (deferred), first in first out
        self._iter: _Iteration | None = None
        self._start_at: float | None = None  # an iteration is due to start here (planned lazily)
        self._releases = 0  # LRU order of released slots
        self._owners = 0
        self._now = 0.0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests_finished = 0
        self.iterations = 0

    # ----------------------------------------------------------------------------------- gauges
    @property
    def num_running(self) -> int:
        """Slots processing a request (``llamacpp:requests_processing``)."""
        return sum(1 for s in self.slots if s.status != _IDLE)

    @property
    def num_waiting(self) -> int:
        """Requests waiting for a slot (``llamacpp:requests_deferred``)."""
        return len(self._queue)

    @property
    def kv_usage(self) -> float:
        """llama-server exports no KV usage gauge, so a router sees none: 0."""
        return 0.0

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=self.num_running, num_waiting=self.num_waiting, kv_usage=0.0,
            prefix_cache_queries=self.prefix_cache_queries, prefix_cache_hits=self.prefix_cache_hits,
            prompt_tokens=self.prompt_tokens, generation_tokens=self.generation_tokens, preemptions=0,
            requests_finished=self.requests_finished, requests_cancelled=0,
        )  # fmt: skip

    def cache_tokens(self) -> int:
        """Tokens held by the prompt cache."""
        return sum(len(e) for e in self.cache)

    def fits(self, input_tokens: int, max_output_tokens: int) -> bool:
        """A prompt must be shorter than a slot's context (llama-server rejects it otherwise)."""
        return input_tokens + max(0, max_output_tokens - 1) < self.params.slot_ctx

    # ----------------------------------------------------------------------------------- driving
    def submit(self, request: EngineRequest, now: float) -> None:
        """Receive ``request`` at ``now``: it is taken from the queue at the next iteration boundary."""
        if not self.fits(request.input_tokens, request.max_output_tokens):
            raise ValueError(f"request {request.request_id} does not fit a slot's context")
        self._queue.append(
            _Req(request.request_id, _prompt_of(request), max(1, request.max_output_tokens), self._owners)
        )
        self._owners += 1
        self._now = max(self._now, now)
        if self._iter is None and self._start_at is None:
            self._start_at = now

    def next_event_time(self) -> float | None:
        """End of the iteration in flight (``None`` when idle)."""
        if self._iter is None and self._start_at is not None:
            self._plan(self._start_at)
        return self._iter.end if self._iter is not None else None

    def advance(self, until: float) -> StepResult:
        """Apply every iteration that ends at or before ``until``."""
        res = StepResult(start=self._now, end=until)
        while True:
            if self._iter is None:
                # an iteration due exactly at ``until`` waits: requests submitted then still join it
                if self._start_at is None or self._start_at >= until:
                    break
                self._plan(self._start_at)
                if self._iter is None:
                    break
            it = self._iter
            if it.end > until:
                break
            self._finish(it, res)
            self._iter = None
            busy = self._queue or any(s.status != _IDLE for s in self.slots)
            self._start_at = it.end if busy else None
        self._now = max(self._now, until)
        return res

    def step(self) -> StepResult:
        """Complete the iteration in flight."""
        end = self.next_event_time()
        return StepResult(start=self._now, end=self._now) if end is None else self.advance(end)

    def run_until_idle(self, max_iterations: int = 10_000_000) -> StepResult:
        """Run everything submitted to completion (tests and offline use)."""
        total = StepResult(start=self._now, end=self._now)
        for _ in range(max_iterations):
            if self.next_event_time() is None:
                break
            part = self.step()
            total.end = part.end
            total.iterations += part.iterations
            total.first_token.update(part.first_token)
            total.finished.update(part.finished)
            total.cached_tokens.update(part.cached_tokens)
            total.admitted.update(part.admitted)
        return total

    # ----------------------------------------------------------------------------------- internals
    def _plan(self, t: float) -> None:
        """Take queued requests into slots, then build one batch starting at ``t``."""
        self._start_at = None
        while self._queue:
            slot = self._pick_slot(self._queue[0].prompt)
            if slot is None:
                break  # deferred until a slot is released
            slot.req = self._queue.popleft()
            slot.status = _STARTED
            if self.params.cache_idle_slots and self._cache_on:
                for s in self.slots:
                    if s.status == _IDLE:
                        self._save(s.state)
                self._trim()
        p = self.params
        it = _Iteration(t)
        tokens = attn = sampled = 0
        for s in self.slots:
            if s.status == _GENERATING:
                pos = len(s.state)
                tokens += 1
                attn += 2 * pos + 1
                sampled += 1
                it.decoding.append(s)
        for s in self.slots:
            if tokens >= p.batch_size:
                break
            if s.status not in (_STARTED, _PROMPT):
                continue
            req = s.req
            if req is None:
                continue
            if s.status == _STARTED:
                n_past = s.state.lcp(req.prompt)
                if n_past >= len(req.prompt):
                    n_past = len(req.prompt) - 1  # at least one token is evaluated
                self.prefix_cache_queries += len(req.prompt)
                self.prefix_cache_hits += n_past
                self.prompt_tokens += len(req.prompt)
                s.state = _State(req.prompt[:n_past], req.owner)
                req.done = n_past
                s.status = _PROMPT
                it.started.append((req.rid, n_past))
            n = min(len(req.prompt) - req.done, p.batch_size - tokens)
            c = req.done
            tokens += n
            attn += n * (2 * c + n)
            req.done += n
            s.state.tokens = req.prompt[: req.done]
            if req.done == len(req.prompt):
                sampled += 1
                it.first.append(s)
        if tokens == 0:
            self._iter = None
            return
        dt = p.iteration_time(tokens, attn, sampled)
        if self._cpu is not None:
            dt = self._cpu.stretch(self._cpu_key, t, dt)
        it.end = t + dt
        self._iter = it

    def _finish(self, it: _Iteration, res: StepResult) -> None:
        end = it.end
        res.iterations += 1
        self.iterations += 1
        for rid, cached in it.started:
            res.cached_tokens[rid] = cached
            res.admitted[rid] = it.start
        for s in it.decoding:
            req = s.req
            assert req is not None
            s.state.generated += 1  # the previous sampled token, fed in this batch
            req.generated += 1
            self.generation_tokens += 1
            if req.generated >= req.n_out:
                self._release(s, res, end)
        for s in it.first:
            req = s.req
            assert req is not None
            req.generated = 1
            self.generation_tokens += 1
            res.first_token[req.rid] = end
            if req.n_out <= 1:
                self._release(s, res, end)
            else:
                s.status = _GENERATING

    def _release(self, s: _Slot, res: StepResult, end: float) -> None:
        assert s.req is not None
        res.finished[s.req.rid] = end
        s.req = None
        s.status = _IDLE
        s.last_used = self._releases
        self._releases += 1
        self.requests_finished += 1

    @property
    def _cache_on(self) -> bool:
        return self.params.cache_ram_mib != 0

    def _pick_slot(self, prompt: tuple[object, ...]) -> _Slot | None:
        """llama-server's slot selection for a new prompt (with the prompt cache's save and load)."""
        p = self.params
        chosen: _Slot | None = None
        update_cache = False
        if p.slot_prompt_similarity != 0.0:
            best = 0.0
            for s in self.slots:
                if s.status != _IDLE or len(s.state) == 0:
                    continue
                sim = s.state.lcp(prompt) / len(prompt)
                if sim > best and sim > p.slot_prompt_similarity:
                    best, chosen = sim, s
            if chosen is not None and best * len(prompt) / len(chosen.state) < 0.5:
                update_cache = True  # the slot would lose most of what it holds
        if chosen is None:
            for s in self.slots:
                if s.status == _IDLE and (chosen is None or s.last_used <= chosen.last_used):
                    chosen = s
            update_cache = chosen is not None
        if chosen is not None and update_cache and self._cache_on:
            self._save(chosen.state)
            loaded = self._load(chosen.state, prompt)
            if loaded is not None:
                chosen.state = loaded
            self._trim()
        return chosen

    def _save(self, state: _State) -> None:
        """Copy a slot's state into the prompt cache (llama-server's save)."""
        n = len(state)
        if n == 0 or any(e.contains(state) for e in self.cache):
            return
        size = n * self.params.kv_bytes_per_token
        limit = self.params.cache_limit_bytes
        if limit and size > limit:
            return
        self.cache = [e for e in self.cache if not state.contains(e)]
        if limit:
            total = sum(len(e) for e in self.cache) * self.params.kv_bytes_per_token
            while self.cache and total + size > limit:
                total -= len(self.cache.pop(0)) * self.params.kv_bytes_per_token
        self.cache.append(state.copy())

    def _load(self, own: _State, prompt: tuple[object, ...]) -> _State | None:
        """The cached state to restore into a slot for ``prompt``, removed from the cache (or ``None``)."""
        lcp = own.lcp(prompt)
        keep_best = lcp / len(own) if len(own) else -1.0
        sim_best = lcp / len(prompt)
        best_i = -1
        for i, e in enumerate(self.cache):
            cur = e.lcp(prompt)
            keep, sim = cur / len(e), cur / len(prompt)
            if keep < 0.25:
                continue  # not worth discarding most of a cached prompt
            if keep > keep_best and sim > sim_best:
                keep_best, sim_best, best_i = keep, sim, i
        return self.cache.pop(best_i) if best_i >= 0 else None

    def _trim(self) -> None:
        """The prompt cache's size limits (bytes, and tokens: the context size or what the bytes allow)."""
        p = self.params
        limit = p.cache_limit_bytes
        per_token = p.kv_bytes_per_token
        n = sum(len(e) for e in self.cache)
        if limit:
            while self.cache and n * per_token > limit:
                n -= len(self.cache.pop(0))
        limit_tokens = max(p.ctx_size, limit // max(1, per_token)) if limit else p.ctx_size
        while self.cache and n > limit_tokens:
            n -= len(self.cache.pop(0))


def _prompt_of(request: EngineRequest) -> tuple[object, ...]:
    """The request's prompt tokens: its token ids, else one stand-in token per position of each hash block and
    unique tokens for the rest (block-granular matching when the ids are unknown)."""
    if request.prompt_tokens:
        return tuple(request.prompt_tokens)
    n = request.input_tokens
    hbt = request.hash_block_tokens or 16
    out: list[object] = []
    for h in request.block_hashes:
        if len(out) + hbt > n:
            break
        out.extend((h, j) for j in range(hbt))
    rid = request.request_id
    out.extend((rid, j) for j in range(len(out), n))
    return tuple(out)
