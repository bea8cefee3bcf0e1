"""Deterministic tokenizer approximation shared by the gateway and the simulated engine.

Why: the gateway (cache-aware routing, cost estimates) and the simulated engine (prefix cache, usage) must
agree exactly on token counts and on prefix-block hashes, without loading a real tokenizer.

The approximation (documented in docs/simengine.md) splits text into *pieces*, each counted as one token:

- a run of up to 6 letters, optionally preceded by one space (``" hello"`` is 1 token, ``"international"``
  is 3: ``intern`` / ``ationa`` / ``l``);
- a run of up to 3 digits, optionally preceded by one space;
- one punctuation/symbol character, optionally preceded by one space;
- one underscore;
- a run of newlines;
- a run of other whitespace not absorbed by the rules above.

Every character belongs to exactly one piece, so the pieces concatenate back to the text. English prose
comes out at roughly 4 characters (about 0.75 words) per token, close to BPE tokenizers such as GPT's or
Llama's. CJK text counts up to 6 characters per token (a real tokenizer gives about 1): an accepted
under-estimate for this project's English-heavy tests and traces.

``block_hashes`` groups the pieces into consecutive FULL blocks of ``block_tokens`` pieces and chains a
BLAKE2b digest over them (each hash covers the whole prefix up to its block), so two prompts share their
first ``k`` hashes exactly when their first ``k`` blocks are identical. The hashes are stable across
processes and Python versions (no ``hash()`` randomisation).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from hashlib import blake2b
from typing import Any

__all__ = [
    "TOKEN_PATTERN",
    "block_hashes",
    "count_and_hash",
    "count_and_hash_chat",
    "count_tokens",
    "render_chat_prompt",
    "token_pieces",
]

TOKEN_PATTERN = re.compile(r" ?[^\W\d_]{1,6}| ?\d{1,3}| ?[^\w\s]|_|\n+|[^\S\n]+")
"""One match per approximate token; together the matches cover every character of the text."""

_WS = r" \t\r\x0b\x0c\x1c-\x1f"  # what ``\s`` matches in ASCII text, minus "\n"
_ASCII_PATTERN = re.compile(
    (r" ?[A-Za-z]{1,6}| ?[0-9]{1,3}| ?[^A-Za-z0-9_\n" + _WS + r"]|_|\n+|[" + _WS + r"]+").encode()
)
# ``TOKEN_PATTERN`` for ASCII text, over bytes (the common case): the same pieces, about 30% faster, and
# already encoded for hashing. Unicode classes spelled out: in ASCII, [^\W\d_] is [A-Za-z], \d is [0-9],
# and \s also matches \x1c-\x1f. tests/unit/test_tokenize_fast.py checks the equivalence.

_HASH_BYTES = 8


def _pieces(text: str) -> list[str] | list[bytes]:
    """The pieces of ``text``: UTF-8 bytes when it is ASCII, else strings (same boundaries either way)."""
    if text.isascii():
        return _ASCII_PATTERN.findall(text.encode("ascii"))
    return TOKEN_PATTERN.findall(text)


def token_pieces(text: str) -> list[str]:
    """The approximate tokens of ``text``, in order; ``"".join(token_pieces(t)) == t``."""
    return TOKEN_PATTERN.findall(text)


def count_tokens(text: str) -> int:
    """Approximate token count of ``text`` (see the module docstring for the rules)."""
    if not text:
        return 0
    return len(_pieces(text))


def block_hashes(text: str, block_tokens: int = 16) -> tuple[int, ...]:
    """Chained 64-bit hashes of the consecutive full ``block_tokens``-token blocks of ``text``.

    The last partial block is not hashed (engines only cache full blocks).
    """
    return _hash_pieces(_pieces(text), block_tokens)


def count_and_hash(text: str, block_tokens: int = 16) -> tuple[int, tuple[int, ...]]:
    """``(count_tokens(text), block_hashes(text, block_tokens))`` with one pass over the text."""
    pieces = _pieces(text)
    return len(pieces), _hash_pieces(pieces, block_tokens)


def _hash_pieces(
    pieces: list[str] | list[bytes], block_tokens: int, known: tuple[int, ...] = ()
) -> tuple[int, ...]:
    """Chained block hashes; ``known``: already computed hashes of the first blocks (resume after them)."""
    if block_tokens <= 0:
        raise ValueError("block_tokens must be positive")
    full = len(pieces) // block_tokens
    if not full:
        return ()
    out: list[int] = list(known[:full])
    prev = out[-1].to_bytes(_HASH_BYTES, "big") if out else b""
    as_bytes = isinstance(pieces[0], bytes)
    join = b"".join
    for i in range(len(out), full):
        block: Any = pieces[i * block_tokens : (i + 1) * block_tokens]
        chunk = join(block) if as_bytes else "".join(block).encode("utf-8", "surrogatepass")
        digest = blake2b(prev + chunk, digest_size=_HASH_BYTES).digest()
        out.append(int.from_bytes(digest, "big"))
        prev = digest
    return tuple(out)


def _content_text(content: Any) -> str:
    """Text of a message ``content``: a string, or a list of parts whose text parts are concatenated."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts: list[str] = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text":
                text = part.get("text")
                if isinstance(text, str):
                    texts.append(text)
            # image_url / input_audio / other parts carry no text here.
        return "".join(texts)
    return str(content)


