"""The measuring half of ``fleetgate calibrate``: one engine probed with closed loops of requests.

``EngineProbe`` sends chat completions of a given ``Shape`` (fresh prompts with no shared prefix unless asked,
exact output lengths) and climbs a concurrency ladder to saturation; ``calibration`` drives it over the sweep
and fits the profile, ``calibration_cache`` uses it to measure the cache and image terms. Kept apart so both
import it and neither imports the other back."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import math
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

#: The filler words of every probe prompt (short, one token each in most vocabularies).
FILLER_WORDS = (
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "and",
    "then",
    "it",
    "ran",
    "to",
    "see",
    "big",
    "red",
    "dog",
)

#: A 32x32 grey PNG: the image part the image-cost measurement sends (the engine's image tokens count).
CALIBRATION_IMAGE = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAAAAABWESUoAAAAGUlEQVR4nGNsYMAPmAjIjyoYVTCqYNgqAACXv"
    "gDAMsm0fAAAAABJRU5ErkJggg=="
)

#: Extra request fields asking for exactly ``max_tokens`` output tokens (vLLM, SGLang, llama.cpp, simengine).
EXACT_LENGTH_FIELDS: dict[str, Any] = {"ignore_eos": True}


class CalibrationError(RuntimeError):
    """The engine could not be measured (unreachable, errors, or nonsense usage)."""


@dataclass(frozen=True, slots=True)
class Shape:
    """A request shape as sent: prompt filler words and requested output tokens."""

    words: int
    output_tokens: int
    shared_words: int = 0  #: a prefix of this many words, the same in every request of the probe
    images: int = 0  #: image parts (a small PNG data URL each) after the text


@dataclass
class LevelResult:
    """One rung of the concurrency ladder for one shape (or mix)."""

    concurrency: int
    requests: int
    elapsed_s: float
    throughput_rps: float
    mean_latency_s: float
    mean_prompt_tokens: float
    mean_completion_tokens: float
    wall_throughput_rps: float = 0.0
    busy_s: float | None = None
    usages: list[tuple[int, int]] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "elapsed_s": self.elapsed_s,
            "throughput_rps": self.throughput_rps,
            "mean_latency_s": self.mean_latency_s,
            "mean_prompt_tokens": self.mean_prompt_tokens,
            "mean_completion_tokens": self.mean_completion_tokens,
            "wall_throughput_rps": self.wall_throughput_rps,
            "busy_s": self.busy_s,
        }


def process_cpu_seconds(pid: int, *, missing: float | None = None) -> float:
    """CPU seconds (user + system) the process ``pid`` has used so far (Linux ``/proc``).

    With ``missing`` set, a process that is gone (or no ``/proc``) reads as that value instead of raising.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat(5))
    except (OSError, IndexError, ValueError):
        if missing is None:
            raise
        return missing
    return ticks / os.sysconf("SC_CLK_TCK")


