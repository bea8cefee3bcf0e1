"""Open-loop trace replay against any OpenAI-compatible endpoint (gateway, router or a single engine).

Why open loop: a closed-loop client waits for answers before sending more, so a slow system is offered less
load and its tail latency is hidden (coordinated omission). Here every request is sent at its (scaled) trace
arrival time whatever happened to earlier ones, and latencies are measured from that *scheduled* time, so
even time spent queued behind ``--concurrency-limit`` in the client counts.

Prompts come from :mod:`fleetgate.bench.prompts` (shared ``hash_ids`` -> shared text prefixes), output
lengths are forced with ``max_tokens`` + ``ignore_eos``, and every request streams with
``stream_options.include_usage`` so the engine's own token counts (and cached tokens) come back.

While the replay runs, a sampler scrapes each engine's ``/metrics`` (vLLM, SGLang or llama.cpp names): the
prefix-cache hit rate is the delta of hits over queries between the first and last scrape, and the per-replica
load (model units from the engine's token counters, with :mod:`fleetgate.core.units`) is compared with the
mean over fixed windows (default one minute).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import numpy as np
import orjson

from fleetgate.bench.prompts import PromptSynth
from fleetgate.core.sse import DONE_DATA, SSEParser
from fleetgate.core.units import DEFAULT_PROFILE, CostProfile
from fleetgate.engines.metrics import Parsed, engine_signals, parse_prometheus_text
from fleetgate.sim.traces import Trace

__all__ = [
    "PlannedRequest",
    "ReplayOptions",
    "RequestResult",
    "plan_requests",
    "run_replay",
    "summarize",
]


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request to send: when (seconds after the replay start), what, and how long an answer."""

    index: int
    at_s: float
    prompt: str
    max_tokens: int
    trace_input_tokens: int
    hash_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class RequestResult:
    """What happened to one request (times in seconds from its scheduled send time)."""

    index: int
    at_s: float
    ok: bool = False
    status: int = 0
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    queued_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finished_s: float | None = None


@dataclass(slots=True)
class ReplayOptions:
    """Everything ``run_replay`` needs besides the planned requests."""

    base_url: str
    model: str
    api: str = "chat"  # "chat" or "completions"
    metrics_urls: Sequence[str] = ()
    router_metrics_url: str | None = None
    concurrency_limit: int | None = None
    request_timeout_s: float = 600.0
    scrape_interval_s: float = 2.0
    window_s: float = 60.0
    api_key: str | None = None
    profile: CostProfile = DEFAULT_PROFILE
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    lead_s: float = 0.3
    #: Closed-loop probing (e.g. unloaded latency with ``concurrency_limit=1``): latencies count from the
    #: actual send instead of the scheduled time. Leave False for open-loop replay.
    measure_from_send: bool = False
    #: Put every request's own row (``result_rows``: TTFT, prompt and cached tokens, ...) in the report as
    #: ``request_rows``, for diagnosing where a tail comes from.
    keep_rows: bool = False
    #: Send each request with ``x-request-id: <prefix><index>`` (a gateway that keeps the client's id, as
    #: fleetgate does, then logs the plan's index beside the replica it chose).
    request_id_prefix: str | None = None


# --------------------------------------------------------------------------------------------- planning


def plan_requests(
    trace: Trace,
    synth: PromptSynth,
    *,
    output_scale: float | None = None,
    max_output_tokens: int | None = None,
) -> list[PlannedRequest]:
    """Prompts and output budgets for every trace request (arrival times already scaled in ``trace``).

    ``output_scale`` (default: the synthesiser's ``tokens_scale``) scales the trace's output lengths into
    ``max_tokens``; ``max_output_tokens`` caps them.
    """
    scale = synth.tokens_scale if output_scale is None else output_scale
    reqs = trace.requests
    t0 = reqs[0].arrival_s if reqs else 0.0
    out: list[PlannedRequest] = []
    for i, r in enumerate(reqs):
        prompt = synth.text(r.hash_ids, r.input_tokens, unique_key=f"req{i}")
        max_tokens = max(1, round(r.output_tokens * scale))
        if max_output_tokens is not None:
            max_tokens = min(max_tokens, max_output_tokens)
        out.append(PlannedRequest(i, r.arrival_s - t0, prompt, max_tokens, r.input_tokens, tuple(r.hash_ids)))
    return out


