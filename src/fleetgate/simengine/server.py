"""OpenAI-compatible simulated engine: an aiohttp shell around the pure performance model.

One asyncio task (the *driver*) runs the :class:`~fleetgate.simengine.perfmodel.EngineModel`. Model time is
mapped to real time by ``time_scale`` (real seconds per model second; 0 = as fast as possible): the driver
sleeps until the model's next event (or at most ``quantum_s`` so long decode runs still stream smoothly),
advances the model to "now" and hands the emitted tokens to the waiting HTTP handlers. When idle it waits on
a future that a new request resolves, so an idle engine costs nothing. Faults (``faults.py``) freeze the
clock (hang), scale it (slow), fail requests (error_rate), stop streams (stall) or end the process (crash).

Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics,
GET/POST /admin/fault, GET /admin/stats.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from fleetgate.core.errors import FleetgateError, InvalidRequestError, NotFoundError
from fleetgate.core.openai import load_json_body, parse_request
from fleetgate.core.tokenize import block_hashes
from fleetgate.simengine.faults import NO_FAULT, Fault, fault_from_json
from fleetgate.simengine.metrics import EngineMetrics, ServerCounters
from fleetgate.simengine.perfmodel import EngineModel, EngineRequest, PerfParams, StepResult
from fleetgate.simengine.textgen import WORDS, PlannedOutput, plan_output, start_index, tokens_text

_JSON = "application/json"
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(frozen=True, slots=True)
class SimEngineConfig:
    """Everything ``fleetgate engine sim`` can set (CLI flags map one to one)."""

    model: str = "fleetgate-sim"
    host: str = "127.0.0.1"
    port: int = 8000
    params: PerfParams = field(default_factory=PerfParams)
    time_scale: float = 1.0
    fault: Fault = NO_FAULT
    seed: int = 0
    eos_probability: float = 0.0
    default_max_tokens: int = 256
    image_tokens: int = 576
    quantum_s: float = 0.005
    served_model_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.time_scale < 0 or not math.isfinite(self.time_scale):
            raise ValueError("time_scale must be a finite number >= 0")
        if not 0.0 <= self.eos_probability < 1.0:
            raise ValueError("eos_probability must be within [0, 1)")
        if self.default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        if self.image_tokens < 0:
            raise ValueError("image_tokens must be >= 0")


class _Live:
    """A request on its way through the engine, shared by the driver and its HTTP handler."""

    __slots__ = (
        "arrival",
        "cached",
        "done",
        "image_tokens",
        "model_id",
        "plan",
        "prompt_tokens",
        "start",
        "tokens",
        "waiter",
    )

    def __init__(
        self, model_id: str, plan: PlannedOutput, start: int, prompt_tokens: int, arrival: float
    ) -> None:
        self.model_id = model_id
        self.plan = plan
        self.start = start
        self.prompt_tokens = prompt_tokens
        self.image_tokens = 0
        self.arrival = arrival
        self.tokens = 0
        self.cached = 0
        self.done = False
        self.waiter: asyncio.Future[None] | None = None


@dataclass(frozen=True, slots=True)
class _Prepared:
    model: str
    stream: bool
    include_usage: bool
    prompt_tokens: int
    image_tokens: int
    hashes: tuple[int, ...]
    plan: PlannedOutput
    start: int
    priority: int


def _error_response(exc: FleetgateError) -> web.Response:
    return web.Response(status=exc.status, body=orjson.dumps(exc.to_dict()), content_type=_JSON)


class SimEngine:
    """The simulated engine: model, driver task, HTTP routes. Build with a config, then ``await start()``."""

    def __init__(self, config: SimEngineConfig) -> None:
        self.config = config
        self.model = EngineModel(config.params)
        self.names = (config.model, *config.served_model_names)
        self.counters = ServerCounters()
        self.metrics = EngineMetrics(config.model, self.model.stats, self.counters)
        self._rng = random.Random(config.seed)
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid():x}"
        self._live: dict[str, _Live] = {}
        self._created = int(time.time())
        self._fault = NO_FAULT
        self._scale = config.time_scale
        self._hung = False
        self._vclock = 0.0  # model time reached by the driver (frozen while hung)
        self._v0 = 0.0  # model time at real time _r0 (when the time scale is > 0)
        self._r0 = 0.0
        self._wake_fut: asyncio.Future[None] | None = None
        self._driver: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._crash_handle: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ lifecycle
    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[_json_errors])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/admin/fault", self._get_fault)
        app.router.add_post("/admin/fault", self._post_fault)
        app.router.add_get("/admin/stats", self._stats)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        await self.start()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start the driver task (the app's startup hook calls this)."""
        if self._driver is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._r0 = self._loop.time()
        self._driver = asyncio.create_task(self._drive(), name="simengine-driver")
        if self.config.fault.kind != "none":
            self.set_fault(self.config.fault)

    async def stop(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
            self._driver = None

    # ------------------------------------------------------------------ clock
    def _vnow(self) -> float:
        """Current model time."""
        if self._hung or self._scale == 0 or self._loop is None:
            return self._vclock
        return self._v0 + (self._loop.time() - self._r0) / self._scale

    def _rebase(self, *, scale: float | None = None, hung: bool | None = None) -> None:
        """Change the clock mapping without a jump in model time."""
        v = self._vnow()
        self._vclock = v
        self._v0 = v
        self._r0 = self._loop.time() if self._loop is not None else 0.0
        if scale is not None:
            self._scale = scale
        if hung is not None:
            self._hung = hung
        self._wake()

    def _wake(self) -> None:
        fut = self._wake_fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def _sleep(self, delay: float | None) -> None:
        """Sleep up to ``delay`` seconds (forever when None) or until ``_wake``."""
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        self._wake_fut = fut
        handle = self._loop.call_later(delay, _resolve, fut) if delay is not None else None
        try:
            await fut
        finally:
            if handle is not None:
                handle.cancel()
            self._wake_fut = None

    # ------------------------------------------------------------------ driver
    async def _drive(self) -> None:
        assert self._loop is not None
        loop = self._loop
        model = self.model
        while True:
            if self._hung:
                await self._sleep(None)
                continue
            t_next = model.next_event_time()
            if t_next is None:
                await self._sleep(None)
                continue
            scale = self._scale
            if scale == 0:
                res = model.advance(t_next)
                self._vclock = t_next
                self._publish(res)
                await asyncio.sleep(0)
                continue
            due = self._r0 + (t_next - self._v0) * scale
            now = loop.time()
            if due > now:
                await self._sleep(min(due - now, self.config.quantum_s))
                if self._hung or self._scale != scale:
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
        live_map = self._live
        for rid, cached in res.cached_tokens.items():
            live = live_map.get(rid)
            if live is not None:
                live.cached = cached
        ttft = self.metrics.ttft
        now = self._loop.time() if self._loop is not None else 0.0
        for rid, n in res.emitted.items():
            live = live_map.get(rid)
            if live is not None:
                if live.tokens == 0:
                    ttft.observe(now - live.arrival)
                live.tokens += n
                waiter = live.waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
        for rid in res.finished:
            live = live_map.get(rid)
            if live is not None:
                live.done = True
                waiter = live.waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)

    async def _wait(self, live: _Live) -> None:
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        live.waiter = fut
        try:
            await fut
        finally:
            live.waiter = None

    # ------------------------------------------------------------------ faults
    @property
    def fault(self) -> Fault:
        return self._fault

    def set_fault(self, fault: Fault) -> None:
        """Apply ``fault`` now (replacing the active one)."""
        self._fault = fault
        self.metrics.collector.fault_kind = fault.kind
        base = self.config.time_scale
        scale = base
        if fault.kind == "slow":
            scale = (base if base > 0 else 1.0) * (fault.value or 1.0)
        self._rebase(scale=scale, hung=fault.kind == "hang")
        if self._crash_handle is not None:
            self._crash_handle.cancel()
            self._crash_handle = None
        if fault.kind == "crash" and self._loop is not None:
            self._crash_handle = self._loop.call_later(max(fault.value or 0.0, 0.02), _crash)
        # Streams stalled by a previous "stall" resume when it is cleared.
        for live in self._live.values():
            waiter = live.waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    # ------------------------------------------------------------------ handlers
    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _models(self, _request: web.Request) -> web.Response:
        data = [
            {
                "id": name,
                "object": "model",
                "created": self._created,
                "owned_by": "fleetgate",
                "root": self.config.model,
                "parent": None,
                "max_model_len": self.config.params.max_model_len,
            }
            for name in self.names
        ]
        return web.Response(body=orjson.dumps({"object": "list", "data": data}), content_type=_JSON)

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"})

    async def _get_fault(self, _request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self._fault.to_dict()), content_type=_JSON)

    async def _post_fault(self, request: web.Request) -> web.Response:
        try:
            fault = fault_from_json(load_json_body(await request.read()))
        except FleetgateError as exc:
            return _error_response(exc)
        self.set_fault(fault)
        return web.Response(body=orjson.dumps({"ok": True, **fault.to_dict()}), content_type=_JSON)

    async def _stats(self, _request: web.Request) -> web.Response:
        s = self.model.stats()
        body = {
            "model": self.config.model,
            "fault": self._fault.to_dict(),
            "time_scale": self._scale,
            "engine": {
                "num_running": s.num_running,
                "num_waiting": s.num_waiting,
                "kv_usage": s.kv_usage,
                "prefix_cache_queries": s.prefix_cache_queries,
                "prefix_cache_hits": s.prefix_cache_hits,
                "prompt_tokens": s.prompt_tokens,
                "generation_tokens": s.generation_tokens,
                "preemptions": s.preemptions,
                "requests_finished": s.requests_finished,
                "requests_cancelled": s.requests_cancelled,
            },
            "server": {
                "requests_received": self.counters.requests_received,
                "requests_cancelled": self.counters.requests_cancelled,
                "errors_injected": self.counters.errors_injected,
                "in_flight": len(self._live),
                "finished": dict(self.counters.finished),
            },
        }
        return web.Response(body=orjson.dumps(body), content_type=_JSON)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "completions")

    # ------------------------------------------------------------------ completion path
    def _prepare(self, body: dict[str, Any], endpoint: str) -> _Prepared:
        """Validate a request and decide its output up front."""
        parsed = parse_request(body, "chat" if endpoint == "chat" else "completions")
        if parsed.model not in self.names:
            raise NotFoundError(f"The model `{parsed.model}` does not exist.", param="model")
        n = body.get("n")
        if n is not None and n != 1:
            raise InvalidRequestError("Only n=1 is supported by this engine.", param="n")
        priority = body.get("priority", 0)
        if priority is None:
            priority = 0
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidRequestError("'priority' must be an integer", param="priority")
        ignore_eos = body.get("ignore_eos", False)
        if ignore_eos is not None and not isinstance(ignore_eos, bool):
            raise InvalidRequestError("'ignore_eos' must be a boolean", param="ignore_eos")
        stop = _stop_list(body.get("stop"))
        params = self.config.params
        image_tokens = parsed.image_parts * self.config.image_tokens
        prompt_tokens = max(1, parsed.input_tokens) + image_tokens
        room = params.max_model_len - prompt_tokens
        if room < 1:
            raise InvalidRequestError(
                f"This model's maximum context length is {params.max_model_len} tokens. However, your "
                f"request has {prompt_tokens} input tokens. Please reduce the length of the input messages.",
                param="messages" if endpoint == "chat" else "prompt",
            )
        max_tokens = parsed.max_output_tokens
        if max_tokens is None:
            max_tokens = min(self.config.default_max_tokens, room)
        elif max_tokens > room:
            raise InvalidRequestError(
                f"This model's maximum context length is {params.max_model_len} tokens. However, you "
                f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or completion.",
                param="max_tokens",
            )
        if not self.model.fits(prompt_tokens, max_tokens):
            raise InvalidRequestError(
                f"The request needs {prompt_tokens + max_tokens} tokens of KV cache; this engine has "
                f"{params.kv_capacity_tokens}.",
                param="max_tokens",
            )
        eos_at: int | None = None
        p = self.config.eos_probability
        if p > 0 and not ignore_eos:
            # Geometric number of tokens before a sampled EOS (seeded: reproducible per process).
            eos_at = 1 + int(math.log(1.0 - self._rng.random()) / math.log(1.0 - p))
        start = start_index(parsed.prompt_text)
        plan = plan_output(start, max_tokens, stop, eos_at)
        hashes = block_hashes(parsed.prompt_text, params.block_tokens)
        return _Prepared(
            parsed.model,
            parsed.stream,
            parsed.include_usage,
            prompt_tokens,
            image_tokens,
            hashes,
            plan,
            start,
            priority,
        )

    async def _complete(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        assert self._loop is not None
        arrival = self._loop.time()
        try:
            prep = self._prepare(load_json_body(await request.read()), endpoint)
        except FleetgateError as exc:
            return _error_response(exc)
        self.counters.requests_received += 1
        fault = self._fault
        if fault.kind == "error_rate" and self._rng.random() < (fault.value or 0.0):
            self.counters.errors_injected += 1
            self.counters.finished["error"] += 1
            err = FleetgateError("Simulated engine failure (fault injection: error_rate).")
            return _error_response(err)
        seq = next(self._ids)
        model_id = str(seq)
        plan = prep.plan
        live = _Live(model_id, plan, prep.start, prep.prompt_tokens, arrival)
        live.image_tokens = prep.image_tokens
        self._live[model_id] = live
        self.model.submit(
            EngineRequest(model_id, prep.prompt_tokens, plan.tokens, prep.hashes, prep.priority), self._vnow()
        )
        self._wake()
        kind = "chatcmpl" if endpoint == "chat" else "cmpl"
        rid = f"{kind}-{self._prefix}-{seq}"
        finished = False
        try:
            if prep.stream:
                resp = await self._stream(request, live, endpoint, rid, prep.model, prep.include_usage)
            else:
                while not live.done:
                    await self._wait(live)
                resp = self._full_response(live, endpoint, rid, prep.model)
            finished = True
            return resp
        except ConnectionError:
            return web.Response(status=499)  # the client is gone; nobody reads this
        finally:
            del self._live[model_id]
            now = self._loop.time()
            if finished and live.done:
                self.counters.finished[plan.finish_reason] += 1
                self.metrics.e2e.observe(now - arrival)
            else:
                self.counters.requests_cancelled += 1
                self.counters.finished["abort"] += 1
                self.model.cancel(model_id, self._vnow())
                self._wake()

    def _usage(self, live: _Live) -> dict[str, Any]:
        completion = live.plan.tokens
        details: dict[str, int] = {"cached_tokens": live.cached}
        if live.image_tokens:
            details["image_tokens"] = live.image_tokens  # read by core.openai.usage_from_mapping
        return {
            "prompt_tokens": live.prompt_tokens,
            "total_tokens": live.prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": details,
        }

    def _full_response(self, live: _Live, endpoint: str, rid: str, model: str) -> web.Response:
        text = tokens_text(live.start, 0, live.plan.tokens)
        if live.plan.text_chars is not None:
            text = text[: live.plan.text_chars]
        created = int(time.time())
        choice: dict[str, Any]
        if endpoint == "chat":
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": live.plan.finish_reason,
                "stop_reason": None,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": live.plan.finish_reason,
                "stop_reason": None,
            }
            obj = "text_completion"
        body = {
            "id": rid,
            "object": obj,
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": self._usage(live),
        }
        return web.Response(body=orjson.dumps(body), content_type=_JSON)

    async def _stream(
        self, request: web.Request, live: _Live, endpoint: str, rid: str, model: str, include_usage: bool
    ) -> web.StreamResponse:
        created = int(time.time())
        head = orjson.dumps({"id": rid, "created": created, "model": model})[:-1]  # '{"id":..,"model":".."'
        if endpoint == "chat":
            prefix = (
                b"data: "
                + head
                + b',"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":'
            )
            suffix = b'},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            prefix = b"data: " + head + b',"object":"text_completion","choices":[{"index":0,"text":'
            suffix = b',"logprobs":null,"finish_reason":null}]}\n\n'
        plan = live.plan
        char_budget = plan.text_chars if plan.text_chars is not None else -1
        resp: web.StreamResponse | None = None
        out = bytearray()  # bytes to send with the next write (one write per wake-up)
        sent = 0  # tokens sent
        chunks = 0
        n_words = len(WORDS)
        while True:
            fault = self._fault
            stall_at = int(fault.value or 0) if fault.kind == "stall" else -1
            if live.tokens > sent and not (0 <= stall_at <= chunks):
                if resp is None:
                    resp = web.StreamResponse(headers=_SSE_HEADERS)
                    await resp.prepare(request)
                    if endpoint == "chat":
                        role = {"role": "assistant", "content": ""}
                        first = {"index": 0, "delta": role, "logprobs": None, "finish_reason": None}
                        obj = {
                            "id": rid,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": model,
                        }
                        out += b"data: " + orjson.dumps({**obj, "choices": [first]}) + b"\n\n"
                upto = live.tokens if stall_at < 0 else min(live.tokens, sent + stall_at - chunks)
                for i in range(sent, upto):
                    text = WORDS[(live.start + i) % n_words]
                    if char_budget >= 0:
                        text = text[:char_budget]
                        char_budget -= len(text)
                        if not text:
                            continue
                    out += prefix + orjson.dumps(text) + suffix
                    chunks += 1
                sent = upto
            if live.done and sent >= plan.tokens and stall_at < 0:
                break
            # At time scale 0 the whole answer is ready at once: one write, unless a stall holds it back.
            if out and resp is not None and (self._scale > 0 or stall_at >= 0):
                await resp.write(bytes(out))
                out.clear()
            await self._wait(live)  # also woken when the fault changes (a cleared stall resumes)
        assert resp is not None
        if endpoint == "chat":
            final_choice: dict[str, Any] = {"index": 0, "delta": {}, "logprobs": None}
            obj_name = "chat.completion.chunk"
        else:
            final_choice = {"index": 0, "text": "", "logprobs": None}
            obj_name = "text_completion"
        final_choice["finish_reason"] = plan.finish_reason
        final_choice["stop_reason"] = None
        base = {"id": rid, "object": obj_name, "created": created, "model": model}
        out += b"data: " + orjson.dumps({**base, "choices": [final_choice]}) + b"\n\n"
        if include_usage:
            out += b"data: " + orjson.dumps({**base, "choices": [], "usage": self._usage(live)}) + b"\n\n"
        out += b"data: [DONE]\n\n"
        await resp.write_eof(bytes(out))
        return resp


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Unknown paths, wrong methods, oversized bodies and bugs answer in OpenAI's error JSON too."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        err = FleetgateError(exc.reason or "error")
        err.status = exc.status
        err.error_type = "invalid_request_error" if exc.status < 500 else "server_error"
        return _error_response(err)
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception as exc:
        sys.stderr.write(f"simulated engine: unexpected error: {exc!r}\n")
        return _error_response(FleetgateError(f"internal error: {exc}"))


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _crash() -> None:
    sys.stdout.flush()
    sys.stderr.write("simulated engine: crash (fault injection)\n")
    sys.stderr.flush()
    os._exit(1)


def _stop_list(stop: Any) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > 4:
            raise InvalidRequestError("'stop' accepts at most 4 sequences", param="stop")
        return list(stop)
    raise InvalidRequestError("'stop' must be a string or an array of strings", param="stop")


async def serve(
    config: SimEngineConfig,
    *,
    ready: Callable[[str], None] | None = None,
    stop_signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM),
) -> None:
    """Run the engine until a stop signal; report the bound URL via ``ready`` (default: the ready line)."""
    engine = SimEngine(config)
    app = engine.build_app()
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    await site.start()
    port = config.port
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            port = int(addr[1])
            break
    url = f"http://{config.host}:{port}"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in stop_signals:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    (ready or _print_ready)(url)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def _print_ready(url: str) -> None:
    print(f"engine ready on {url}", flush=True)


def run(config: SimEngineConfig) -> None:
    """Blocking entry point used by the CLI (uvloop when available)."""
    if config.fault.kind == "crash" and not config.fault.value:
        sys.stderr.write("simulated engine: crash at start-up (fault injection)\n")
        sys.stderr.flush()
        raise SystemExit(1)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))
