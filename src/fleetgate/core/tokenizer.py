"""A real tokenizer behind a small protocol: token counts and prefix-block hashes from token ids.

Where a deployment names its model's ``tokenizer.json`` (``deployments[].tokenizer``), the gateway counts
prompt tokens with it (MU estimates, tokens-per-minute limits) and hashes prefix blocks of *token ids*, so
blocks line up with the engine's own KV blocks (``block_tokens``: the dialect's KV block size where known).
Without one, ``core.tokenize``'s fast approximation stays in use. The file is loaded outside the core
(``fleetgate.tokenizers``); this module only sees an object with ``encode``.

Chat messages are rendered with ``core.tokenize.render_chat_prompt`` (ChatML) before encoding: exact for
models whose template is ChatML (the project's tiny model), a few tokens per message off for others.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from hashlib import blake2b
from typing import Any, Protocol

from fleetgate.core.tokenize import render_chat_prompt, salt_seed

_HASH_BYTES = 8


class Tokenizer(Protocol):
    """What the gateway needs of a tokenizer: the token ids of a text (special tokens in it recognised)."""

    def encode(self, text: str) -> Sequence[int]: ...


def id_block_hashes(ids: Sequence[int], block_tokens: int, salt: bytes = b"") -> tuple[int, ...]:
    """Chained BLAKE2b hashes of the consecutive FULL blocks of ``block_tokens`` token ids (each hash covers
    the whole prefix up to its block), as ``core.tokenize.block_hashes`` does for approximate pieces;
    ``salt`` seeds the chain (tenant-scoped hashes)."""
    if block_tokens <= 0:
        raise ValueError("block_tokens must be positive")
    full = len(ids) // block_tokens
    out: list[int] = []
    prev = salt_seed(salt)
    raw = array("I", ids).tobytes()  # 4 bytes per id
    width = 4 * block_tokens
    for i in range(full):
        digest = blake2b(prev + raw[i * width : (i + 1) * width], digest_size=_HASH_BYTES).digest()
        out.append(int.from_bytes(digest, "big"))
        prev = digest
    return tuple(out)


def count_and_hash_text(
    tokenizer: Tokenizer, text: str, block_tokens: int = 16, *, hashes: bool = True, salt: bytes = b""
) -> tuple[int, tuple[int, ...]]:
    """(token count, prefix-block hashes or ``()``) of ``text`` with the real tokenizer."""
    ids = tokenizer.encode(text)
    return len(ids), (id_block_hashes(ids, block_tokens, salt) if hashes else ())


def count_and_hash_chat_ids(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    block_tokens: int = 16,
    *,
    hashes: bool = True,
    salt: bytes = b"",
) -> tuple[str, int, tuple[int, ...]]:
    """``(rendered prompt, token count, prefix-block hashes)`` of chat ``messages`` with the tokenizer."""
    text = render_chat_prompt(messages)
    count, out = count_and_hash_text(tokenizer, text, block_tokens, hashes=hashes, salt=salt)
    return text, count, out
