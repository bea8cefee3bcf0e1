"""Upstream HTTP client for engine replicas: one pooled aiohttp session, errors mapped onto core.errors.

Connect failures and refused connections become retryable ``UpstreamError``s; slow servers become
``UpstreamTimeoutError``. Read timeouts are applied by the caller (the gateway knows whether it waits for a
first byte or for the next stream chunk), so the session itself only bounds connecting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp

from fleetgate.core.errors import UpstreamError, UpstreamTimeoutError


class UpstreamClient:
    """A shared connection pool to every replica (keep-alive, no per-host limit)."""

    def __init__(self, *, connect_timeout_s: float = 2.0, limit: int = 0) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._limit, limit_per_host=0, keepalive_timeout=30.0)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=None, sock_connect=self._connect_timeout_s, sock_read=None
                ),
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
                cookie_jar=aiohttp.DummyCookieJar(),  # engines set no cookies; a real jar costs per request
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> aiohttp.ClientResponse:
        """Send a request and return once the response headers arrived (the body is still unread)."""
        try:
            return await self.session.post(url, data=body, headers=headers, allow_redirects=False)
        except aiohttp.ServerTimeoutError as exc:
            raise UpstreamTimeoutError(f"timed out connecting to {url}: {exc}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(f"cannot reach {url}: {exc.__class__.__name__}: {exc}") from exc

    async def get_text(self, url: str, timeout_s: float) -> str:
        """GET a small text document (``/metrics``, ``/health``) within ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                async with self.session.get(url) as resp:
                    if resp.status != 200:
                        raise UpstreamError(
                            f"GET {url} returned HTTP {resp.status}", upstream_status=resp.status
                        )
                    return await resp.text()
        except TimeoutError as exc:
            raise UpstreamTimeoutError(f"GET {url} timed out after {timeout_s:g} s") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(f"GET {url} failed: {exc.__class__.__name__}: {exc}") from exc
