"""Mid-stream failover, the I/O half: continue a broken stream on other replicas (``core.failover`` is the
sans-IO half: the contract, the transcript, the rewriting of the continuation's events).

``Continuer.resume`` is called by the proxy once a stream that may be continued broke after its first byte:
it picks another replica with the deployment's lifecycle (never one this request tried), sends it the
dialect's continuation request, relays its events into the same client response and repeats up to
``failover.max_continuations``; ``record_overhead`` tells the capacity ledger what that cost the fleet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import aiohttp
import orjson

from fleetgate.config import GatewayConfig
from fleetgate.core.errors import FleetgateError, ServiceUnavailableError, UpstreamError, UpstreamTimeoutError
from fleetgate.core.failover import FailoverTracker
from fleetgate.core.openai import Endpoint, StreamTracker
from fleetgate.core.types import RandomSource, RequestInfo, Usage
from fleetgate.engines.client import UpstreamClient
from fleetgate.engines.continuation import remaining_tokens
from fleetgate.engines.dialects import dialect
from fleetgate.gateway.admission import Admission
from fleetgate.gateway.errors import REQUEST_ID_HEADER
from fleetgate.gateway.fleet import Deployment, ReplicaState
from fleetgate.gateway.metrics import GatewayMetrics

log = logging.getLogger("fleetgate.gateway")

PATHS: dict[Endpoint, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class ContinuedCall(Protocol):
    """What the continuer reads and updates of the proxy's record of one request."""

    info: RequestInfo | None
    body: bytes  # the upstream request body the first replica got
    endpoint: Endpoint
    attempts: list[str]
    replica: ReplicaState | None
    continuations: int
    error_kind: str | None