def request_body(req: PlannedRequest, opts: ReplayOptions) -> dict[str, Any]:
    """The OpenAI request body for ``req`` (streaming, usage in the last chunk, fixed output length)."""
    body: dict[str, Any] = {
        "model": opts.model,
        "max_tokens": req.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0,
    }
    if opts.api == "completions":
        body["prompt"] = req.prompt
    else:
        body["messages"] = [{"role": "user", "content": req.prompt}]
    body.update(opts.extra_body)
    return body


# --------------------------------------------------------------------------------------------- one request


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    headers: Mapping[str, str],
    req: PlannedRequest,
    opts: ReplayOptions,
    scheduled: float,
    sem: asyncio.Semaphore | None,
) -> RequestResult:
    res = RequestResult(req.index, req.at_s)
    body = orjson.dumps(request_body(req, opts))
    if opts.request_id_prefix is not None:
        headers = {**headers, "x-request-id": f"{opts.request_id_prefix}{req.index}"}
    try:
        if sem is not None:
            await sem.acquire()
        try:
            res.queued_s = time.perf_counter() - scheduled
            origin = time.perf_counter() if opts.measure_from_send else scheduled
            await _stream(session, url, headers, body, res, origin)
        finally:
            if sem is not None:
                sem.release()
    except asyncio.CancelledError:
        res.error = "cancelled"
        raise
    except TimeoutError:
        res.error = "timeout"
    except aiohttp.ClientError as exc:
        res.error = f"client_error:{type(exc).__name__}"
    except ValueError as exc:  # bad JSON from the server
        res.error = f"bad_response:{exc}"[:200]
    res.finished_s = time.perf_counter()
    return res


async def _stream(
    session: aiohttp.ClientSession,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    res: RequestResult,
    scheduled: float,
) -> None:
    async with session.post(url, data=body, headers=headers) as resp:
        res.status = resp.status
        if resp.status != 200:
            text = (await resp.read())[:300].decode("utf-8", "replace")
            res.error = f"http_{resp.status}: {text}"
            return
        parser = SSEParser()
        done = False
        chunks = 0
        async for data in resp.content.iter_any():
            for event in parser.feed(data):
                if event.data == DONE_DATA:
                    done = True
                    continue
                obj = orjson.loads(event.data)
                if "error" in obj:
                    res.error = f"stream_error: {str(obj['error'])[:200]}"
                    continue
                choices = obj.get("choices") or []
                if choices and res.ttft_s is None and _has_token(choices[0]):
                    res.ttft_s = time.perf_counter() - scheduled
                if choices:
                    chunks += 1
                usage = obj.get("usage")
                if usage:
                    res.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    res.completion_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    res.cached_tokens = int(details.get("cached_tokens") or 0)
        res.e2e_s = time.perf_counter() - scheduled
        if res.completion_tokens == 0:
            res.completion_tokens = chunks
        if res.error is None and not done:
            res.error = "truncated_stream"
        res.ok = res.error is None and res.ttft_s is not None


def _has_token(choice: Mapping[str, Any]) -> bool:
    """Whether this chunk shows a generated token. A chunk that ends the choice counts too: an engine that
    holds back text it cannot decode yet (vLLM with a byte-level token, an incomplete UTF-8 character) ends
    a one-token answer with an empty delta and its ``finish_reason``, and that token was generated by the
    time the chunk came."""
    if choice.get("finish_reason"):
        return True
    delta = choice.get("delta")
    if isinstance(delta, Mapping):
        return bool(delta.get("content") or delta.get("reasoning_content"))
    return bool(choice.get("text"))


# --------------------------------------------------------------------------------------------- metrics


@dataclass(slots=True)
class EngineCounters:
    """Cumulative counters read from one engine's /metrics at one instant."""

    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: float = 0.0


def _sum(parsed: Parsed, *names: str) -> float:
    for name in names:
        samples = parsed.get(name)
        if samples:
            return float(sum(v for _, v in samples if not math.isnan(v)))
    return 0.0


