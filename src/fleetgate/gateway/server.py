"""Gateway lifecycle: listen, run the control loops, and shut down gracefully.

Shutdown (SIGTERM): readiness turns 503, the listening socket closes (no new connections), and every response
from then on carries ``Connection: close``. Requests that arrive on already-open keep-alive connections during
``shutdown_linger_s`` are still served (never reset after the gateway read them); in-flight requests and
streams get up to ``shutdown_grace_s`` to finish, then whatever is left is cancelled (a stream under way gets
an SSE error event, a request that sent nothing yet a 503), the remaining idle connections close and the
upstream pool closes.

Slow clients: a connection that has started a request must deliver all its headers within
``client_header_timeout_s`` (slowloris), and an idle keep-alive connection closes after
``client_keepalive_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from fleetgate.config import GatewayConfig
from fleetgate.engines.client import UpstreamClient
from fleetgate.engines.scraper import MetricsScraper
from fleetgate.gateway.errors import malformed_request_response
from fleetgate.gateway.fleet import Fleet
from fleetgate.gateway.proxy import Proxy

log = logging.getLogger("fleetgate.gateway")


class GatewayServer:
    """Owns the aiohttp runner, the listening site and the scraper loops of one gateway process."""

    def __init__(
        self,
        *,
        config: GatewayConfig,
        app: web.Application,
        proxy: Proxy,
        fleet: Fleet,
        client: UpstreamClient,
        scraper: MetricsScraper | None = None,
        metrics_app: web.Application | None = None,
    ) -> None:
        self.config = config
        #: ``GET /metrics`` without a key on ``metrics_host:metrics_port`` (when configured)
        self.metrics_app = metrics_app
        self.metrics_port: int | None = None
        self._metrics_runner: web.AppRunner | None = None
        self.max_connections = 0  # client connections allowed at once (set by start, from the fd limit)
        self.app = app
        self.proxy = proxy
        self.fleet = fleet
        self.client = client
        self.scraper = scraper
        self.runner: web.AppRunner | None = None
        self.site: web.TCPSite | None = None
        self.port: int | None = None
        self._loops: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._services: list[tuple[str, Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]] = []

    def add_service(
        self, name: str, start: Callable[[], Awaitable[Any]], stop: Callable[[], Awaitable[Any]]
    ) -> None:
        """Register a component with its own start/stop (a prober, an autoscaler loop ...)."""
        self._services.append((name, start, stop))

    def add_loop(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        """Register a control loop (prober, autoscaler, capacity ...) run from ``start`` until ``stop``."""
        self._loops.append((name, run))
        if self.runner is not None:  # already started
            self._tasks.append(asyncio.create_task(_guard(name, run), name=name))

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    async def start(self, port: int | None = None) -> str:
        """Listen (``port`` overrides the config; 0 picks a free port) and start scraping; returns the URL."""
        self.max_connections = connection_limit(self.config.max_connections, raise_fd_limit())
        self.runner = _GatewayRunner(
            self.app,
            header_timeout_s=self.config.client_header_timeout_s,
            max_connections=self.max_connections,
            handle_signals=False,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=1.0,
            keepalive_timeout=self.config.client_keepalive_timeout_s,
        )
        await self.runner.setup()
        self.site = web.TCPSite(
            self.runner, self.config.host, self.config.port if port is None else port, backlog=1024
        )
        await self.site.start()
        server = self.site._server
        # asyncio's or uvloop's Server (both have ``sockets``; the abstract type declares none)
        sockets = cast(asyncio.Server, server).sockets if server is not None else []
        self.port = sockets[0].getsockname()[1] if sockets else (port or self.config.port)
        if self.metrics_app is not None and self.config.metrics_port is not None:
            self._metrics_runner = web.AppRunner(self.metrics_app, handle_signals=False, access_log=None)
            await self._metrics_runner.setup()
            metrics_site = web.TCPSite(
                self._metrics_runner, self.config.metrics_host, self.config.metrics_port
            )
            await metrics_site.start()
            msrv = metrics_site._server  # asyncio's or uvloop's Server: the port picked for 0
            bound = cast(asyncio.Server, msrv).sockets if msrv is not None else []
            self.metrics_port = bound[0].getsockname()[1] if bound else self.config.metrics_port
        self.sync_replicas()
        self._tasks = [asyncio.create_task(_guard(name, run), name=name) for name, run in self._loops]
        for _, start_service, _ in self._services:
            await start_service()
        return self.url

    def sync_replicas(self) -> None:
        """Reconcile scraper loops with the fleet (call after adding/removing replicas)."""
        if self.scraper is not None:
            self.scraper.sync(replica for _, replica in self.fleet.replicas())

    async def stop(self, grace_s: float | None = None) -> bool:
        """Graceful stop; returns True when every in-flight request finished within the grace period."""
        grace = self.config.shutdown_grace_s if grace_s is None else grace_s
        loop = asyncio.get_running_loop()
        linger_until = loop.time() + min(self.config.shutdown_linger_s, grace)
        self.proxy.shutting_down = True  # readiness 503; every response from now on: Connection: close
        if self.site is not None:
            await self.site.stop()  # no new connections; open ones keep being served
            self.site = None
        drained = await self.proxy.wait_idle(grace)
        if not drained:
            log.warning("shutdown grace of %.1f s over: cancelling %d request(s)", grace, self.proxy.active)
            await self.proxy.abort_in_flight(1.0)  # each gets its answer (503 or an SSE error event)
        else:
            await self._linger(linger_until)
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
            self._metrics_runner = None
        for name, _, stop_service in reversed(self._services):
            try:
                await stop_service()
            except Exception:
                log.exception("stopping %s", name)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self.scraper is not None:
            await self.scraper.stop()
        await self.client.close()
        self.proxy.parser.close()
        return drained

    async def _linger(self, until: float) -> None:
        """Keep serving requests that arrive on open keep-alive connections until ``until`` (loop time), or
        until every connection has closed (each response while draining closes its connection), and until
        no request is in flight."""
        loop = asyncio.get_running_loop()
        server = self.runner.server if self.runner is not None else None
        while server is not None:
            busy = any(_busy(conn) for conn in server.connections)
            if not busy and (loop.time() >= until or not server.connections):
                return
            if loop.time() >= until + self.config.shutdown_grace_s:
                return  # a request that arrived in the window ran past its own grace period
            await asyncio.sleep(0.02)


def _busy(conn: RequestHandler) -> bool:
    """A request is being handled on ``conn``, or one was read and waits to be handled."""
    return bool(conn._request_in_progress or conn._messages)


def raise_fd_limit() -> int:
    """Raise this process's soft descriptor limit to its hard limit (at most 2**20); returns the soft limit.

    The gateway holds one descriptor per client connection, per upstream connection and per probe: a low
    soft limit (1024 is common) is the first resource a connection flood exhausts.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard if hard != resource.RLIM_INFINITY else 1 << 20, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_limit(configured: int | None, fd_limit: int) -> int:
    """Client connections allowed at once: below the descriptor limit, leaving a quarter of it (at least 64)
    for upstream connections, probes, scrapes, image workers and files. A configured value is capped there."""
    reserve = max(64, fd_limit // 4)
    auto = max(8, fd_limit - reserve)
    if configured is not None and configured > auto:
        log.warning(
            "gateway.max_connections %d capped at %d (descriptor limit %d)", configured, auto, fd_limit
        )
    return auto if configured is None else min(configured, auto)


_TOO_MANY_CONNECTIONS = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)