class Continuer:
    """Continues broken streams; one per proxy, everything injected."""

    def __init__(
        self,
        *,
        config: GatewayConfig,
        client: UpstreamClient,
        metrics: GatewayMetrics,
        admission: Admission,
        admission_clock: Callable[[], float],
        rng: RandomSource,
        clock: Callable[[], float],
        listeners: Sequence[Callable[[str, str, bool, float], None]] = (),
    ) -> None:
        self.config = config
        self.client = client
        self.metrics = metrics
        self.admission = admission
        self.admission_clock = admission_clock
        self.rng = rng
        self.clock = clock
        self.listeners = tuple(listeners)

    async def resume(
        self,
        request_id: str,
        response: Writer,
        deployment: Deployment,
        failed: ReplicaState,
        tracker: FailoverTracker,
        call: ContinuedCall,
        error: FleetgateError,
    ) -> tuple[bytes, FleetgateError | None]:
        """Continue a broken stream on other replicas until it ends well or the contract says stop; returns
        the bytes to send with the end of the response and the error to report (``None``: it ended well)."""
        settings = deployment.config.failover
        info = call.info
        assert info is not None
        original = orjson.loads(call.body)
        model = deployment.model
        while True:
            broke_at = self.clock()
            left = remaining_tokens(original, tracker.produced)
            if tracker.finish_reason is not None or (left is not None and left <= 0):
                # the answer was complete, only its end was lost: finish it here
                return tracker.closing_events(tracker.client_usage), None
            reason = tracker.refusal()
            if reason is None and call.continuations >= settings.max_continuations:
                reason = "exhausted"
            shape = dialect(deployment.config.engine).continuation_body(
                original, call.endpoint, tracker.text, tracker.produced
            )
            if reason is None and shape is None:
                reason = "engine"  # the engine cannot continue a chat message
            replica: ReplicaState | None = None
            if reason is None:
                try:
                    decision = deployment.lifecycle.route(info, broke_at, self.rng, frozenset(call.attempts))
                    replica = deployment.replicas.get(decision.replica)
                except ServiceUnavailableError:
                    replica = None
                if replica is None:
                    reason = "no_replica"
            if reason is not None or replica is None or shape is None:
                self.metrics.failover_refusals.labels(model, reason or "no_replica").inc()
                return b"", error
            tracker.end_attempt(failed.name)
            call.attempts.append(replica.name)
            call.replica = replica
            call.continuations += 1
            body = orjson.dumps(shape)
            deployment.lifecycle.dispatch(info, replica.name, replica, broke_at)
            ok = False
            try:
                tail, attempt_error = await self._attempt(
                    request_id, response, deployment, replica, body, tracker, call, broke_at
                )
                ok = attempt_error is None
            except (ClientGoneError, ConnectionResetError, asyncio.CancelledError):
                ok = True  # the client left: says nothing about the replica
                raise
            finally:
                self._done(deployment, replica, failed, info, ok)
            if attempt_error is None:
                call.error_kind = None
                return tail, None
            error = attempt_error
            log.warning("request %s: continuation on %s failed: %s", info.request_id, replica.name,
                        error.message)  # fmt: skip
            failed = replica

    async def _attempt(
        self,
        request_id: str,
        response: Writer,
        deployment: Deployment,
        replica: ReplicaState,
        body: bytes,
        tracker: FailoverTracker,
        call: ContinuedCall,
        broke_at: float,
    ) -> tuple[bytes, FleetgateError | None]:
        """One continuation stream: wait (``failover.timeout_s``) for its first event for the client, then
        relay it like the original; returns the tail to send and the error that ended it, if any."""
        url = replica.url + PATHS[call.endpoint]
        headers = {**deployment.upstream_headers, REQUEST_ID_HEADER: request_id}
        timeout_s = deployment.config.failover.timeout_s
        produced = tracker.produced
        idle = self.config.stream_idle_timeout_s
        upstream: aiohttp.ClientResponse | None = None
        try:
            try:
                async with asyncio.timeout(timeout_s):
                    upstream = await self.client.post(url, body, headers)
                    if upstream.status != 200 or not upstream.content_type.startswith("text/event-stream"):
                        return b"", UpstreamError(
                            f"replica {replica.name} answered the continuation with HTTP {upstream.status}",
                            retryable=False,
                        )
                    first = b""
                    while not first:
                        chunk = await upstream.content.readany()
                        if not chunk:
                            break
                        first = tracker.feed(chunk)
                if first:
                    await response.write(first)
                    resumed = self.clock() - broke_at
                    self.metrics.continuation_resume.labels(deployment.model).observe(resumed)
                    log.warning("request %s: stream continued on replica %s after %d tokens, resumed in "
                                "%.4f s", request_id, replica.name, produced, resumed)  # fmt: skip
                tail = b""
                if not upstream.content.at_eof():
                    tail = await relay(response, upstream.content, tracker, idle)
            except TimeoutError:
                return b"", UpstreamTimeoutError(
                    f"replica {replica.name} continuation timed out", retryable=False
                )
            except UpstreamError as exc:  # could not reach it (the client raises these)
                exc.retryable = False
                return b"", exc
            except (aiohttp.ClientError, OSError) as exc:
                return b"", UpstreamError(
                    f"replica {replica.name} continuation broke: {exc.__class__.__name__}", retryable=False
                )
            if tracker.truncated or tracker.error is not None:
                if tail:
                    await response.write(tail)
                return b"", UpstreamError(f"replica {replica.name} continuation ended early", retryable=False)
            upstream.release()
            upstream = None
            return tail, None
        finally:
            if upstream is not None:
                upstream.close()

    def _done(
        self, deployment: Deployment, replica: ReplicaState, failed: ReplicaState, info: RequestInfo, ok: bool
    ) -> None:
        now = self.clock()
        deployment.lifecycle.finish(info, replica.name, replica, now, None, ok)  # cost: the estimate
        for listener in self.listeners:
            listener(deployment.model, replica.name, ok, now)
        self.metrics.continuations.labels(
            deployment.model, replica.name, failed.name, "ok" if ok else "failed"
        ).inc()

    def record_overhead(self, deployment: Deployment, tracker: FailoverTracker, call: ContinuedCall) -> None:
        """Tell the capacity ledger what failover cost the fleet beyond what the client is charged: the
        broken attempts and the continuations' re-prefill of the prompt and the text already sent."""
        profile = deployment.profile
        assert call.replica is not None
        real = sum(
            profile.settle(Usage(a.prompt_tokens, a.completion_tokens, a.cached_tokens))
            for a in tracker.real_work(call.replica.name)
        )
        overhead = max(0.0, real - profile.settle(tracker.final_usage()))
        self.metrics.failover_overhead.labels(deployment.model).inc(overhead)
        self.admission.record_overhead(deployment.model, overhead, self.admission_clock())


