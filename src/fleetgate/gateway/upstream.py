"""One try of a request on one replica, and the relay of its answer (the proxy's upstream half).

``UpstreamRelay.attempt`` posts the request to the chosen replica and waits for its first bytes; every failure
up to then raises a retryable ``UpstreamError`` (the proxy then routes to another replica). From the first
byte on the answer is the client's: a stream is relayed chunk by chunk (``_stream``), a non-streamed request
that the engine streams for failover (``failover.non_stream``) is read whole and answered in one JSON body
(``_collect``); a break from then on is continued on another replica by ``gateway.continuation.Continuer``
where that is exact, else it ends the response with one SSE error event. ``Call`` is the record of what one
client request did, written here and by the proxy, read for settlement and metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
import orjson
from aiohttp import web

from fleetgate.config import GatewayConfig
from fleetgate.core.errors import (
    FleetgateError,
    ServiceUnavailableError,
    UpstreamError,
    UpstreamTimeoutError,
    is_local_resource_error,
)
from fleetgate.core.failover import FailoverTracker, static_refusal
from fleetgate.core.openai import Endpoint, ParsedRequest, StreamTracker, usage_from_body
from fleetgate.core.types import RequestInfo, Usage
from fleetgate.engines.client import UpstreamClient
from fleetgate.gateway.continuation import PATHS, ClientGoneError, Collector, Continuer, body_too_large, relay
from fleetgate.gateway.errors import REQUEST_ID_HEADER, sse_error_event, upstream_rejection
from fleetgate.gateway.fleet import Deployment, ReplicaState
from fleetgate.gateway.metrics import GatewayMetrics
from fleetgate.orjson_codec import ORJSON

log = logging.getLogger("fleetgate.gateway")

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(slots=True)
class Call:
    """What one client request did, for metrics and settlement."""

    replica: ReplicaState | None = None
    ran: bool = False  # the engine produced output for the client (settle rather than release)
    ok: bool = False  # the replica behaved (no upstream failure)
    client_gone: bool = False
    local_error: bool = False  # the gateway itself ran out of resources: says nothing about the replica
    usage: Usage | None = None
    output_events: int = 0
    status: int = 500
    error_kind: str | None = None
    start: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)  # from admission (x-ratelimit-*), read only
    attempts: list[str] = field(default_factory=list)
    request_id: str = ""  # for fleetgate.ops (SLO window, access log)
    tenant: str = ""
    ttft_s: float | None = None
    mu: float | None = None  # settled model units
    info: RequestInfo | None = None  # what the router saw (for the policy's first-token hook)
    body: bytes = b""  # the upstream request body (a continuation extends it)
    endpoint: Endpoint = "chat"
    continuations: int = 0  # streams continued on another replica after a break
    attempt_usage: Usage | None = None  # what the current replica did, when it differs from ``usage``
    refusal: str | None = None  # why a broken stream of this request would not be continued


class UpstreamRelay:
    """Sends one attempt to a replica and relays its answer; one per proxy, everything injected."""

    def __init__(
        self,
        *,
        config: GatewayConfig,
        client: UpstreamClient,
        metrics: GatewayMetrics,
        clock: Callable[[], float],
        continuer: Continuer,
        shutting_down: Callable[[], bool],
    ) -> None:
        self.config = config
        self.client = client
        self.metrics = metrics
        self.clock = clock
        self.continuer = continuer
        #: whether the gateway is shutting down (a cancelled stream then ends with an SSE error event)
        self.shutting_down = shutting_down

    async def attempt(
        self,
        request: web.Request,
        deployment: Deployment,
        replica: ReplicaState,
        parsed: ParsedRequest,
        body: bytes,
        strip: bool,
        call: Call,
    ) -> web.StreamResponse:
        """Send ``body`` to ``replica`` and answer the client from its reply; until the first bytes arrived
        a failure is a retryable ``UpstreamError`` (the proxy tries another replica), later it is not."""
        request_id = call.request_id  # (``request[REQUEST_ID]``)
        url = replica.url + PATHS[parsed.endpoint]
        headers = {**deployment.upstream_headers, REQUEST_ID_HEADER: request_id}
        # failover.non_stream: a plain-text non-streamed request is streamed from the engine and answered
        # in one body, so that a failure mid-generation can be continued like a stream
        collect = not parsed.stream and self._collects(parsed, deployment)
        if collect:
            body = call.body = orjson.dumps(
                {**orjson.loads(body), "stream": True, "stream_options": {"include_usage": True}}
            )
        stream = parsed.stream or collect
        # A stream must show life within first_byte_timeout_s (then idle timeouts apply); a non-streamed
        # answer arrives whole (vLLM sends its headers with the body), so it gets the separate total limit.
        timeout_s = self.config.first_byte_timeout_s if stream else self.config.non_stream_timeout_s
        tracker: StreamTracker | FailoverTracker
        if not stream:
            call.refusal = None
        elif not deployment.config.failover.enabled:  # (``_failover_refusal`` written out)
            call.refusal = "disabled"
        else:
            call.refusal = static_refusal(parsed.endpoint, parsed.body)
        if stream and call.refusal is None:
            tracker = FailoverTracker(
                parsed.endpoint,
                strip_usage=strip,
                prompt_tokens=parsed.input_tokens,
                client_usage=parsed.include_usage or collect,
                codec=ORJSON,
            )
        else:
            tracker = StreamTracker(strip_usage=strip, codec=ORJSON)
        first = b""
        answering = False  # the engine's answer started: a failure from here on is not retried
        try:
            async with asyncio.timeout(timeout_s):
                upstream = await self.client.post(url, body, headers)
                try:
                    if upstream.status != 200:
                        raw = await self._read_body_limited(upstream, replica)
                        rejection = upstream_rejection(upstream.status, raw)
                        if rejection is not None:  # the engine judged the request itself bad: no retry
                            call.ok = True
                            raise rejection
                        raise UpstreamError(
                            f"replica {replica.name} answered HTTP {upstream.status}",
                            upstream_status=upstream.status,
                        )
                    if not stream or not upstream.content_type.startswith("text/event-stream"):
                        # (an engine that answers a stream request with one JSON body is relayed as is)
                        answering = True
                        raw = await self._read_body_limited(upstream, replica)
                        call.ok = call.ran = True
                        call.usage = usage_from_body(raw, ORJSON)
                        ctype = upstream.headers.get("Content-Type", "application/json")
                        return web.Response(
                            body=raw,
                            status=200,
                            headers={**call.headers, "Content-Type": ctype, REQUEST_ID_HEADER: request_id},
                        )
                    while not first:
                        chunk = await upstream.content.readany()
                        if not chunk:
                            raise UpstreamError(f"replica {replica.name} closed the stream before any event")
                        first = tracker.feed(chunk)
                except BaseException:
                    upstream.close()
                    raise
        except TimeoutError as exc:
            if stream:
                raise UpstreamTimeoutError(
                    f"replica {replica.name} sent nothing within {timeout_s:g} s"
                ) from exc
            raise UpstreamTimeoutError(
                f"replica {replica.name} sent no complete response within {timeout_s:g} s "
                "(gateway.non_stream_timeout_s)",
                retryable=False,
            ) from exc
        except (aiohttp.ClientError, OSError) as exc:
            if is_local_resource_error(exc):  # the gateway is out of descriptors/memory: not the replica
                call.local_error = True
                log.error(
                    "request %s: the gateway is out of resources (%s)", request_id, exc.__class__.__name__
                )
                raise ServiceUnavailableError(
                    "The gateway is overloaded; retry shortly.", retry_after_s=1.0
                ) from exc
            raise UpstreamError(
                f"replica {replica.name} failed: {exc.__class__.__name__}: {exc}", retryable=not answering
            ) from exc
        if collect and isinstance(tracker, FailoverTracker):
            return await self._collect(request, replica, upstream, tracker, call, deployment)
        return await self._stream(request, replica, upstream, tracker, first, call, deployment)

    def _collects(self, parsed: ParsedRequest, deployment: Deployment) -> bool:
        """Whether a non-streamed request is streamed from the engine (``failover.non_stream``): plain
        text only, and no tools (a non-streamed tool call would have to be reassembled from deltas)."""
        body = parsed.body
        return (
            deployment.config.failover.non_stream
            and self._failover_refusal(parsed, deployment) is None
            and not body.get("tools")
            and not body.get("functions")
        )

    async def _collect(
        self,
        request: web.Request,
        replica: ReplicaState,
        upstream: aiohttp.ClientResponse,
        tracker: FailoverTracker,
        call: Call,
        deployment: Deployment,
    ) -> web.StreamResponse:
        """The non-streamed answer of a request streamed from the engine (its first event arrived): read
        the stream to its end, continue it on another replica if it breaks, answer with one JSON body."""
        call.ran = True
        sink = Collector(self.config.max_upstream_body_bytes, replica)
        error: FleetgateError | None = None
        idle = self.config.stream_idle_timeout_s
        try:
            try:
                if not upstream.content.at_eof():
                    await relay(sink, upstream.content, tracker, idle)
            except TimeoutError:
                error = UpstreamTimeoutError(
                    f"replica {replica.name} stalled for {idle:g} s", retryable=False
                )
            except (aiohttp.ClientError, OSError) as exc:
                error = UpstreamError(
                    f"replica {replica.name} broke: {exc.__class__.__name__}", retryable=False
                )
            if error is None and (tracker.truncated or tracker.error is not None):
                error = UpstreamError(f"replica {replica.name} ended the stream early", retryable=False)
            if error is not None:
                log.warning("request %s: %s", call.request_id, error.message)
                upstream.close()
                _, error = await self.continuer.resume(
                    call.request_id, sink, deployment, replica, tracker, call, error
                )
                outcome = "error" if error is not None else "continued"
                self.metrics.interrupted_streams.labels(deployment.model, outcome).inc()
            else:
                call.ok = True
        finally:
            call.usage = tracker.final_usage()
            call.output_events = tracker.data_events
            if tracker.attempts:
                broken = tracker.attempts[0]
                call.attempt_usage = Usage(broken.prompt_tokens, broken.completion_tokens)
            if call.continuations:
                self.continuer.record_overhead(deployment, tracker, call)
            if call.ok:
                upstream.release()
            else:
                upstream.close()
        if error is not None:
            call.error_kind = error_kind(error)
            raise error
        headers = {
            **call.headers,
            "Content-Type": "application/json",
            REQUEST_ID_HEADER: call.request_id,
        }
        return web.Response(body=orjson.dumps(tracker.response_body()), status=200, headers=headers)

    async def _read_body_limited(self, upstream: aiohttp.ClientResponse, replica: ReplicaState) -> bytes:
        """The whole upstream body, at most ``max_upstream_body_bytes`` (else a non-retryable 502)."""
        limit = self.config.max_upstream_body_bytes
        if upstream.content_length is not None and upstream.content_length > limit:
            raise body_too_large(replica, limit)
        parts: list[bytes] = []
        size = 0
        content = upstream.content
        while True:
            chunk = await content.readany()
            if not chunk:
                return b"".join(parts)
            size += len(chunk)
            if size > limit:
                raise body_too_large(replica, limit)
            parts.append(chunk)

    def _failover_refusal(self, parsed: ParsedRequest, deployment: Deployment) -> str | None:
        """Why a broken stream of this request would not be continued (``None``: it would)."""
        if not deployment.config.failover.enabled:
            return "disabled"
        return static_refusal(parsed.endpoint, parsed.body)

    async def _stream(
        self,
        request: web.Request,
        replica: ReplicaState,
        upstream: aiohttp.ClientResponse,
        tracker: StreamTracker | FailoverTracker,
        first: bytes,
        call: Call,
        deployment: Deployment,
    ) -> web.StreamResponse:
        """Relay an upstream SSE stream whose first bytes arrived; from here on errors are in-band (or the
        stream is continued on another replica)."""
        headers = {**call.headers, **SSE_HEADERS, REQUEST_ID_HEADER: call.request_id}
        response = RelayResponse(status=200, headers=headers)
        call.ran = True
        error: FleetgateError | None = None
        idle = self.config.stream_idle_timeout_s
        content = upstream.content
        # When the upstream has already ended, the rest goes out with the end of the response in one write.
        tail = first
        try:
            await response.prepare(request)
            if not content.at_eof():
                await response.write(first)
                tail = b""
            now = self.clock()  # the first token's time, for the metric and the lifecycle
            call.ttft_s = now - call.start
            if call.info is not None:
                deployment.lifecycle.first_token(call.info, replica.name, now)
            self.metrics.replica(deployment.model, replica.name).ttft.observe(call.ttft_s)
            try:
                if not tail and not content.at_eof():
                    tail = await relay(response, content, tracker, idle)
            except TimeoutError:
                error = UpstreamTimeoutError(
                    f"replica {replica.name} stream stalled for {idle:g} s", retryable=False
                )
            except (aiohttp.ClientError, OSError) as exc:
                error = UpstreamError(
                    f"replica {replica.name} stream broke: {exc.__class__.__name__}", retryable=False
                )
            if error is None and tracker.truncated:
                error = UpstreamError(f"replica {replica.name} ended the stream early", retryable=False)
            if isinstance(tracker, FailoverTracker):
                if error is None and tracker.error is not None:
                    error = UpstreamError(f"replica {replica.name} sent an error event", retryable=False)
                if error is not None:
                    log.warning("request %s: %s", call.request_id, error.message)
                    upstream.close()
                    if tail:  # whole events only: safe to send before the continuation's
                        await response.write(tail)
                    tail, error = await self.continuer.resume(
                        call.request_id, response, deployment, replica, tracker, call, error
                    )
                    outcome = "error" if error is not None else "continued"
                    self.metrics.interrupted_streams.labels(deployment.model, outcome).inc()
            elif error is None and tracker.error is not None:  # the engine's own in-band error, relayed as is
                call.error_kind = "engine_stream_error"
            elif error is not None:  # a stream that cannot be continued exactly ends with an SSE error
                self.metrics.failover_refusals.labels(deployment.model, call.refusal or "disabled").inc()
                self.metrics.interrupted_streams.labels(deployment.model, "error").inc()
            if error is not None:
                call.error_kind = error_kind(error)
                log.warning("request %s: %s", call.request_id, error.message)
                tail += sse_error_event(error)
            elif call.continuations == 0:
                call.ok = True
            await response.write_eof(tail)
        except (ClientGoneError, ConnectionResetError):
            call.client_gone = True
            call.error_kind = "client_disconnect"
        except asyncio.CancelledError:
            call.client_gone = not self.shutting_down()
            if self.shutting_down():
                call.error_kind = "shutdown"
                try:
                    response.force_close()
                    await response.write(
                        sse_error_event(ServiceUnavailableError("The gateway is shutting down."))
                    )
                except Exception:
                    pass
            raise
        finally:
            if isinstance(tracker, FailoverTracker):
                call.usage = (
                    tracker.final_usage() if (tracker.usage is not None or call.continuations) else None
                )
                if tracker.attempts:
                    broken = tracker.attempts[0]  # what the first replica did (its policy's cost feedback)
                    call.attempt_usage = Usage(broken.prompt_tokens, broken.completion_tokens)
                if call.continuations:
                    self.continuer.record_overhead(deployment, tracker, call)
            else:
                call.usage = tracker.usage
            call.output_events = tracker.data_events
            if call.ok:
                upstream.release()
            else:
                upstream.close()
        return response


class RelayResponse(web.StreamResponse):
    """A stream response whose headers leave with its first bytes (one write, not two): a relay always has
    those bytes in hand when it prepares. (aiohttp's own switch; harmless if a future aiohttp drops it.)"""

    _send_headers_immediately = False


def error_kind(exc: FleetgateError) -> str:
    """The ``error`` label of a failed request (metrics, access log)."""
    if isinstance(exc, UpstreamTimeoutError):
        return "upstream_timeout"
    if isinstance(exc, UpstreamError):
        return "upstream_error"
    return exc.code or exc.error_type
