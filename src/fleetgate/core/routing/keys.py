"""Workload keys: which requests belong together for affinity, as stable 64-bit integers.

``prefix`` (default): the chained hash of the prompt's first ``ceil(key_prefix_tokens / block_tokens)``
blocks (or of all its full blocks when it is shorter), so every turn of a conversation and every request
sharing a long system prompt get the same key; falls back to the session, then the tenant.
``session``: ``RequestInfo.session_key`` (from a session header), falling back to the prefix, then tenant.
``tenant``: the tenant (plus model).
``context`` (session grain): the deepest block of the prompt that some replica is expected to hold (the
reusable context: for a session's next turn, its previous turn's prompt), when that is deeper than the
``prefix`` key; else the ``prefix`` key. Every turn of a session thus has its own key, held by the replica
that served the previous turn, while a session's first turn keys on the shared system prompt (where hot
keys spread, by whole sessions).

Hashes are stable across processes (BLAKE2b, SplitMix64), never Python's randomised ``hash()``, so the
gateway and the simulator assign keys identically.
"""

from __future__ import annotations

from hashlib import blake2b
from typing import Literal

from fleetgate.core.types import RequestInfo

KeyKind = Literal["prefix", "session", "tenant", "context"]
KEY_KINDS: tuple[str, ...] = ("prefix", "session", "tenant", "context")

_MASK = (1 << 64) - 1


def mix64(x: int) -> int:
    """SplitMix64 finaliser: spreads small or structured integers (e.g. trace block ids) over 64 bits."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def str_hash64(text: str) -> int:
    """Stable 64-bit hash of a string."""
    return int.from_bytes(blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


class KeyFunction:
    """Maps a request to its workload key (an int); memoises string hashes."""

    def __init__(self, kind: str = "prefix", key_prefix_tokens: int = 1024) -> None:
        if kind not in KEY_KINDS:
            raise ValueError(f"key must be one of {', '.join(KEY_KINDS)}")
        if key_prefix_tokens < 1:
            raise ValueError("key_prefix_tokens must be >= 1")
        self.kind = kind
        self.key_prefix_tokens = key_prefix_tokens
        self._strings: dict[str, int] = {}

    def _s(self, tag: str, text: str) -> int:
        full = tag + text
        h = self._strings.get(full)
        if h is None:
            if len(self._strings) > 100_000:
                self._strings.clear()
            h = self._strings[full] = str_hash64(full)
        return h

    def _prefix(self, request: RequestInfo) -> int | None:
        hashes = request.prefix_hashes
        if not hashes:
            return None
        bt = request.prefix_block_tokens if request.prefix_block_tokens > 0 else 16
        k = min(len(hashes), -(-self.key_prefix_tokens // bt))
        return mix64(hashes[k - 1] & _MASK)

    def __call__(self, request: RequestInfo, held_blocks: int = 0) -> int:
        """The key; ``held_blocks``: the prompt's leading blocks some replica is expected to hold (``context``
        keys only)."""
        if self.kind == "context" and held_blocks:
            hashes = request.prefix_hashes
            bt = request.prefix_block_tokens if request.prefix_block_tokens > 0 else 16
            if held_blocks > -(-self.key_prefix_tokens // bt) and held_blocks <= len(hashes):
                return mix64(hashes[held_blocks - 1] & _MASK)
        if self.kind == "tenant":
            return self._s("t:", request.tenant + "\x00" + request.model)
        if self.kind == "session" and request.session_key:
            return self._s("s:", request.session_key)
        p = self._prefix(request)
        if p is not None:
            return p
        if request.session_key:
            return self._s("s:", request.session_key)
        return self._s("t:", request.tenant + "\x00" + request.model)