async def relay(
    response: Writer,
    content: aiohttp.StreamReader,
    tracker: StreamTracker | FailoverTracker,
    idle_s: float,
) -> bytes:
    """Forward chunks until the upstream ends; returns the last bytes, to be sent with the end. Raises
    ``TimeoutError`` when ``idle_s`` pass from the start of a wait for the next chunk without it (the
    wait, the tracker and the write to the client together)."""
    loop = asyncio.get_running_loop()
    idle = IdleDeadline(loop, idle_s)
    try:
        while True:
            idle.last = loop.time()  # (the deadline moves without touching the timer: see IdleDeadline)
            chunk = await content.readany()
            if not chunk:
                return b""
            out = tracker.feed(chunk)
            if content.at_eof():
                return out
            if out:
                try:
                    await response.write(out)
                except ConnectionResetError as exc:
                    raise ClientGoneError from exc
    except asyncio.CancelledError as exc:
        if idle.expired():  # our own cancellation, not the client's or a shutdown's
            raise TimeoutError from exc
        raise
    finally:
        idle.close()


class IdleDeadline:
    """``asyncio.timeout`` for a deadline that moves with every chunk, without re-arming a timer per chunk.

    The caller stores the time of each new wait in ``last``; one timer fires at the earliest possible
    deadline and, when ``last`` moved meanwhile, goes back to sleep until ``last + idle_s``; only when that
    has passed does it cancel the task. (``Timeout.reschedule`` per chunk cancelled a timer handle and
    scheduled a new one on the loop's heap: a few microseconds a chunk, for every token of every stream.)
    ``expired()`` turns the cancellation back into a timeout the way ``asyncio.timeout`` does (it tells its
    own cancellation from any other by the task's cancel count).
    """

    __slots__ = ("_cancelling", "_fired", "_handle", "_loop", "_task", "idle_s", "last")
    # (_fired: the timer cancelled the task, and the task's cancel count is not yet given back)

    def __init__(self, loop: asyncio.AbstractEventLoop, idle_s: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._loop = loop
        self._task = task
        self._cancelling = task.cancelling()
        self._fired = False
        self.idle_s = idle_s
        self.last = loop.time()
        self._handle: asyncio.TimerHandle | None = loop.call_at(self.last + idle_s, self._check)

    def _check(self) -> None:
        due = self.last + self.idle_s
        if self._loop.time() < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self._handle = None
        self._fired = True
        self._task.cancel()

    def expired(self) -> bool:
        """Whether the deadline passed and the task's cancellation is this timer's own (then consumed)."""
        if not self._fired:
            return False
        self._fired = False
        return self._task.uncancel() <= self._cancelling

    def close(self) -> None:
        """Stop the timer; a cancellation it requested that was never seen is given back (as
        ``asyncio.timeout`` does on exit)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._fired:
            self._fired = False
            self._task.uncancel()


class ClientGoneError(Exception):
    """Writing to the client failed: it disconnected."""


class Writer(Protocol):
    """Where relayed bytes go: the client's stream response, or a ``Collector``."""

    async def write(self, data: bytes) -> None: ...


class Collector:
    """A writer that only counts (a streamed-from-the-engine non-stream answer: the tracker keeps the
    text), bounded like any non-streamed upstream body."""

    def __init__(self, limit: int, replica: ReplicaState) -> None:
        self.size = 0
        self.limit = limit
        self.replica = replica

    async def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise body_too_large(self.replica, self.limit)


def body_too_large(replica: ReplicaState, limit: int) -> UpstreamError:
    return UpstreamError(
        f"replica {replica.name} sent a response body over {limit} bytes (gateway.max_upstream_body_bytes)",
        retryable=False,
    )
