"""Admission state stores: ``memory`` (default, per process) and ``redis`` (shared by gateway replicas)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetgate.stores.base import AdmissionStore, StoreUnavailableError
from fleetgate.stores.memory import MemoryStore

if TYPE_CHECKING:
    from fleetgate.config import AdmissionStoreConfig

__all__ = ["AdmissionStore", "MemoryStore", "StoreUnavailableError", "build_store"]


def build_store(cfg: AdmissionStoreConfig) -> AdmissionStore:
    """The store named by the config (Redis is imported only when used)."""
    if cfg.kind == "redis":
        from fleetgate.stores.redis import RedisStore

        return RedisStore(
            cfg.url,
            timeout_s=cfg.timeout_s,
            server_time=cfg.server_time,
            namespace=cfg.namespace,
            lease_ttl_s=cfg.lease_ttl_s,
        )
    return MemoryStore()
