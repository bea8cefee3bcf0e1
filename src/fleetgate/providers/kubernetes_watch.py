"""Replica discovery by watching the Service's EndpointSlices (list once, then watch from that version).

The protocol is the API server's list-then-watch, as informers do it:

1. ``GET .../endpointslices?labelSelector=kubernetes.io/service-name=S`` gives every slice and the
   collection's ``metadata.resourceVersion``;
2. ``GET ...?watch=1&resourceVersion=RV&allowWatchBookmarks=true&timeoutSeconds=T`` streams
   newline-delimited JSON events ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": ...}``; every
   event (bookmarks too) moves the kept resourceVersion forward, so the next watch resumes where this one
   ended and nothing is replayed or missed;
3. ``410 Gone`` (an HTTP status, or an ``ERROR`` event whose Status has ``code: 410``, reason ``Expired``)
   means the version was compacted away: relist, then watch again;
4. ``429`` (API priority and fairness) or a ``503``: wait the ``Retry-After`` the server asked for;
5. the API server unreachable (connection refused, timeout): the last known replicas stay as they are
   (the gateway keeps routing to them) and the watcher retries with capped exponential backoff, relisting
   once it is back (the kept version may have expired meanwhile, which step 3 handles);
6. a watch connection that goes silent is dead after ``idle_timeout_s`` without an event or bookmark, or
   sooner by TCP keepalive: after a partition in which the server forgot the connection (restarted, or a
   load balancer dropped it), nothing ever arrives on it again, and only a keepalive probe (answered by a
   reset) tells; without it the gateway missed every change for up to ``idle_timeout_s`` after the network
   came back (86 s measured, tests/netfaults/test_apiserver_partition.py).

:class:`SliceCache` is the sans-IO half (events in, replica changes out); :class:`EndpointSliceWatcher` is
the loop that feeds it and tells a :data:`~fleetgate.providers.base.ChangeListener`. Endpoint conditions map
to replica states: ``ready`` -> RUNNING (routable), ``serving`` but ``terminating`` -> DRAINING, neither ->
STARTING (known, not routable), endpoint gone -> removed from the list.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from fleetgate.providers.base import ChangeListener, ReplicaInfo, ReplicaStatus
from fleetgate.providers.kubernetes import (
    KubeReplica,
    KubernetesError,
    KubernetesProvider,
    parse_endpoint_slices,
    retry_after_seconds,
)
from fleetgate.tasks import cancel_and_wait

log = logging.getLogger("fleetgate.providers.kubernetes")


class ResourceExpired(Exception):
    """The kept resourceVersion is too old for the API server (410 Gone): relist."""


def replica_status(rep: KubeReplica) -> ReplicaStatus:
    """EndpointSlice conditions -> the provider's replica status."""
    if rep.ready:
        return ReplicaStatus.RUNNING
    if rep.serving and rep.terminating:
        return ReplicaStatus.DRAINING
    return ReplicaStatus.STARTING


def replica_infos(reps: list[KubeReplica]) -> list[ReplicaInfo]:
    return [ReplicaInfo(r.name, r.url, replica_status(r)) for r in reps]


class SliceCache:
    """The Service's EndpointSlices by name, the resourceVersion to resume from, the replicas listed."""

    def __init__(self, *, port_name: str | int | None = None, scheme: str = "http") -> None:
        self.port_name = port_name
        self.scheme = scheme
        self.resource_version: str | None = None
        self._slices: dict[str, Mapping[str, Any]] = {}
        self._replicas: list[KubeReplica] = []

    @property
    def replicas(self) -> list[KubeReplica]:
        return list(self._replicas)

    def _recompute(self) -> bool:
        reps = parse_endpoint_slices(
            {"items": list(self._slices.values())}, port_name=self.port_name, scheme=self.scheme
        )
        changed = reps != self._replicas
        self._replicas = reps
        return changed

    def reset(self, slice_list: Mapping[str, Any]) -> bool:
        """Replace everything with a fresh ``EndpointSliceList``; True when the replicas changed."""
        self._slices = {
            str((item.get("metadata") or {}).get("name")): item for item in slice_list.get("items") or []
        }
        self.resource_version = str((slice_list.get("metadata") or {}).get("resourceVersion") or "") or None
        return self._recompute()

    def apply(self, event: Mapping[str, Any]) -> bool:
        """One watch event; True when the replicas changed. Raises :class:`ResourceExpired` on a 410."""
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise ResourceExpired(str(obj.get("message") or "resource version expired"))
            raise KubernetesError(
                f"watch error: {obj.get('message')}",
                status=int(obj.get("code") or 500),
                reason=str(obj.get("reason") or ""),
            )
        meta = obj.get("metadata") or {}
        rv = meta.get("resourceVersion")
        if rv:
            self.resource_version = str(rv)
        if kind == "BOOKMARK":
            return False
        name = str(meta.get("name"))
        if kind in ("ADDED", "MODIFIED"):
            self._slices[name] = obj
        elif kind == "DELETED":
            self._slices.pop(name, None)
        else:
            return False
        return self._recompute()


