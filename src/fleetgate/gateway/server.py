"""Gateway lifecycle: listen, run the control loops, and shut down gracefully.

Shutdown (SIGTERM): readiness turns 503, the listening socket closes (no new connections), in-flight requests
and streams get up to ``shutdown_grace_s`` to finish, then whatever is left is cancelled (streams get an SSE
error event) and the upstream pool closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

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
        #: control-plane objects attached by the composition root (e.g. ``"health"`` -> monitors by model)
        self.extras: dict[str, Any] = {}

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
        self.runner = web.AppRunner(
            self.app,
            handle_signals=False,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=1.0,
        )
        await self.runner.setup()
        self.site = web.TCPSite(
            self.runner, self.config.host, self.config.port if port is None else port, backlog=1024
        )
        await self.site.start()
        server = self.site._server
        sockets = getattr(server, "sockets", None) or []
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
        self.proxy.shutting_down = True
        if self.site is not None:
            await self.site.stop()
            self.site = None
        drained = await self.proxy.wait_idle(grace)
        if not drained:
            log.warning("shutdown grace of %.1f s over: cancelling %d request(s)", grace, self.proxy.active)
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


async def _guard(name: str, run: Callable[[], Awaitable[None]]) -> None:
    """Run a control loop; a crash is logged (not silently lost) and does not take the gateway down."""
    try:
        await run()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("control loop %s crashed", name)
