"""Serve a throw-away aiohttp app on 127.0.0.1 (a free port) for tests that need a real HTTP peer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web


async def start_site(app: web.Application, **runner_kw: Any) -> tuple[web.AppRunner, str]:
    """Start ``app`` on 127.0.0.1, port 0; returns the runner (``await runner.cleanup()`` stops it), URL."""
    runner = web.AppRunner(app, **runner_kw)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@asynccontextmanager
async def serve_app(app: web.Application, **runner_kw: Any) -> AsyncIterator[str]:
    """``async with serve_app(app) as url``: the app serves at ``url`` inside the block."""
    runner, url = await start_site(app, **runner_kw)
    try:
        yield url
    finally:
        await runner.cleanup()
