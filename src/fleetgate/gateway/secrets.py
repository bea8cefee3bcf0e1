"""Key files: API keys and upstream keys read from files (mounted Kubernetes Secrets), re-read while running.

Why: keys belong in Secrets, not in a ConfigMap, and rotating one must not need a restart. A file named by
``tenants[].api_keys_file``, ``admission.admin_api_keys_file`` or ``deployments[].upstream_api_key_file`` is
read when the gateway is built and then every ``gateway.secret_files_interval_s``; when its content changed,
the tenant's keys (its inline ``api_keys`` plus the file's) or the deployment's upstream key are replaced at
once. An unreadable or conflicting file keeps the keys in force and is logged (never an open gateway).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleetgate.config import ConfigError, FleetgateConfig, hash_api_key

log = logging.getLogger("fleetgate.secrets")


def read_key_file(path: str) -> list[str]:
    """Keys in a file, one per line; blank lines and ``#`` comments are skipped. Raises ``OSError``."""
    lines = Path(path).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def read_secret_file(path: str) -> str:
    """A single secret (the whole file, surrounding whitespace removed). Raises ``OSError``."""
    return Path(path).read_text().strip()


class KeySink:
    """Where new keys go: the tenant directory and the deployments' upstream headers (no-op defaults)."""

    def set_keys(self, tenant: str | None, key_hashes: list[str]) -> None:
        """Replace ``tenant``'s keys (``None``: admin keys); raise ``ValueError`` on a conflict."""

    def set_upstream_key(self, model: str, key: str) -> None:
        """Send ``key`` as the bearer to ``model``'s engines from now on."""


@dataclass(slots=True)
class _Watched:
    path: str
    apply: Callable[[str], None]  # the file's text -> applied (raises ValueError/OSError to refuse)
    what: str
    last: str | None = None


class SecretFiles:
    """The key files of one config; ``refresh()`` re-reads them all, ``run()`` does so periodically."""

    def __init__(self, cfg: FleetgateConfig, sink: KeySink) -> None:
        self.interval_s = cfg.gateway.secret_files_interval_s
        self._watched: list[_Watched] = []
        for i, tenant in enumerate(cfg.tenants):
            if tenant.api_keys_file:
                self._watch(
                    tenant.api_keys_file,
                    f"tenants[{i}].api_keys_file",
                    _keys(sink, tenant.name, tenant.api_keys),
                )
        adm = cfg.admission
        if adm.admin_api_keys_file:
            self._watch(
                adm.admin_api_keys_file,
                "admission.admin_api_keys_file",
                _keys(sink, None, adm.admin_api_keys),
            )
        for i, dep in enumerate(cfg.deployments):
            if dep.upstream_api_key_file:
                self._watch(
                    dep.upstream_api_key_file,
                    f"deployments[{i}].upstream_api_key_file",
                    _upstream(sink, dep.model),
                )

    def _watch(self, path: str, what: str, apply: Callable[[str], None]) -> None:
        self._watched.append(_Watched(path, apply, what))

    def __bool__(self) -> bool:
        return bool(self._watched)

    def refresh(self, *, strict: bool = False) -> int:
        """Re-read every file; apply those whose content changed. Returns how many were applied.
        ``strict`` (at start-up): a file that cannot be read or applied is a ``ConfigError`` naming it."""
        applied = 0
        for w in self._watched:
            try:
                text = Path(w.path).read_text()
                if text == w.last:
                    continue
                w.apply(w.path)
            except (OSError, ValueError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                if strict:
                    raise ConfigError(f"{w.what}: cannot use {w.path}: {reason}") from exc
                log.error("%s: %s not applied (%s); the keys in force stay", w.what, w.path, reason)
                continue
            if w.last is not None:
                log.info("%s: %s changed; keys replaced", w.what, w.path)
            w.last = text
            applied += 1
        return applied

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.refresh()


def _keys(sink: KeySink, tenant: str | None, inline: list[str]) -> Callable[[str], None]:
    """Apply a key file: the tenant's inline keys (already hashed) plus the file's."""

    def apply(path: str) -> None:
        sink.set_keys(tenant, [*inline, *(hash_api_key(k) for k in read_key_file(path))])

    return apply


def _upstream(sink: KeySink, model: str) -> Callable[[str], None]:
    def apply(path: str) -> None:
        sink.set_upstream_key(model, read_secret_file(path))

    return apply