def engine_counters(parsed: Parsed) -> EngineCounters:
    """The counters replay reports need, from vLLM, SGLang or llama.cpp metric names."""
    sig = engine_signals(parsed)
    return EngineCounters(
        prefix_queries=sig.prefix_queries or 0.0,
        prefix_hits=sig.prefix_hits or 0.0,
        prompt_tokens=_sum(parsed, "vllm:prompt_tokens_total", "sglang:prompt_tokens_total"),
        generation_tokens=sig.generation_tokens or 0.0,
        requests=_sum(parsed, "vllm:request_success_total", "sglang:num_requests_total"),
        ttft_sum=_sum(
            parsed, "vllm:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_sum"
        ),
        ttft_count=_sum(
            parsed, "vllm:time_to_first_token_seconds_count", "sglang:time_to_first_token_seconds_count"
        ),
    )


@dataclass(slots=True)
class Sample:
    """One scrape of every engine (``None`` where a scrape failed) ``t`` seconds after the replay start."""

    t: float
    engines: list[EngineCounters | None]


async def _scrape(session: aiohttp.ClientSession, url: str) -> Parsed | None:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status != 200:
                return None
            return parse_prometheus_text(await resp.text())
    except (aiohttp.ClientError, TimeoutError):
        return None


async def _scrape_all(session: aiohttp.ClientSession, urls: Sequence[str], t: float) -> Sample:
    parsed = await asyncio.gather(*(_scrape(session, u) for u in urls))
    return Sample(t, [engine_counters(p) if p is not None else None for p in parsed])


# --------------------------------------------------------------------------------------------- the run


async def run_replay(
    planned: Sequence[PlannedRequest],
    opts: ReplayOptions,
    *,
    on_progress: Callable[[int, int, int], None] | None = None,
) -> dict[str, Any]:
    """Send every planned request at its time; return the summary (see :func:`summarize`).

    ``on_progress(sent, done, errors)`` is called as requests are sent and finish.
    """
    path = "/v1/completions" if opts.api == "completions" else "/v1/chat/completions"
    url = opts.base_url.rstrip("/") + path
    headers = {"Content-Type": "application/json"}
    if opts.api_key:
        headers["Authorization"] = f"Bearer {opts.api_key}"
    sem = asyncio.Semaphore(opts.concurrency_limit) if opts.concurrency_limit else None
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=opts.request_timeout_s, sock_connect=10)
    results: list[RequestResult] = []
    samples: list[Sample] = []
    counts = [0, 0, 0]  # sent, done, errors

    def finished(task: asyncio.Task[RequestResult]) -> None:
        counts[1] += 1
        if task.cancelled() or task.exception() is not None or not task.result().ok:
            counts[2] += 1
        if on_progress is not None:
            on_progress(*counts)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        router_before = await _scrape(session, opts.router_metrics_url) if opts.router_metrics_url else None
        start = time.perf_counter() + opts.lead_s
        samples.append(await _scrape_all(session, opts.metrics_urls, 0.0))
        stop = asyncio.Event()

        async def sampler() -> None:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), opts.scrape_interval_s)
                except TimeoutError:
                    pass
                if not stop.is_set() and opts.metrics_urls:
                    samples.append(await _scrape_all(session, opts.metrics_urls, time.perf_counter() - start))

        sampler_task = asyncio.create_task(sampler())
        tasks: list[asyncio.Task[RequestResult]] = []
        try:
            for req in planned:
                scheduled = start + req.at_s
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(_send(session, url, headers, req, opts, scheduled, sem))
                task.add_done_callback(finished)
                tasks.append(task)
                counts[0] += 1
                if on_progress is not None:
                    on_progress(*counts)
            for item in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(item, RequestResult):
                    results.append(item)
        finally:
            for task in tasks:
                task.cancel()
            stop.set()
            await sampler_task
        end = time.perf_counter() - start
        samples.append(await _scrape_all(session, opts.metrics_urls, end))
        router_after = await _scrape(session, opts.router_metrics_url) if opts.router_metrics_url else None
    for r in results:
        if r.finished_s is not None:
            r.finished_s -= start
    report = summarize(results, samples, opts, wall_s=end, router_metrics=(router_before, router_after))
    if opts.keep_rows:
        report["request_rows"] = result_rows(sorted(results, key=lambda r: r.index))
    return report