def process_tree_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by ``pid`` and every live process below it (vLLM runs its engine core and
    workers as child processes; llama-server is one process). Children must outlive the measurement."""
    from fleetgate.engines.llama import descendant_pids

    total = process_cpu_seconds(pid)
    for kid in descendant_pids(pid):
        try:
            total += process_cpu_seconds(kid)
        except OSError:  # exited between listing and reading
            pass
    return total


@dataclass
class SaturationResult:
    """The ladder climbed for one shape or mix, and the saturated throughput found."""

    levels: list[LevelResult] = field(default_factory=list)

    @property
    def best(self) -> LevelResult:
        return max(self.levels, key=lambda lv: lv.throughput_rps)

    @property
    def saturated_rps(self) -> float:
        return self.best.throughput_rps


def steady_state_window(finish_times: Sequence[float], elapsed: float) -> tuple[int, int, float]:
    """(start, end, span) of the steady-state completions in sorted ``finish_times``.

    The completions after the time of the ``n/4``-th and up to the time of the ``3n/4``-th, by time rather
    than index because a batched engine finishes several requests at the same instant; fewer than 8
    completions (or no spread) fall back to all of them over ``elapsed``.
    """
    n = len(finish_times)
    if n >= 8:
        t_lo, t_hi = finish_times[n // 4], finish_times[(3 * n) // 4]
        if t_hi > t_lo:
            start = bisect.bisect_right(finish_times, t_lo)
            end = bisect.bisect_right(finish_times, t_hi)
            return start, end, t_hi - t_lo
    return 0, n, elapsed


class EngineProbe:
    """Sends chat completions of a given shape to one engine and times closed-loop runs."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        engine: str,
        model: str,
        *,
        api_key: str | None = None,
        extra_body: Mapping[str, Any] | None = None,
        request_timeout_s: float = 300.0,
        busy_clock: Callable[[], float] | None = None,
        nonce: str | None = None,
    ) -> None:
        """``busy_clock``: cumulative seconds the replica has been busy (e.g. its process CPU time); when
        given, replica time is measured on it instead of the wall clock (robust on a shared machine).
        ``nonce``: this probe's prompt prefix (default: random), so no two probes send equal prompts."""
        self.busy_clock = busy_clock
        self.session = session
        self.url = engine.rstrip("/") + "/v1/chat/completions"
        self.model = model
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.extra_body = dict(EXACT_LENGTH_FIELDS if extra_body is None else extra_body)
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._seq = itertools.count()
        self.nonce = nonce if nonce is not None else os.urandom(6).hex()
        #: prompt tokens the engine reported as prefix-cache hits / as images, over every request sent
        self.cached_tokens = self.image_tokens = 0

    def prompt(self, words: int, shared_words: int = 0) -> str:
        """A prompt of ``words`` filler words that shares no prefix (and no long chunk) with any other.

        The head carries this probe's random nonce and the request number, so prompts never repeat across
        probes, runs or processes: llama-server keeps earlier prompts in a host-memory prompt cache
        (``--cache-ram``, 8 GiB by default) and restores the longest matching prefix. Two probes that both
        counted from 0 with a deterministic filler sent identical prefixes, and the second run's long prompts
        were mostly cache hits (that made the first llama.cpp mix check read 25-28% cheap). The filler
        words are drawn per request, so chunk-level reuse (``--cache-reuse``) finds nothing either.
        """
        uid = next(self._seq)
        rng = random.Random(f"{self.nonce}:{uid}")
        head = f"Request {self.nonce} {uid} :"
        if shared_words > 0:  # the prefix-cache measurement: a long prefix every request repeats
            shared = random.Random(f"{self.nonce}:shared")
            head = f"Shared {self.nonce} :" + "".join(
                " " + shared.choice(FILLER_WORDS) for _ in range(shared_words)
            )
            head += f" Request {uid} :"
        return head + "".join(" " + rng.choice(FILLER_WORDS) for _ in range(max(words, 0)))

    def content(self, shape: Shape) -> str | list[dict[str, Any]]:
        """The user message: the prompt, followed by ``shape.images`` image parts when it has any."""
        text = self.prompt(shape.words, shape.shared_words)
        image = {"type": "image_url", "image_url": {"url": CALIBRATION_IMAGE}}
        return [{"type": "text", "text": text}, *[image] * shape.images] if shape.images else text

    async def send(self, shape: Shape) -> tuple[int, int, float]:
        """One request; returns (prompt_tokens, completion_tokens, latency_s) from the engine's usage."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": self.content(shape)}],
            "max_tokens": shape.output_tokens,
            "min_tokens": shape.output_tokens,
            "temperature": 0.0,
            "stream": False,
            **self.extra_body,
        }
        t0 = time.perf_counter()
        for attempt in range(2):
            try:
                async with self.session.post(
                    self.url, data=json.dumps(body), headers=self.headers, timeout=self.timeout
                ) as resp:
                    text = await resp.text()
                    if resp.status != 200:
                        raise CalibrationError(f"engine answered HTTP {resp.status}: {text[:300]}")
                break
            except aiohttp.ServerDisconnectedError as exc:
                # a pooled keep-alive connection the server closed just as it was reused (uvicorn closes
                # idle ones after 5 s): nothing was processed, send it once more on a fresh connection
                if attempt:
                    raise CalibrationError(f"request to {self.url} failed: {exc!r}") from exc
                t0 = time.perf_counter()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise CalibrationError(
                    f"request to {self.url} failed: {exc.__class__.__name__}: {exc}"
                ) from exc
        latency = time.perf_counter() - t0
        try:
            usage = json.loads(text)["usage"]
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens += int(details.get("cached_tokens") or 0)
            self.image_tokens += int(details.get("image_tokens") or 0)
            return int(usage["prompt_tokens"]), int(usage["completion_tokens"]), latency
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibrationError(f"engine response has no usable usage: {text[:300]}") from exc

    async def words_for(self, input_tokens: int) -> int:
        """Filler words that give about ``input_tokens`` prompt tokens (two probes; template overhead)."""
        base, _, _ = await self.send(Shape(0, 1))
        probe_words = max(input_tokens, 16)
        tokens, _, _ = await self.send(Shape(probe_words, 1))
        per_word = max((tokens - base) / probe_words, 1e-3)
        return max(round((input_tokens - base) / per_word), 0)

    async def closed_loop(
        self, shapes: Callable[[int], Shape], concurrency: int, requests: int
    ) -> LevelResult:
        """``concurrency`` workers send ``requests`` requests in total, back to back.

        Wall clock: throughput is measured in steady state, the completions after the time of the
        ``n/4``-th and up to the time of the ``3n/4``-th over that time span (leaves out ramp-up and drain).
        Busy clock (the replica's CPU time): every request of the run over the busy seconds of the whole
        run. An idle replica accrues no busy time, so ramp-up and drain cost nothing extra, and the total
        is exactly the sum of what the run's requests cost; a window would count only the completions
        that land in it, which for a mix of cheap and dear shapes is a biased sample. Token means and
        ``usages`` always cover every request of the run.
        """
        counter = itertools.count()
        results: list[tuple[int, int, float, float]] = []  # prompt, completion, latency, finished at

        async def worker() -> None:
            while (i := next(counter)) < requests:
                p, c, lat = await self.send(shapes(i))
                results.append((p, c, lat, time.perf_counter()))

        clock = self.busy_clock
        busy0 = clock() if clock is not None else 0.0
        t0 = time.perf_counter()
        try:
            async with asyncio.TaskGroup() as tg:  # one failure cancels the other workers
                for _ in range(concurrency):
                    tg.create_task(worker())
        except* CalibrationError as group:
            raise group.exceptions[0] from None
        elapsed = time.perf_counter() - t0
        busy = clock() - busy0 if clock is not None else None
        n = len(results)
        results.sort(key=lambda r: r[3])
        lo, hi, span = steady_state_window([r[3] for r in results], elapsed)
        window = results[lo:hi]
        k = len(window)
        wall_rps = k / span if span > 0 else math.inf
        return LevelResult(
            concurrency=concurrency,
            requests=n,
            elapsed_s=elapsed,
            throughput_rps=n / busy if busy is not None and busy > 0 else wall_rps,
            wall_throughput_rps=wall_rps,
            busy_s=busy,
            mean_latency_s=sum(r[2] for r in results) / n,
            mean_prompt_tokens=sum(r[0] for r in results) / n,
            mean_completion_tokens=sum(r[1] for r in results) / n,
            usages=[(r[0], r[1]) for r in results],
        )

    async def saturate(
        self,
        shapes: Callable[[int], Shape],
        ladder: Sequence[int],
        *,
        requests_per_worker: int = 4,
        min_requests: int = 8,
        growth: float = 0.05,
        patience: int = 2,
        on_level: Callable[[LevelResult], None] | None = None,
        min_busy_s: float = 0.0,
        cycle: int = 1,
    ) -> SaturationResult:
        """Climb the ladder until ``patience`` rungs in a row fail to beat the best throughput by ``growth``.

        Patience 2 because a closed loop of exactly as many clients as the engine has batch slots leaves
        slots idle during every client round trip; the next rung (queued requests) is what saturates it.
        ``min_busy_s``: with a busy clock, a rung that used less busy time than this is extended with more
        requests (whole ``cycle``s, at most 8x), so clock ticks (10 ms for process CPU time) stay small
        against what is measured.
        """
        result = SaturationResult()
        stalled = 0
        for c in ladder:
            level = await self.closed_loop(shapes, c, max(c * requests_per_worker, min_requests))
            if level.busy_s is not None and 0 < level.busy_s < min_busy_s:
                more = math.ceil(level.requests * min(1.2 * min_busy_s / level.busy_s - 1.0, 7.0))
                more = -(-more // cycle) * cycle
                level = merge_levels(level, await self.closed_loop(shapes, c, more))
            if on_level is not None:
                on_level(level)
            prev = result.saturated_rps if result.levels else 0.0
            result.levels.append(level)
            if prev > 0 and level.throughput_rps < prev * (1.0 + growth):
                stalled += 1
                if stalled >= patience:
                    break
            else:
                stalled = 0
        return result


def jittered(shape: Shape, spread: float, n: int = 8) -> list[Shape]:
    """``n`` variants of ``shape`` whose prompt words and output tokens are spread evenly over
    ``(1 - spread, 1 + spread)`` x nominal (same means; input and output factors in different orders).

    Identical requests run in lockstep on a batched engine: they start, prefill and finish together, and
    every sequence of a batch has the same context. Real traffic never does; llama.cpp, for one, computes a
    multi-sequence ubatch's attention over the longest sequence in it, so desynchronised decodes cost
    more per token than lockstep ones (about 20% on the tiny model). Jittered shapes measure the shape
    as it runs among others; the fit then uses each request's real token counts.
    """
    if not 0.0 <= spread < 1.0:
        raise ValueError("spread must be in [0, 1)")
    factors = [1.0 - spread + 2.0 * spread * (k + 0.5) / n for k in range(n)]
    order = [(3 * k + 1) % n for k in range(n)] if n % 3 else list(reversed(range(n)))
    return [
        Shape(max(round(shape.words * factors[k]), 0), max(round(shape.output_tokens * factors[order[k]]), 1))
        for k in range(n)
    ]


def merge_levels(a: LevelResult, b: LevelResult) -> LevelResult:
    """Two runs of the same rung as one (busy-clock throughput over both; token means over both)."""
    n = a.requests + b.requests
    busy = (a.busy_s or 0.0) + (b.busy_s or 0.0)
    elapsed = a.elapsed_s + b.elapsed_s
    return LevelResult(
        concurrency=a.concurrency,
        requests=n,
        elapsed_s=elapsed,
        throughput_rps=n / busy if busy > 0 else n / elapsed,
        wall_throughput_rps=n / elapsed,
        busy_s=busy,
        mean_latency_s=(a.mean_latency_s * a.requests + b.mean_latency_s * b.requests) / n,
        mean_prompt_tokens=(a.mean_prompt_tokens * a.requests + b.mean_prompt_tokens * b.requests) / n,
        mean_completion_tokens=(a.mean_completion_tokens * a.requests + b.mean_completion_tokens * b.requests)
        / n,
        usages=[*a.usages, *b.usages],
    )


def cycle_of(shapes: Sequence[Shape]) -> Callable[[int], Shape]:
    """Request ``i`` gets ``shapes[i % len(shapes)]`` (one shape: every request alike)."""
    cycle = list(shapes)

    def pick(i: int) -> Shape:
        return cycle[i % len(cycle)]

    return pick
