"""A fixed list of replicas from config: nothing to start or stop; drain only stops routing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fleetgate.providers.base import DrainHook, ProviderError, ReplicaInfo, ReplicaList, ReplicaStatus


class StaticReplica(Protocol):
    """A configured replica (``config.ReplicaConfig`` fits): providers never import the config module."""

    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...


class StaticProvider:
    """Replicas someone else runs. ``scale_to`` can only confirm the current size; ``restart`` is refused."""

    def __init__(self, replicas: Sequence[StaticReplica], drain_hook: DrainHook | None = None) -> None:
        self._replicas = {r.name: ReplicaInfo(r.name, r.url) for r in replicas}
        self._drain_hook = drain_hook

    async def list(self) -> ReplicaList:
        return list(self._replicas.values())

    async def scale_to(self, replicas: int) -> ReplicaList:
        if replicas != len(self._replicas):
            raise ProviderError(
                f"static replica list has {len(self._replicas)} replicas; cannot scale to {replicas}"
            )
        return await self.list()

    async def restart(self, name: str) -> ReplicaInfo:
        raise ProviderError(f"replica {name!r} is static: fleetgate cannot restart it")

    async def drain(self, name: str) -> None:
        info = self._replicas.get(name)
        if info is None:
            raise ProviderError(f"unknown replica {name!r}")
        self._replicas[name] = ReplicaInfo(info.name, info.url, ReplicaStatus.DRAINING)
        if self._drain_hook is not None:
            await self._drain_hook(name, 30.0)