# --------------------------------------------------------------------------------------------- statistics


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else None


def _dist(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "p50": _pct(values, 50),
        "p95": _pct(values, 95),
        "p99": _pct(values, 99),
        "mean": float(np.mean(values)) if values else None,
        "max": float(np.max(values)) if values else None,
    }


def _engine_mu(profile: CostProfile, a: EngineCounters, b: EngineCounters) -> float:
    """MU served between two scrapes of one engine (linear in the counters: gamma per finished request)."""
    n = max(0.0, b.requests - a.requests)
    prompt = max(0.0, b.prompt_tokens - a.prompt_tokens)
    hits = max(0.0, b.prefix_hits - a.prefix_hits)
    out = max(0.0, b.generation_tokens - a.generation_tokens)
    cost = profile.cost(int(prompt), out, cached_tokens=int(min(hits, prompt)))
    return profile.gamma * (n - 1) + cost


def load_windows(samples: Sequence[Sample], profile: CostProfile, window_s: float) -> list[dict[str, Any]]:
    """Per-replica MU and requests in consecutive windows of ``window_s`` (the last one if >= half full)."""
    usable = [s for s in samples if all(e is not None for e in s.engines)]
    if len(usable) < 2 or not usable[0].engines:
        return []
    end = usable[-1].t
    out: list[dict[str, Any]] = []
    w0 = 0.0
    while w0 < end:
        w1 = min(w0 + window_s, end)
        if w1 - w0 < window_s / 2 and out:
            break
        a = min(usable, key=lambda s: abs(s.t - w0))
        b = min(usable, key=lambda s: abs(s.t - w1))
        if b.t > a.t:
            mu = [
                _engine_mu(profile, ea, eb)
                for ea, eb in zip(a.engines, b.engines, strict=True)
                if ea is not None and eb is not None
            ]
            reqs = [
                max(0.0, eb.requests - ea.requests)
                for ea, eb in zip(a.engines, b.engines, strict=True)
                if ea is not None and eb is not None
            ]
            mean = sum(mu) / len(mu) if mu else 0.0
            out.append(
                {
                    "start_s": round(a.t, 2),
                    "end_s": round(b.t, 2),
                    "mu": [round(x, 3) for x in mu],
                    "requests": reqs,
                    "max_over_mean": (max(mu) / mean) if mean > 0 else None,
                }
            )
        w0 += window_s
    return out


def _histogram_quantile(parsed: Parsed, name: str, q: float) -> float | None:
    """Quantile from a Prometheus histogram's buckets (all label sets merged), linear within a bucket."""
    buckets: dict[float, float] = {}
    for labels, value in parsed.get(name + "_bucket", []):
        le = labels.get("le")
        if le is None:
            continue
        bound = math.inf if le in ("+Inf", "inf") else float(le)
        buckets[bound] = buckets.get(bound, 0.0) + value
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            span = count - prev_count
            return prev_bound + (bound - prev_bound) * ((rank - prev_count) / span if span > 0 else 1.0)
        prev_bound, prev_count = bound, count
    return prev_bound


_ROUTING_HIST = re.compile(r"routing|route_decision|pick|select|schedul")


def _router_latency(before: Parsed | None, after: Parsed | None) -> dict[str, Any] | None:
    """Routing-time histograms a router exposes (``*routing*``/``*pick*``/``*select*`` ``_seconds``).

    Whole-request durations (``*request_duration*``) do not match: they are not routing time.
    """
    if after is None:
        return None
    found: dict[str, Any] = {}
    for name in after:
        if not name.endswith("_bucket"):
            continue
        base = name[: -len("_bucket")]
        if _ROUTING_HIST.search(base.lower()) and "second" in base.lower():
            delta = _delta_hist(before or {}, after, base)
            found[base] = {
                "p50_ms": _ms(_histogram_quantile(delta, base, 0.5)),
                "p99_ms": _ms(_histogram_quantile(delta, base, 0.99)),
            }
    return found or None


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def _delta_hist(before: Parsed, after: Parsed, base: str) -> Parsed:
    key = base + "_bucket"
    old: dict[tuple[tuple[str, str], ...], float] = {
        tuple(sorted(lab.items())): v for lab, v in before.get(key, [])
    }
    return {key: [(lab, v - old.get(tuple(sorted(lab.items())), 0.0)) for lab, v in after.get(key, [])]}


