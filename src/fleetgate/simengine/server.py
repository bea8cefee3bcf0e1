"""OpenAI-compatible simulated engine: the aiohttp shell around the pure performance model.

The driver (``driver.py``) runs the model against the clock; this module validates requests, decides each
output up front (``textgen`` filler text, or ``structured`` tool calls and JSON), submits one sequence per
choice and streams or returns what the driver emits (shapes in ``responses.py``). Faults (``faults.py``)
freeze the clock (hang), scale it (slow), fail requests (error_rate), stop streams (stall) or end the
process (crash).

Supported request features: ``n``, a list ``prompt`` (one choice per prompt), ``stop``, ``seed``,
``logprobs`` (chat: boolean plus ``top_logprobs``; completions: an integer, with ``echo``), ``tools`` /
``tool_choice`` (a call to one of the tools, streamed as deltas), ``response_format`` (json_object,
json_schema), ``priority`` and ``ignore_eos``.

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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from fleetgate.core.errors import FleetgateError, InvalidRequestError, NotFoundError
from fleetgate.core.openai import ParsedRequest, load_json_body, parse_request
from fleetgate.core.tokenize import block_hashes, count_tokens, token_pieces
from fleetgate.orjson_codec import ORJSON
from fleetgate.simengine.driver import EngineDriver, Live
from fleetgate.simengine.faults import NO_FAULT, Fault, fault_from_json
from fleetgate.simengine.metrics import EngineMetrics, ServerCounters
from fleetgate.simengine.perfmodel import EngineModel, EngineRequest, PerfParams
from fleetgate.simengine.responses import (
    MAX_LOGPROBS,
    ChoicePlan,
    LogprobSpec,
    StreamEncoder,
    full_body,
    usage,
)
from fleetgate.simengine.structured import Structured, json_text, parse_structured, pick_tool, tool_call
from fleetgate.simengine.textgen import PlannedOutput, continuation_prompt, plan_output, start_index

_JSON = "application/json"
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_MAX_N = 128


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


@dataclass(frozen=True, slots=True)
class _Prompt:
    """One prompt of a request: its text (what seeds the output), token count and, for ``echo``, tokens."""

    text: str
    tokens: int
    echo: tuple[str, ...] = ()


@dataclass(slots=True)
class _Prepared:
    model: str
    stream: bool
    include_usage: bool
    image_tokens: int
    priority: int
    choices: list[ChoicePlan]
    firsts: list[ChoicePlan]  # the first choice of each prompt (its prompt tokens count in usage)
    logprobs: LogprobSpec | None


def _error_response(exc: FleetgateError) -> web.Response:
    return web.Response(status=exc.status, body=orjson.dumps(exc.to_dict()), content_type=_JSON)


class SimEngine:
    """The simulated engine: model, driver, HTTP routes. Build with a config, then ``await start()``."""

    def __init__(self, config: SimEngineConfig) -> None:
        self.config = config
        self.model = EngineModel(config.params)
        self.names = (config.model, *config.served_model_names)
        self.counters = ServerCounters()
        self.metrics = EngineMetrics(config.model, self.model.stats, self.counters)
        self.driver = EngineDriver(
            self.model, self.metrics, time_scale=config.time_scale, quantum_s=config.quantum_s
        )
        self._rng = random.Random(config.seed)
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid():x}"
        self._created = int(time.time())
        self._fault = NO_FAULT
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
        await self.driver.start()
        if self.config.fault.kind != "none":
            self.set_fault(self.config.fault)

    async def stop(self) -> None:
        await self.driver.stop()

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
        self.driver.set_clock(scale=scale, hung=fault.kind == "hang")
        if self._crash_handle is not None:
            self._crash_handle.cancel()
            self._crash_handle = None
        loop = self.driver.loop
        if fault.kind == "crash" and loop is not None:
            self._crash_handle = loop.call_later(max(fault.value or 0.0, 0.02), _crash)

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
            fault = fault_from_json(load_json_body(await request.read(), codec=ORJSON))
        except FleetgateError as exc:
            return _error_response(exc)
        self.set_fault(fault)
        return web.Response(body=orjson.dumps({"ok": True, **fault.to_dict()}), content_type=_JSON)

    async def _stats(self, _request: web.Request) -> web.Response:
        s = self.model.stats()
        body = {
            "model": self.config.model,
            "fault": self._fault.to_dict(),
            "time_scale": self.driver.scale,
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
                "probes_received": self.counters.probes_received,
                "requests_cancelled": self.counters.requests_cancelled,
                "errors_injected": self.counters.errors_injected,
                "in_flight": len(self.driver.live),
                "finished": dict(self.counters.finished),
            },
        }
        return web.Response(body=orjson.dumps(body), content_type=_JSON)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "completions")

    # ------------------------------------------------------------------ completion path
    def _prepare(self, body: dict[str, Any], endpoint: str, seq: int) -> _Prepared:
        """Validate a request and decide every choice's output up front."""
        parsed = parse_request(body, "chat" if endpoint == "chat" else "completions")
        if parsed.model not in self.names:
            raise NotFoundError(f"The model `{parsed.model}` does not exist.", param="model")
        n = body.get("n") or 1
        priority = body.get("priority", 0)
        if priority is None:
            priority = 0
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidRequestError("'priority' must be an integer", param="priority")
        ignore_eos = body.get("ignore_eos", False)
        if ignore_eos is not None and not isinstance(ignore_eos, bool):
            raise InvalidRequestError("'ignore_eos' must be a boolean", param="ignore_eos")
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise InvalidRequestError("'seed' must be an integer", param="seed")
        stop = _stop_list(body.get("stop"))
        structured = parse_structured(body)
        image_tokens = parsed.image_parts * self.config.image_tokens
        if endpoint == "chat":
            text, tokens = parsed.prompt_text, parsed.input_tokens
            if (continued := continuation_prompt(body)) is not None:  # continue_final_message
                text, tokens = continued, count_tokens(continued)
            prompts = [_Prompt(text, max(1, tokens) + image_tokens)]
        else:
            prompts = _prompts(body.get("prompt"), echo=bool(body.get("echo")))
        if len(prompts) * n > _MAX_N:
            raise InvalidRequestError(f"At most {_MAX_N} choices per request (prompts x n).", param="n")
        cache_salt = body.get("cache_salt")  # vLLM's field: prompts with different salts share no cache entry
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise InvalidRequestError("'cache_salt' must be a non-empty string", param="cache_salt")
        params = self.config.params
        choices: list[ChoicePlan] = []
        firsts: list[ChoicePlan] = []
        for p_index, prompt in enumerate(prompts):
            max_tokens = self._max_tokens(parsed, prompt.tokens, endpoint)
            hashes = block_hashes(prompt.text, params.block_tokens, (cache_salt or "").encode())
            for j in range(n):
                # the salt goes first: the text stays a running function of the prompt and the tokens before
                # it, so a continuation (prompt + partial answer, same seed) goes on exactly
                salt_text = prompt.text if seed is None and j == 0 else f"\x00{seed}\x00{j}\x00{prompt.text}"
                start = start_index(salt_text)
                rng = self._rng if seed is None else random.Random(seed * 1_000_003 + j)
                eos_at = None
                p = self.config.eos_probability
                if p > 0 and not ignore_eos:
                    # Geometric number of tokens before a sampled EOS (seeded: reproducible per process).
                    eos_at = 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - p))
                choice = ChoicePlan(
                    index=p_index * n + j,
                    start=start,
                    plan=plan_output(start, max_tokens, stop, eos_at),
                    prompt_tokens=prompt.tokens,
                    hashes=hashes,
                    echo=prompt.echo,
                )
                if endpoint == "chat" or structured.json_schema is not None or structured.json_object:
                    self._structure(choice, structured, body, max_tokens, f"call_{self._prefix}x{seq}x{j}")
                choices.append(choice)
                if j == 0:
                    firsts.append(choice)
        return _Prepared(
            model=parsed.model,
            stream=parsed.stream,
            include_usage=parsed.include_usage,
            image_tokens=image_tokens,
            priority=priority,
            choices=choices,
            firsts=firsts,
            logprobs=_logprob_spec(body, endpoint),
        )

    def _max_tokens(self, parsed: ParsedRequest, prompt_tokens: int, endpoint: str) -> int:
        params = self.config.params
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
        return max_tokens

    def _structure(
        self, choice: ChoicePlan, spec: Structured, body: Mapping[str, Any], max_tokens: int, call_id: str
    ) -> None:
        """Turn ``choice`` into a tool call or a JSON answer when the request asks for one."""
        messages = body.get("messages") or []
        tool = pick_tool(spec, messages)
        text: str | None
        if tool is not None:
            choice.tool = tool_call(tool, choice.start, call_id)
            text = choice.tool.arguments
        else:
            text = json_text(spec, choice.start)
        if text is None:
            return
        pieces = tuple(token_pieces(text))
        tokens = min(len(pieces), max_tokens)
        choice.pieces = pieces
        choice.plan = PlannedOutput(max(1, tokens), "length" if tokens < len(pieces) else "stop")

    async def _complete(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        driver = self.driver
        arrival = driver.now()
        seq = next(self._ids)
        try:
            prep = self._prepare(load_json_body(await request.read(), codec=ORJSON), endpoint, seq)
        except FleetgateError as exc:
            return _error_response(exc)
        self.counters.requests_received += 1
        if "X-Fleetgate-Probe" in request.headers:
            self.counters.probes_received += 1
        fault = self._fault
        if fault.kind == "error_rate" and self._rng.random() < (fault.value or 0.0):
            self.counters.errors_injected += 1
            self.counters.finished["error"] += 1
            err = FleetgateError("Simulated engine failure (fault injection: error_rate).")
            return _error_response(err)
        lives: list[Live] = []
        for k, choice in enumerate(prep.choices):
            model_id = f"{seq}" if k == 0 else f"{seq}.{k}"
            live = Live(model_id, arrival)
            choice.live = live
            choice.chars_left = choice.plan.text_chars if choice.plan.text_chars is not None else -1
            lives.append(live)
            tokens = choice.plan.tokens
            driver.submit(
                live, EngineRequest(model_id, choice.prompt_tokens, tokens, choice.hashes, prep.priority)
            )
        kind = "chatcmpl" if endpoint == "chat" else "cmpl"
        rid = f"{kind}-{self._prefix}-{seq}"
        created = int(time.time())
        finished = False
        try:
            if prep.stream:
                encoder = StreamEncoder(endpoint, rid, created, prep.model, prep.logprobs)
                resp = await self._stream(request, prep, encoder)
            else:
                while not all(live.done for live in lives):
                    await driver.wait(lives)
                use = usage(prep.choices, prep.firsts, prep.image_tokens)
                body = full_body(endpoint, rid, created, prep.model, prep.choices, use, prep.logprobs)
                resp = web.Response(body=orjson.dumps(body), content_type=_JSON)
            finished = True
            return resp
        except ConnectionError:
            return web.Response(status=499)  # the client is gone; nobody reads this
        finally:
            done = all(live.done for live in lives)
            for live in lives:
                driver.release(live)
            if finished and done:
                self.counters.finished[prep.choices[0].plan.finish_reason] += 1
                self.metrics.e2e.observe(driver.now() - arrival)
            else:
                self.counters.requests_cancelled += 1
                self.counters.finished["abort"] += 1

    async def _stream(
        self, request: web.Request, prep: _Prepared, encoder: StreamEncoder
    ) -> web.StreamResponse:
        choices = prep.choices
        lives = [c.live for c in choices if c.live is not None]
        resp: web.StreamResponse | None = None
        out = bytearray()  # bytes to send with the next write (one write per wake-up)
        chunks = 0  # token chunks sent (a stall fault stops after that many)
        while True:
            fault = self._fault
            stall_at = int(fault.value or 0) if fault.kind == "stall" else -1
            if any(c.live.tokens > c.sent for c in choices if c.live) and not (0 <= stall_at <= chunks):
                if resp is None:
                    resp = web.StreamResponse(headers=_SSE_HEADERS)
                    await resp.prepare(request)
                    for c in choices:
                        out += encoder.opening(c)
                for c in choices:
                    assert c.live is not None
                    upto = c.live.tokens if stall_at < 0 else min(c.live.tokens, c.sent + stall_at - chunks)
                    texts = c.tokens()
                    plain = encoder.plain(c)
                    for i in range(c.sent, upto):
                        text = texts[i]
                        if c.chars_left >= 0:
                            text = text[: c.chars_left]
                            c.chars_left -= len(text)
                            if not text:
                                continue
                        if plain is not None:
                            out += plain[0] + orjson.dumps(text) + plain[1]
                        else:
                            out += encoder.token(c, i, text)
                        chunks += 1
                    c.sent = max(c.sent, upto)
            if stall_at < 0 and all(c.live.done and c.sent >= c.plan.tokens for c in choices if c.live):
                break
            # At time scale 0 the whole answer is ready at once: one write, unless a stall holds it back.
            if out and resp is not None and (self.driver.scale > 0 or stall_at >= 0):
                await resp.write(bytes(out))
                out.clear()
            await self.driver.wait(lives)  # also woken when the fault changes (a cleared stall resumes)
        assert resp is not None
        for c in choices:
            out += encoder.closing(c)
        if prep.include_usage:
            out += encoder.usage(usage(choices, prep.firsts, prep.image_tokens))
        out += b"data: [DONE]\n\n"
        await resp.write_eof(bytes(out))
        return resp


def _logprob_spec(body: Mapping[str, Any], endpoint: str) -> LogprobSpec | None:
    """Chat: ``logprobs: true`` plus ``top_logprobs``; completions: ``logprobs: k`` (validated upstream)."""
    value = body.get("logprobs")
    if endpoint == "chat":
        top, param = (int(body.get("top_logprobs") or 0) if value is True else 0), "top_logprobs"
    else:
        top, param = (int(value) if isinstance(value, int) and not isinstance(value, bool) else 0), "logprobs"
    if top > MAX_LOGPROBS:
        raise InvalidRequestError(
            f"Requested sample logprobs of {top}, which is greater than max allowed: {MAX_LOGPROBS}",
            param=param,
        )
    if endpoint == "chat":
        return LogprobSpec(top) if value is True else None
    return LogprobSpec(top) if isinstance(value, int) and not isinstance(value, bool) else None


def _prompts(prompt: Any, *, echo: bool) -> list[_Prompt]:
    """The prompts of a completions request (a list of strings or of token-id lists: one per entry)."""
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        items = [prompt]
    else:
        items = list(prompt)  # parse_request checked the shape
    out = []
    for item in items:
        if isinstance(item, str):
            pieces = token_pieces(item) if echo else []
            out.append(_Prompt(item, max(1, count_tokens(item)), tuple(pieces)))
        else:
            ids = [str(t) for t in item]
            pieces = [ids[0], *(" " + t for t in ids[1:])] if echo and ids else []
            out.append(_Prompt(" ".join(ids), max(1, len(ids)), tuple(pieces)))
    return out


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
