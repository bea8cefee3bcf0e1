"""Replica providers: who starts, stops, restarts and drains engine replicas.

The autoscaler (``scale_to``) and the health remediator (``restart``, ``drain``) talk to this small protocol
only, so the same control loops drive local processes, static lists and Kubernetes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class ReplicaStatus(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """A replica as its provider knows it."""

    name: str
    url: str
    status: ReplicaStatus = ReplicaStatus.RUNNING
    pid: int | None = None


ReplicaList = list[ReplicaInfo]


@dataclass(frozen=True, slots=True)
class ReplicaCounts:
    """What a provider reports to the autoscaler: its target, replicas ready (healthy) and still starting."""

    current: int
    ready: int
    starting: int = 0


#: Told the provider's current replica list after every change (the runtime syncs the gateway's fleet).
ChangeListener = Callable[[Sequence[ReplicaInfo]], None]
#: Asked to drain a replica before it is stopped: stop routing to it, wait for its in-flight requests.
DrainHook = Callable[[str, float], Awaitable[None]]


class ProviderError(Exception):
    """A provider could not do what it was asked (unknown replica, process would not start ...)."""


class ReplicaProvider(Protocol):
    """Start/stop/restart/drain replicas of one deployment."""

    async def list(self) -> ReplicaList:
        """Current replicas (any status but stopped)."""
        ...

    async def scale_to(self, replicas: int) -> ReplicaList:
        """Grow or shrink to ``replicas``; shrinking drains the replicas it removes first."""
        ...

    async def restart(self, name: str) -> ReplicaInfo:
        """Kill and start again, on the same address where the provider can."""
        ...

    async def drain(self, name: str) -> None:
        """Stop sending new requests to ``name`` and wait (bounded) for its in-flight ones."""
        ...
