"""The Kubernetes replica provider behind the ``ReplicaProvider`` protocol: watch-fed list, scale, heal.

:class:`KubernetesReplicaProvider` joins the API calls (``kubernetes.KubernetesProvider``) and the
EndpointSlice watcher (``kubernetes_watch.EndpointSliceWatcher``) into what the autoscaler loop and the
health remediator talk to:

* ``list()``: the watcher's last known replicas (running / draining / starting), no API call, so routing
  and the autoscaler keep working while the API server is unreachable;
* ``scale_to(n)``: growing patches the Deployment's ``scale`` subresource; shrinking first drains the chosen
  replicas (the gateway's drain hook stops routing to them and waits, bounded, for their in-flight requests),
  marks their pods ``controller.kubernetes.io/pod-deletion-cost: -1000`` and only then lowers the count, so
  the ReplicaSet removes those pods and not busy ones;
* ``restart(name)``: deletes the pod (its ReplicaSet replaces it);
* ``drain(name)``: drain hook, then the deletion-cost mark.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

from fleetgate.providers.base import (
    ChangeListener,
    DrainHook,
    ProviderError,
    ReplicaCounts,
    ReplicaInfo,
    ReplicaList,
    ReplicaStatus,
)
from fleetgate.providers.kubernetes import KubernetesError, KubernetesProvider
from fleetgate.providers.kubernetes_watch import EndpointSliceWatcher, WatchSettings

#: Makes the API client (e.g. ``kubernetes_config.connect``: in-cluster or from a kubeconfig).
Connect = Callable[[], Awaitable[KubernetesProvider]]


class KubernetesReplicaProvider:
    """One engine Deployment's replicas, discovered by watch and changed through the API server."""

    def __init__(
        self,
        api: KubernetesProvider | Connect,
        *,
        on_change: ChangeListener | None = None,
        drain_hook: DrainHook | None = None,
        drain_timeout_s: float = 30.0,
        watch: WatchSettings | None = None,
    ) -> None:
        """``api``: the API client, or a coroutine function making it (called by :meth:`start`: reading a
        kubeconfig is asynchronous)."""
        self.on_change = on_change
        self.drain_hook = drain_hook
        self.drain_timeout_s = drain_timeout_s
        self._watch_settings = watch
        self._connect: Connect | None = None
        self._api: KubernetesProvider | None = None
        self._watcher: EndpointSliceWatcher | None = None
        if isinstance(api, KubernetesProvider):
            self._attach(api)
        else:
            self._connect = api
        self._draining: set[str] = set()  # drained by us, still listed ready until their pod terminates
        self._lock = asyncio.Lock()

    def _attach(self, api: KubernetesProvider) -> None:
        self._api = api
        self._watcher = EndpointSliceWatcher(api, self._changed, self._watch_settings)

    @property
    def api(self) -> KubernetesProvider:
        if self._api is None:
            raise ProviderError("the Kubernetes provider is not started (no API client yet)")
        return self._api

    @property
    def watcher(self) -> EndpointSliceWatcher:
        if self._watcher is None:
            raise ProviderError("the Kubernetes provider is not started (no watch yet)")
        return self._watcher

    def _infos(self) -> ReplicaList:
        if self._watcher is None:
            return []
        infos = self._watcher.infos()
        self._draining &= {i.name for i in infos}
        return [
            ReplicaInfo(i.name, i.url, ReplicaStatus.DRAINING) if i.name in self._draining else i
            for i in infos
        ]

    def _changed(self, _infos: Sequence[ReplicaInfo]) -> None:
        if self.on_change is not None:
            self.on_change(self._infos())

    async def start(self, sync_timeout_s: float = 10.0) -> None:
        """Connect if needed, start watching; waits (bounded) for the first list so the gateway starts with
        the replicas (an unreachable API server does not stop the start: the watch keeps retrying)."""
        if self._api is None and self._connect is not None:
            self._attach(await self._connect())
        self.watcher.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.watcher.synced.wait(), sync_timeout_s)

    async def stop(self) -> None:
        if self._watcher is not None:
            await self._watcher.stop()
        if self._api is not None:
            await self._api.close()

    # -- protocol ------------------------------------------------------------------------------------------

    async def list(self) -> ReplicaList:
        """Last known replicas; the ones this provider drained stay draining until their endpoint goes."""
        return self._infos()

    async def counts(self) -> ReplicaCounts:
        """The Deployment's desired count (pods without an endpoint yet count as starting)."""
        scale = await self.api.get_scale()
        ready = sum(1 for r in self._infos() if r.status == ReplicaStatus.RUNNING)
        return ReplicaCounts(
            current=scale.spec_replicas, ready=ready, starting=max(0, scale.spec_replicas - ready)
        )

    async def scale_to(self, replicas: int) -> ReplicaList:
        if replicas < 0:
            raise ProviderError("replicas must be >= 0")
        async with self._lock:
            current = (await self.api.get_scale()).spec_replicas
            if replicas < current:
                # The ReplicaSet removes pods that are pending or not ready before any ready one, whatever
                # their deletion cost: only the remainder comes out of the ready ones, newest first.
                ready = [r for r in self._infos() if r.status == ReplicaStatus.RUNNING]
                ready.sort(key=lambda r: r.name, reverse=True)
                victims = ready[: max(0, (current - replicas) - (current - len(ready)))]
                await asyncio.gather(*(self.drain(v.name) for v in victims))
            try:
                await self.api.scale_to(replicas)
            except KubernetesError as exc:
                raise ProviderError(f"scale {self.api.deployment} to {replicas}: {exc}") from exc
        return await self.list()

    async def restart(self, name: str) -> ReplicaInfo:
        known = {r.name: r for r in self.watcher.infos()}
        if name not in known:
            raise ProviderError(f"unknown replica {name!r}")
        try:
            await self.api.restart(name)
        except KubernetesError as exc:
            raise ProviderError(f"delete pod {name}: {exc}") from exc
        return ReplicaInfo(name, known[name].url, ReplicaStatus.DRAINING)

    async def drain(self, name: str) -> None:
        self._draining.add(name)
        self._changed([])
        if self.drain_hook is not None:
            await self.drain_hook(name, self.drain_timeout_s)
        try:
            await self.api.drain(name)
        except KubernetesError as exc:
            if exc.status != 404:  # already gone: nothing left to mark
                raise ProviderError(f"mark pod {name} for deletion: {exc}") from exc
