"""Gateway lifecycle: listen, run the control loops, and shut down gracefully.

Shutdown (SIGTERM): readiness turns 503, the listening socket closes (no new connections), and every response
from then on carries ``Connection: close``. Requests that arrive on already-open keep-alive connections during
``shutdown_linger_s`` are still served (never reset after the gateway read them); in-flight requests and
streams get up to ``shutdown_grace_s`` to finish, then whatever is left is cancelled (streams get an SSE error
event), the remaining idle connections close and the upstream pool closes.

Slow clients: a connection that has started a request must deliver all its headers within
``client_header_timeout_s`` (slowloris), and an idle keep-alive connection closes after
``client_keepalive_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from fleetgate.config import GatewayConfig
from fleetgate.engines.client import UpstreamClient
from fleetgate.engines.scraper import MetricsScraper
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
    ) -> None:
        self.config = config
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
        self.runner = _GatewayRunner(
            self.app,
            header_timeout_s=self.config.client_header_timeout_s,
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
        else:
            await self._linger(linger_until)
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
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


class _HeaderTimeoutHandler(RequestHandler):
    """aiohttp's connection handler plus a header deadline: once the first bytes of a request arrived, the
    complete request head must follow within ``header_timeout_s`` or the connection is closed (aiohttp
    itself only closes idle connections, after its keep-alive timeout)."""

    __slots__ = ("_header_handle", "_header_timeout_s")

    def __init__(self, *args: Any, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._header_handle: asyncio.TimerHandle | None = None

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

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._header_handle is not None:
            self._header_handle.cancel()
            self._header_handle = None
        super().connection_lost(exc)


class _GatewayRunner(web.AppRunner):
    """An ``AppRunner`` whose connections use ``_HeaderTimeoutHandler``."""

    __slots__ = ("_header_timeout_s",)

    def __init__(self, app: web.Application, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._header_timeout_s = header_timeout_s

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _HeaderTimeoutServer  # same state; only the connection handler class differs
        server._header_timeout_s = self._header_timeout_s  # type: ignore[attr-defined]
        return server


class _HeaderTimeoutServer(web.Server):
    """aiohttp's protocol factory, building ``_HeaderTimeoutHandler`` connections."""

    _header_timeout_s: float

    def __call__(self) -> RequestHandler:
        return _HeaderTimeoutHandler(
            self, loop=self._loop, header_timeout_s=self._header_timeout_s, **self._kwargs
        )


async def _guard(name: str, run: Callable[[], Awaitable[None]]) -> None:
    """Run a control loop; a crash is logged (not silently lost) and does not take the gateway down."""
    try:
        await run()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("control loop %s crashed", name)
