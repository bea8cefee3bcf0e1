"""The data path: authenticate -> parse -> estimate -> admit -> route -> upstream -> stream back -> settle.

Hot-path rules: the request body is forwarded as received unless the gateway must change it (upstream model
name, asking the engine for stream usage); response bytes are forwarded as received, chunk by chunk; only the
events that mention ``usage``/``error`` are JSON-decoded (``core.openai.StreamTracker``).

Reliability: nothing is sent to the client until the first upstream bytes arrived, so every failure before
that (refused connection, HTTP 5xx/429, timeout, empty stream) is retried on another replica, up to
``max_attempts``. Once the engine has started answering nothing is retried: a broken plain-text stream is
*continued* on another replica (``core.failover``: the prompt plus the text sent so far), so the client sees
one stream; where that cannot be exact (tool calls, guided decoding, n > 1, logprobs, echo) the stream ends
with one SSE error event. A non-streamed response must arrive whole within ``non_stream_timeout_s`` and at
most ``max_upstream_body_bytes``. A client that goes away cancels the handler (aiohttp
``handler_cancellation``), which closes the upstream connection, which the engine sees as an abort. Every
admitted request is settled (it ran) or released (it never ran).

The rules of a request's way through a deployment (estimate, in-flight counters, dispatch gate, the policy's
hooks, settlement, output history, demand) are ``core.lifecycle.Lifecycle``'s, shared with the simulator;
this module does the I/O around them: when to call, with which clock reading. One attempt on one replica and
the relay of its answer are ``gateway.upstream.UpstreamRelay``'s; the continuation of a broken stream is
``gateway.continuation.Continuer``'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
import aiohttp.http_exceptions
import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from fleetgate.config import GatewayConfig
from fleetgate.core.admission.settlement import bound_usage, output_limit
from fleetgate.core.errors import (
    FleetgateError,
    InvalidRequestError,
    RequestTimeoutError,
    ServiceUnavailableError,
    UpstreamError,
)
from fleetgate.core.openai import (
    Endpoint,
    ParsedRequest,
    RequestLimits,
    with_stream_usage,
)
from fleetgate.core.types import Priority, RandomSource, RequestInfo
from fleetgate.engines.client import UpstreamClient
from fleetgate.engines.dialects.base import LOW_FIRST
from fleetgate.gateway.admission import (
    Admission,
    OpenAdmission,
    admission_clock,
    tenant_name,
    tenant_priority,
)
from fleetgate.gateway.continuation import Continuer
from fleetgate.gateway.errors import (
    REQUEST_ID,
    error_response,
    payload_too_large,
)
from fleetgate.gateway.fleet import Deployment, Fleet, ReplicaState
from fleetgate.gateway.gate import GateShell
from fleetgate.gateway.metrics import GatewayMetrics
from fleetgate.gateway.parsing import INLINE_BYTES, RequestParser
from fleetgate.gateway.upstream import Call, UpstreamRelay, error_kind

if TYPE_CHECKING:
    from fleetgate.multimodal.pipeline import ImagePipeline

log = logging.getLogger("fleetgate.gateway")

#: Tenant class -> the request ``priority`` of vLLM-like engines (lower runs first); each engine's own
#: table is its dialect's (``engines.dialects``), sent where ``fleet.sends_priority``.
ENGINE_PRIORITY: Mapping[Priority, int] = LOW_FIRST

#: The replicas a first attempt excludes.
_NONE_TRIED: frozenset[str] = frozenset()

#: Called after every attempt: (deployment, replica, ok, now). For the prober's evidence of progress.
ResultListener = Callable[[str, str, bool, float], None]


class RequestObserver(Protocol):
    """Told about every finished request (``fleetgate.ops.web.Ops``: SLO window and access log)."""

    def observe(
        self,
        *,
        request_id: str,
        tenant: str,
        deployment: str,
        replica: str,
        endpoint: str,
        status: int,
        start: float,
        end: float,
        ttft_s: float | None = None,
        output_tokens: int | None = None,
        mu: float | None = None,
        error_kind: str | None = None,
    ) -> None: ...


class Proxy:
    """Request handlers for the OpenAI endpoints. Holds no module state: everything is injected."""

    def __init__(
        self,
        *,
        config: GatewayConfig,
        fleet: Fleet,
        client: UpstreamClient,
        metrics: GatewayMetrics,
        admission: Admission,
        rng: RandomSource,
        clock: Callable[[], float],
        images: ImagePipeline | None = None,
        listeners: Sequence[ResultListener] = (),
        slo: RequestObserver | None = None,
        parser: RequestParser | None = None,
    ) -> None:
        self.config = config
        #: raw body -> (deployment, parsed request): bounded, tenant-scoped hashes, large bodies off the loop
        self.parser = parser if parser is not None else default_parser(config, fleet)
        self.images = images  # multimodal preprocessing; only image requests touch it
        self.fleet = fleet
        self.client = client
        self.metrics = metrics
        self.admission = admission
        self.admission_clock = admission_clock(admission, clock)
        self._instant_settle = type(admission) is OpenAdmission
        self.rng = rng
        self.clock = clock
        self.listeners: tuple[ResultListener, ...] = tuple(listeners)
        continuer = Continuer(
            config=config,
            client=client,
            metrics=metrics,
            admission=admission,
            admission_clock=self.admission_clock,
            rng=rng,
            clock=clock,
            listeners=self.listeners,
        )
        #: one attempt on one replica and the relay of its answer (continued by ``continuer`` when it breaks)
        self.upstream = UpstreamRelay(
            config=config,
            client=client,
            metrics=metrics,
            clock=clock,
            continuer=continuer,
            shutting_down=lambda: self.shutting_down,
        )
        #: ``fleetgate.ops.web.Ops`` (SLO window + access log), told about every finished request
        self.slo = slo
        self.shutting_down = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._handlers: set[asyncio.Task[Any]] = set()  # the tasks of the requests in flight
        self._aborting = False

    @property
    def active(self) -> int:
        """Requests in flight (a handler always runs in its own task)."""
        return len(self._handlers)

    # -- shutdown -----------------------------------------------------------------------------------------

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight (graceful shutdown); False when ``timeout_s`` ran out."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False

    async def abort_in_flight(self, wait_s: float) -> None:
        """The shutdown grace ran out: cancel the requests still in flight, wait up to ``wait_s`` for their
        answers to go out. One that has sent nothing yet answers 503 (never a connection closed without an
        answer: the client cannot tell that from a request never received); a stream under way ends with
        its SSE error event."""
        self._aborting = True
        for task in list(self._handlers):
            task.cancel()
        await self.wait_idle(wait_s)

    # -- handlers -----------------------------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, "completions")

    async def handle(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        start = self.clock()
        request_id: str = request[REQUEST_ID]
        call = Call(start=start, request_id=request_id)
        deployment: Deployment | None = None
        handlers = self._handlers
        if not handlers:
            self._idle.clear()
        task = asyncio.current_task()
        if task is not None:
            handlers.add(task)
        try:
            tenant = self.admission.authenticate(request.headers.get("Authorization"))
            call.tenant = name = tenant_name(tenant)
            # bounded shape and model lookup before any tokenizing; large bodies off the loop
            raw = await self._read_body(request)
            if len(raw) <= INLINE_BYTES:  # (no coroutine for the common small body)
                deployment, parsed = self.parser.parse_inline(raw, endpoint, name)
            else:
                deployment, parsed = await self.parser.parse(raw, endpoint, name)
            images = self.images if parsed.image_parts else None  # text-only requests skip images entirely
            # Limits and queue first, images after: a tenant that is refused never makes the workers fetch or
            # decode. Admission budgets the largest image the deployment can get; settlement the real one.
            image_tokens = 0 if images is None else parsed.image_parts * images.max_image_tokens(parsed.model)
            info = self._request_info(
                parsed, deployment, tenant, name, request, request_id, start, image_tokens
            )
            try:
                ticket = await self.admission.admit(tenant, info, self.admission_clock())
            except FleetgateError as exc:
                if exc.offered_demand:  # refused for lack of capacity: demand the autoscaler must see
                    deployment.lifecycle.shed(info, self.clock())
                raise
            deployment.lifecycle.start(info)
            try:  # from here on the ticket is always settled or released
                call.headers = ticket.headers  # (read only: spread into the response's headers)
                if images is not None:
                    new_body, _ = await images.process_body(parsed.body, parsed.model, tenant=call.tenant)
                    parsed = dataclasses.replace(parsed, body=new_body)
                response = await self._dispatch(request, deployment, parsed, info, call, raw)
            finally:
                await self._finish_admission(ticket, tenant, deployment, info, call)
            call.status = response.status
            return response
        except FleetgateError as exc:
            call.status = exc.status
            call.error_kind = call.error_kind or error_kind(exc)
            return error_response(exc, request_id)
        except asyncio.CancelledError:
            if self._aborting and task is not None and request.writer.output_size == 0:
                task.uncancel()  # cancelled by ``abort_in_flight``, not by the client: answer it
                cut = ServiceUnavailableError(
                    "The gateway shut down before the request finished (it may have started on a replica).",
                    retry_after_s=1.0,
                )
                call.status = cut.status
                call.error_kind = "shutdown"
                return error_response(cut, request_id)
            call.status = 499
            call.client_gone = True
            call.error_kind = call.error_kind or "client_disconnect"
            raise
        finally:
            if task is not None:
                handlers.discard(task)
            if not handlers:
                self._idle.set()
            self._record(endpoint, deployment, call, start)

    def _request_info(
        self,
        parsed: ParsedRequest,
        deployment: Deployment,
        tenant: Any,
        name: str,
        request: web.Request,
        request_id: str,
        now: float,
        image_tokens: int = 0,
    ) -> RequestInfo:
        expected, cost = deployment.lifecycle.estimate(
            name, parsed.input_tokens, parsed.max_output_tokens, image_tokens
        )
        # what it may cost at most (admission budgets it while the tenant has another on an estimate)
        most = output_limit(parsed.max_output_tokens, deployment.config.context_tokens) or 0
        if most == expected:  # the same shape as the estimate (max_tokens within the p90): the same cost
            bound = cost
        else:
            bound = deployment.lifecycle.profile.cost(parsed.input_tokens, most, image_tokens=image_tokens)
        return parsed.request_info(
            request_id,
            tenant=name,
            cost_mu=cost,
            estimated_output_tokens=int(expected),
            priority=tenant_priority(tenant),
            session_key=_session_key(request, parsed),
            arrival_s=now,
            image_tokens=image_tokens,
            bound_mu=cost if cost > bound else bound,  # (``max(bound, cost)``)
        )

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise payload_too_large(limit)
        try:
            if request.content.is_eof():  # the whole body is buffered already: reading it cannot stall
                return await request.read()
            async with asyncio.timeout(self.config.client_body_timeout_s):  # a stalled body is not held
                return await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise payload_too_large(limit) from exc
        except TimeoutError as exc:
            raise RequestTimeoutError(
                f"The request body did not arrive within {self.config.client_body_timeout_s:g} s."
            ) from exc
        except (aiohttp.http_exceptions.HttpProcessingError, RequestPayloadError) as exc:  # bad gzip ...
            raise InvalidRequestError(
                "The request body could not be read (bad Content-Encoding or framing).", code="bad_body"
            ) from exc

    def _upstream_body(
        self, parsed: ParsedRequest, deployment: Deployment, info: RequestInfo | None = None
    ) -> tuple[bytes | None, bool]:
        """The body to send (``None``: forward the client's bytes) and whether to strip injected usage."""
        body: dict[str, Any] | None = None
        strip = False
        if parsed.body_changed or (parsed.image_parts and self.images is not None):  # (images re-encoded)
            body = parsed.body
        if deployment.upstream_model != parsed.model:
            body = {**parsed.body, "model": deployment.upstream_model}
        if parsed.stream and not parsed.include_usage and self.config.stream_usage:
            body = with_stream_usage(body or parsed.body)
            strip = True
        if info is not None and deployment.sends_priority:
            # the tenant's class, never the client's own "priority" field (no queue jumping)
            value = deployment.dialect.request_priority(info.priority, True)
            if value is not None:
                body = {**(body or parsed.body), "priority": value}
        return (orjson.dumps(body) if body is not None else None), strip

    async def _dispatch(
        self,
        request: web.Request,
        deployment: Deployment,
        parsed: ParsedRequest,
        info: RequestInfo,
        call: Call,
        raw: bytes,
    ) -> web.StreamResponse:
        """Route and send the request (``raw``: the client's body), retrying on other replicas until one
        answers."""
        new_body, strip = self._upstream_body(parsed, deployment, info)
        body = new_body if new_body is not None else raw
        routing_hist = self.metrics.routing_child(deployment.model)
        call.info = info
        call.body = body
        call.endpoint = parsed.endpoint
        lifecycle = deployment.lifecycle
        shell = deployment.gate_shell  # the deployment's dispatch-gate shell, when its policy has a gate
        if shell is None and lifecycle.gated:  # (made on first use)
            shell = deployment.gate_shell = GateShell(lifecycle, self.clock)
        if shell is not None:
            await shell.wait_turn(info)  # the dispatch gate: held while every replica is busy with prefill
        exclude: set[str] = set()
        last: UpstreamError | None = None
        for _ in range(self.config.max_attempts):
            t0 = perf_counter()
            try:
                excluded = frozenset(exclude) if exclude else _NONE_TRIED
                decision = lifecycle.route(info, self.clock(), self.rng, excluded)
            except ServiceUnavailableError:
                if last is not None:
                    break
                raise
            finally:
                routing_hist.observe(perf_counter() - t0)
            replica = deployment.replicas.get(decision.replica)
            if replica is None:  # removed between snapshot and lookup
                exclude.add(decision.replica)
                continue
            call.replica = replica
            call.attempts.append(replica.name)
            call.ok = False
            lifecycle.dispatch(info, replica.name, replica, self.clock())
            try:
                return await self.upstream.attempt(request, deployment, replica, parsed, body, strip, call)
            except asyncio.CancelledError:
                call.client_gone = not self.shutting_down  # not the replica's fault
                raise
            except UpstreamError as exc:
                last = exc
                exclude.add(replica.name)
                log.warning("request %s: replica %s failed: %s", info.request_id, replica.name,
                            exc.message)  # fmt: skip
                if not exc.retryable:  # the engine had started answering: another try would redo its work
                    break
                self.metrics.retries.labels(deployment.model, replica.name).inc()
            finally:
                self._attempt_done(deployment, replica, info, call)
        if last is None:
            raise ServiceUnavailableError(
                f"no replica of {deployment.model!r} is available", retry_after_s=1.0
            )
        call.error_kind = error_kind(last)
        tried = ", ".join(call.attempts)
        last.message = f"{last.message} (tried {len(call.attempts)} replica(s): {tried})"
        last.args = (last.message,)
        raise last

    def _attempt_done(
        self, deployment: Deployment, replica: ReplicaState, info: RequestInfo, call: Call
    ) -> None:
        now = self.clock()
        neutral = call.client_gone or call.local_error  # the client left, or the gateway is out of resources
        ok = call.ok or neutral
        deployment.lifecycle.finish(info, replica.name, replica, now, call.attempt_usage or call.usage, ok)
        for listener in self.listeners:
            listener(deployment.model, replica.name, ok, now)

    async def _finish_admission(
        self, ticket: Any, tenant: Any, deployment: Deployment, info: RequestInfo, call: Call
    ) -> None:
        """Settle what ran (real cost from usage, else an estimate from what streamed) or release.

        A client that leaves while an engine already works on its request is charged what is known to have
        run (the prompt), so disconnecting just before the answer does not make a request free.
        """
        lifecycle = deployment.lifecycle
        if not call.ran and not (call.client_gone and call.attempts):
            self.admission.release(ticket)
            lifecycle.release_demand(info, self.clock())
            return
        if call.usage is not None:  # the engine's word, cut to what the request could produce
            bounded = bound_usage(
                call.usage, info, context_tokens=deployment.config.context_tokens,
                streamed_events=call.output_events if info.stream else None,
            )  # fmt: skip
            for kind in bounded.anomalies:
                rep = call.replica.name if call.replica is not None else ""
                self.metrics.usage_anomalies.labels(deployment.model, rep, kind).inc()
                log.warning("request %s: engine usage %s (%s); settled as %s", info.request_id, call.usage,
                            kind, bounded.usage)  # fmt: skip
            call.usage = bounded.usage
        actual = lifecycle.settle(info, call.usage, self.clock(), streamed_tokens=call.output_events)
        call.mu = actual
        settle = self.admission.settle(ticket, actual, self.admission_clock(), usage=call.usage)
        if self._instant_settle:
            await settle  # completes without suspending: nothing to protect
        else:  # shielded: a client that leaves right now must not cancel the bookkeeping
            await asyncio.shield(asyncio.ensure_future(settle))

    def _record(self, endpoint: str, deployment: Deployment | None, call: Call, start: float) -> None:
        dep = deployment.model if deployment is not None else "unknown"
        rep = call.replica.name if call.replica is not None else ""
        end = self.clock()  # (one reading: the request's end for the histogram and the SLO window)
        self.metrics.count_request(dep, rep, endpoint, call.status)
        if call.error_kind is not None:
            self.metrics.errors.labels(dep, rep, call.error_kind).inc()
        if deployment is not None and call.replica is not None:
            children = self.metrics.replica(dep, rep)
            children.e2e.observe(end - start)
            if call.usage is not None:
                children.prompt_tokens.inc(call.usage.prompt_tokens)
                children.generation_tokens.inc(call.usage.completion_tokens)
        if self.slo is not None:
            self.slo.observe(
                request_id=call.request_id,
                tenant=call.tenant,
                deployment=dep,
                replica=rep,
                endpoint=endpoint,
                status=call.status,
                start=start,
                end=end,
                ttft_s=call.ttft_s,
                output_tokens=None if call.usage is None else call.usage.completion_tokens,
                mu=call.mu,
                error_kind=call.error_kind,
            )


def _uses_prefix_hashes(deployment: Deployment) -> bool:
    """Whether the deployment's policy reads prefix hashes (its declared ``uses_prefix_hashes``)."""
    return deployment.policy.uses_prefix_hashes


def default_parser(config: GatewayConfig, fleet: Fleet, *, isolate_tenants: bool = False) -> RequestParser:
    """The parser for ``config``: its limits, the fleet's tokenizer, hashes where routing needs them."""
    return RequestParser(
        fleet,
        tokenizer=fleet.prompt_tokenizer,
        limits=RequestLimits(
            max_messages=config.max_messages,
            max_content_parts=config.max_content_parts,
            max_json_values=config.max_json_values,
        ),
        isolate_tenants=isolate_tenants,
        hashes_for=_uses_prefix_hashes,
        lane_cache_mb=config.tokenizer_cache_mb,
    )


def _session_key(request: web.Request, parsed: ParsedRequest) -> str | None:
    """A client-chosen affinity key: the ``x-session-id`` header, else OpenAI's ``user`` field."""
    header = request.headers.get("x-session-id")
    if header:
        return header
    user = parsed.body.get("user")
    return user if isinstance(user, str) and user else None