def _too_many_connections_response() -> bytes:
    body = (
        b'{"error":{"message":"The gateway has too many open connections; retry shortly.",'
        b'"type":"server_error","param":null,"code":"too_many_connections"}}'
    )
    return _TOO_MANY_CONNECTIONS % (len(body), body)


class _HeaderTimeoutHandler(RequestHandler):
    """aiohttp's connection handler plus a header deadline: once the first bytes of a request arrived, the
    complete request head must follow within ``header_timeout_s`` or the connection is closed (aiohttp
    itself only closes idle connections, after its keep-alive timeout). Connections above the server's
    limit are answered 503 and closed at once (they would otherwise take the descriptors that probes and
    upstream connections need)."""

    __slots__ = ("_header_handle", "_header_timeout_s", "_max_connections")

    def __init__(self, *args: Any, header_timeout_s: float, max_connections: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._max_connections = max_connections
        self._header_handle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        manager = self._manager
        if manager is not None and len(manager.connections) > self._max_connections:
            own = self.transport  # (uvloop's transports are not asyncio's classes: use aiohttp's handle)
            if own is not None:
                own.write(_too_many_connections_response())
                own.close()  # after the buffered answer is sent
            self.force_close()
            if isinstance(manager, _HeaderTimeoutServer):
                manager.note_refusal(self._loop.time())

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        handle = self._header_handle
        if self._messages or self._request_in_progress:  # a whole request head arrived, or one is served
            if handle is not None:
                handle.cancel()
                self._header_handle = None
        elif handle is None and data:  # the first bytes of a new request head
            self._header_handle = self._loop.call_later(self._header_timeout_s, self._header_deadline)

    def _header_deadline(self) -> None:
        self._header_handle = None
        if not self._messages and not self._request_in_progress:
            log.info("closing a connection: no complete request head within %.1f s", self._header_timeout_s)
            self.force_close()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """Malformed requests (bad bytes, too many headers, bare LF ...) and errors outside the handlers.

        aiohttp logs the parser's message (which quotes the raw bytes: bearer keys, prompts) with a
        traceback and echoes it in a text/plain 400. Here: one log line naming the kind of error, never the
        bytes, and an OpenAI-shaped JSON body that echoes nothing. Always closes the connection.
        """
        kind = exc.__class__.__name__ if exc is not None else "error"
        if status >= 500:
            log.error("internal error outside a request handler (%s)", kind)
        else:
            log.info("rejected a malformed request: HTTP %d (%s)", status, kind)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started: cannot send the error")
        return malformed_request_response(status)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._header_handle is not None:
            self._header_handle.cancel()
            self._header_handle = None
        super().connection_lost(exc)


class _GatewayRunner(web.AppRunner):
    """An ``AppRunner`` whose connections use ``_HeaderTimeoutHandler``."""

    __slots__ = ("_header_timeout_s", "_max_connections")

    def __init__(
        self, app: web.Application, *, header_timeout_s: float, max_connections: int, **kwargs: Any
    ) -> None:
        super().__init__(app, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._max_connections = max_connections

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _HeaderTimeoutServer  # same state; only the connection handler class differs
        server._header_timeout_s = self._header_timeout_s  # type: ignore[attr-defined]
        server._max_connections = self._max_connections  # type: ignore[attr-defined]
        return server


class _HeaderTimeoutServer(web.Server):
    """aiohttp's protocol factory, building ``_HeaderTimeoutHandler`` connections."""

    _header_timeout_s: float
    _max_connections: int
    refused = 0  # connections refused over the limit (this server's count)
    _refusal_logged_s = -1e9

    def note_refusal(self, now: float) -> None:
        """Count a refused connection; log at most one line per second about them."""
        self.refused += 1
        if now - self._refusal_logged_s >= 1.0:
            self._refusal_logged_s = now
            log.warning(
                "connection limit %d reached: refusing new connections (%d so far)",
                self._max_connections,
                self.refused,
            )

    def __call__(self) -> RequestHandler:
        return _HeaderTimeoutHandler(
            self,
            loop=self._loop,
            header_timeout_s=self._header_timeout_s,
            max_connections=self._max_connections,
            **self._kwargs,
        )


async def _guard(name: str, run: Callable[[], Awaitable[None]]) -> None:
    """Run a control loop; a crash is logged (not silently lost) and does not take the gateway down."""
    try:
        await run()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("control loop %s crashed", name)