def summarize(
    results: Sequence[RequestResult],
    samples: Sequence[Sample],
    opts: ReplayOptions,
    *,
    wall_s: float,
    router_metrics: tuple[Parsed | None, Parsed | None] = (None, None),
) -> dict[str, Any]:
    """The replay report: latencies (seconds), throughput, errors, cache hit rate, load balance."""
    ok = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            kind = (r.error or "no_token").split(":")[0]
            errors[kind] = errors.get(kind, 0) + 1
    out_tokens = sum(r.completion_tokens for r in ok)
    last = max((r.finished_s for r in results if r.finished_s is not None), default=wall_s)
    report: dict[str, Any] = {
        "requests": len(results),
        "ok": len(ok),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "wall_s": round(wall_s, 3),
        "ttft_s": _dist([r.ttft_s for r in ok if r.ttft_s is not None]),
        "e2e_s": _dist([r.e2e_s for r in ok if r.e2e_s is not None]),
        "client_queue_s": _dist([r.queued_s for r in results]),
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / last if last > 0 else 0.0,
        "request_rate_per_s": len(results) / max(wall_s, 1e-9),
        "usage_cached_token_share": (
            sum(r.cached_tokens for r in ok) / max(1, sum(r.prompt_tokens for r in ok))
        ),
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
    }
    first, final = (samples[0], samples[-1]) if samples else (None, None)
    if first is not None and final is not None and first.engines:
        per: list[dict[str, Any]] = []
        dq = dh = 0.0
        ttft_sum = ttft_n = 0.0
        for url, a, b in zip(opts.metrics_urls, first.engines, final.engines, strict=True):
            if a is None or b is None:
                per.append({"url": url, "scrape_failed": True})
                continue
            q, h = b.prefix_queries - a.prefix_queries, b.prefix_hits - a.prefix_hits
            dq, dh = dq + q, dh + h
            ttft_sum += b.ttft_sum - a.ttft_sum
            ttft_n += b.ttft_count - a.ttft_count
            per.append(
                {
                    "url": url,
                    "requests": b.requests - a.requests,
                    "prefix_hit_rate": h / q if q > 0 else None,
                    "mu": round(_engine_mu(opts.profile, a, b), 3),
                }
            )
        report["engines"] = per
        report["prefix_cache_hit_rate"] = dh / dq if dq > 0 else None
        mus = [p["mu"] for p in per if "mu" in p]
        mean_mu = sum(mus) / len(mus) if mus else 0.0
        report["load_max_over_mean_total"] = max(mus) / mean_mu if mean_mu > 0 else None
        windows = load_windows(samples, opts.profile, opts.window_s)
        report["load_windows"] = windows
        ratios = [w["max_over_mean"] for w in windows if w["max_over_mean"] is not None]
        report["load_max_over_mean_window"] = max(ratios) if ratios else None
        engine_ttft = ttft_sum / ttft_n if ttft_n > 0 else None
        report["engine_ttft_mean_s"] = engine_ttft
        client_mean = report["ttft_s"]["mean"]
        # Client TTFT minus the engines' own TTFT (arrival at the engine -> first token): what the path in
        # front of the engines (router + proxy + loopback) adds on average.
        report["added_latency_mean_ms"] = (
            None if engine_ttft is None or client_mean is None else (client_mean - engine_ttft) * 1000.0
        )
    report["router_latency"] = _router_latency(*router_metrics)
    return report


def result_rows(results: Sequence[RequestResult]) -> list[dict[str, Any]]:
    """Per-request rows (``ReplayOptions.keep_rows``)."""
    return [asdict(r) for r in results]