def _chat_segments(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    out: list[str] = []
    for message in messages:
        role = message.get("role", "user")
        out.append(f"<|im_start|>{role}\n{_content_text(message.get('content'))}<|im_end|>\n")
    out.append("<|im_start|>assistant\n")
    return out


def render_chat_prompt(messages: Sequence[Mapping[str, Any]]) -> str:
    """Deterministic ChatML-like prompt for a list of OpenAI chat messages.

    ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then ``<|im_start|>assistant\\n`` (the
    generation prompt). Text parts of list contents are concatenated; image and other parts are ignored.
    """
    return "".join(_chat_segments(messages))


#: Rendered message -> its pieces as UTF-8 bytes. Multi-turn chats resend their history with every turn, so
#: only the new messages need the regex. Bounded by pieces held (FIFO eviction); only long messages enter.
_SEGMENT_CACHE: dict[str, list[bytes]] = {}
_SEGMENT_CACHE_MAX_PIECES = 1 << 19  # about 25 MB of small bytes objects
_SEGMENT_CACHE_MIN_CHARS = 256
_segment_cache_pieces = 0


def _segment_pieces(segment: str) -> list[bytes]:
    global _segment_cache_pieces
    cached = _SEGMENT_CACHE.get(segment)
    if cached is not None:
        return cached
    if segment.isascii():
        pieces: list[bytes] = _ASCII_PATTERN.findall(segment.encode("ascii"))
    else:
        pieces = [p.encode("utf-8", "surrogatepass") for p in TOKEN_PATTERN.findall(segment)]
    if len(segment) >= _SEGMENT_CACHE_MIN_CHARS:
        while _SEGMENT_CACHE and _segment_cache_pieces + len(pieces) > _SEGMENT_CACHE_MAX_PIECES:
            _segment_cache_pieces -= len(_SEGMENT_CACHE.pop(next(iter(_SEGMENT_CACHE))))
        if len(pieces) <= _SEGMENT_CACHE_MAX_PIECES:
            _SEGMENT_CACHE[segment] = pieces
            _segment_cache_pieces += len(pieces)
    return pieces


def count_and_hash_chat(
    messages: Sequence[Mapping[str, Any]], block_tokens: int = 16, *, hashes: bool = True
) -> tuple[str, int, tuple[int, ...]]:
    """``(render_chat_prompt(m), count_tokens(text), block_hashes(text) or ())`` for chat messages.

    Same results as tokenizing the rendered text, computed per message (with a cache of long messages): no
    piece crosses a message boundary, since every rendered message ends with ``">\\n"`` and the next starts
    with ``"<"``. tests/unit/test_tokenize_fast.py checks the equivalence.
    """
    segments = _chat_segments(messages)
    pieces: list[bytes] = []
    for segment in segments:
        pieces += _segment_pieces(segment)
    text = "".join(segments)
    if not hashes:
        return text, len(pieces), ()
    # The hashes of a history's blocks were computed when that history was last sent: resume after them.
    history = tuple(segments[:-1])  # the messages, without the generation prompt
    known: tuple[int, ...] = ()
    for k in range(len(history), 0, -1):
        hit = _CHAIN_CACHE.get((block_tokens, history[:k]))
        if hit is not None:
            known = hit
            break
    out = _hash_pieces(pieces, block_tokens, known)
    history_blocks = (len(pieces) - len(_segment_pieces(segments[-1]))) // block_tokens
    if history_blocks >= _CHAIN_CACHE_MIN_BLOCKS and len(known) < history_blocks:
        _remember_chain((block_tokens, history), out[:history_blocks], len(text))
    return text, len(pieces), out


#: (block_tokens, rendered messages) -> the chained hashes of their full blocks (FIFO, bounded by chars held)
_CHAIN_CACHE: dict[tuple[int, tuple[str, ...]], tuple[int, ...]] = {}
_CHAIN_CACHE_SIZES: dict[tuple[int, tuple[str, ...]], int] = {}
_CHAIN_CACHE_MAX_CHARS = 16 << 20
_CHAIN_CACHE_MIN_BLOCKS = 8
_chain_cache_chars = 0


def _remember_chain(key: tuple[int, tuple[str, ...]], hashes: tuple[int, ...], chars: int) -> None:
    global _chain_cache_chars
    if chars > _CHAIN_CACHE_MAX_CHARS or key in _CHAIN_CACHE:
        return
    while _CHAIN_CACHE and _chain_cache_chars + chars > _CHAIN_CACHE_MAX_CHARS:
        oldest = next(iter(_CHAIN_CACHE))
        del _CHAIN_CACHE[oldest]
        _chain_cache_chars -= _CHAIN_CACHE_SIZES.pop(oldest)
    _CHAIN_CACHE[key] = hashes
    _CHAIN_CACHE_SIZES[key] = chars
    _chain_cache_chars += chars