@dataclass(frozen=True, slots=True)
class WatchSettings:
    """``timeout_s``: the server ends each watch after this (then it is resumed); ``idle_timeout_s``: a
    stream silent this long (no event, no bookmark) is taken as dead (a half-open connection); TCP keepalive
    on the watch's socket (probes after ``keepalive_idle_s`` of silence, every ``keepalive_interval_s``,
    ``keepalive_probes`` unanswered ones end it); backoff bounds.
    """

    timeout_s: int = 300
    idle_timeout_s: float = 90.0
    keepalive_idle_s: int = 10
    keepalive_interval_s: int = 5
    keepalive_probes: int = 3
    retry_initial_s: float = 0.2
    retry_max_s: float = 5.0


def keep_alive(resp: aiohttp.ClientResponse, settings: WatchSettings) -> None:
    """Turn on TCP keepalive for the connection ``resp`` streams on (see :class:`WatchSettings`)."""
    transport = resp.connection.transport if resp.connection is not None else None
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if sys.platform == "linux":
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, settings.keepalive_idle_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, settings.keepalive_interval_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, settings.keepalive_probes)


async def _lines(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """Newline-delimited chunks of a streamed body (no per-line size limit: slices can be large)."""
    buf = b""
    async for chunk in resp.content.iter_any():
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield line
    if buf.strip():
        yield buf


class EndpointSliceWatcher:
    """Keeps the provider's replica list current by list + watch; tells ``on_change`` after every change."""

    def __init__(
        self,
        provider: KubernetesProvider,
        on_change: ChangeListener | None = None,
        settings: WatchSettings | None = None,
    ) -> None:
        self.provider = provider
        self.on_change = on_change
        self.settings = settings or WatchSettings()
        self.cache = SliceCache(port_name=provider.port_name, scheme=provider.scheme)
        self.synced = asyncio.Event()
        self.relists = 0
        self.errors = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def replicas(self) -> list[KubeReplica]:
        """The last known endpoints (kept while the API server is unreachable)."""
        return self.cache.replicas

    def infos(self) -> list[ReplicaInfo]:
        return replica_infos(self.cache.replicas)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.infos())

    async def relist(self) -> None:
        obj = await self.provider.list_slices()
        self.relists += 1
        changed = self.cache.reset(obj or {})
        self.synced.set()
        if changed:
            self._changed()

    async def watch_once(self) -> None:
        """One watch from the kept version until the server closes it (``timeoutSeconds``) or it fails."""
        params = {
            "labelSelector": self.provider.slice_selector,
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": self.cache.resource_version or "",
            "timeoutSeconds": str(self.settings.timeout_s),
        }
        stream = self.provider.open_stream(
            self.provider.slices_path, params=params, idle_timeout_s=self.settings.idle_timeout_s
        )
        async with stream as resp:
            keep_alive(resp, self.settings)
            if resp.status >= 400:
                raw = await resp.read()
                if resp.status == 410:
                    raise ResourceExpired(raw.decode(errors="replace")[:200])
                raise KubernetesError(
                    f"watch: HTTP {resp.status}: {raw.decode(errors='replace')[:200]}",
                    status=resp.status,
                    retry_after_s=retry_after_seconds(resp.headers.get("Retry-After")),
                )
            async for line in _lines(resp):
                if self.cache.apply(orjson.loads(line)):
                    self._changed()

    async def run(self) -> None:
        """List, then watch forever; 410 relists, 429/503 wait Retry-After, outages back off and relist."""
        delay = self.settings.retry_initial_s
        need_list = True
        while True:
            try:
                if need_list or self.cache.resource_version is None:
                    await self.relist()
                    need_list = False
                await self.watch_once()
                delay = self.settings.retry_initial_s
            except ResourceExpired as exc:
                log.info("endpointslice watch: %s; relisting", exc)
                need_list = True
            except KubernetesError as exc:
                self.errors += 1
                wait = exc.retry_after_s if exc.retry_after_s is not None else delay
                log.warning("endpointslice watch: %s; retrying in %.1f s", exc, wait)
                await asyncio.sleep(wait)
                delay = min(self.settings.retry_max_s, delay * 2)
            except (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError) as exc:
                # Unreachable, silent or cut mid-stream: keep the last known replicas and resume the watch
                # from the kept version when it answers again (a 410 then means relist).
                self.errors += 1
                log.warning("endpointslice watch: API server unreachable (%r); retry in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(self.settings.retry_max_s, delay * 2)

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=f"k8s-watch-{self.provider.service}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
