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
processes and Python versions (no ``hash()`` randomisation). A ``salt`` seeds the chain (tenant-scoped
prefix hashes: two tenants' identical prompts share no hash), the way vLLM's ``cache_salt`` seeds its own.

Work is linear in the text: long texts are split into chunks at proven piece boundaries (``_chunk_pieces``),
so a worker thread never holds the interpreter lock for long, and the caches of ``PromptTokenizer`` are
looked up by a rolling digest of the messages, never by re-hashing every prefix of the history.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from hashlib import blake2b
from typing import Any

__all__ = [
    "TOKEN_PATTERN",
    "PromptTokenizer",
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

#: Characters tokenized by one regex call at most: a call holds the interpreter lock (a few ms at this size).
CHUNK_CHARS = 1 << 16


def _pieces(text: str) -> list[str] | list[bytes]:
    """The pieces of ``text``: UTF-8 bytes when it is ASCII, else strings (same boundaries either way)."""
    if text.isascii():
        return _chunk_pieces(_ASCII_PATTERN, text.encode("ascii"), CHUNK_CHARS)
    return _chunk_pieces(TOKEN_PATTERN, text, CHUNK_CHARS)


def _chunk_pieces(pattern: re.Pattern[Any], text: Any, chunk: int) -> Any:
    """``pattern.findall(text)``, computed ``chunk`` characters at a time.

    Why it is exact: matching with ``endpos`` only changes a match that reaches ``endpos`` (every
    alternative that needs a character beyond it fails, and runs stop there); every earlier match is the one
    the whole text gives. So the last piece of a chunk is dropped and the next chunk starts where it began,
    a proven boundary. A chunk that is one single piece (a long run of whitespace) is doubled until it ends.
    """
    size = len(text)
    if size <= chunk:
        return pattern.findall(text)
    out: list[Any] = []
    pos = 0
    step = chunk
    while pos < size:
        end = pos + step
        if end >= size:
            out += pattern.findall(text, pos)
            break
        got = pattern.findall(text, pos, end)
        if len(got) < 2:
            step *= 2
            continue
        last = got.pop()
        out += got
        pos = end - len(last)
        step = chunk
    return out


def token_pieces(text: str) -> list[str]:
    """The approximate tokens of ``text``, in order; ``"".join(token_pieces(t)) == t``."""
    return TOKEN_PATTERN.findall(text)


def count_tokens(text: str) -> int:
    """Approximate token count of ``text`` (see the module docstring for the rules)."""
    if not text:
        return 0
    return len(_pieces(text))


def block_hashes(text: str, block_tokens: int = 16, salt: bytes = b"") -> tuple[int, ...]:
    """Chained 64-bit hashes of the consecutive full ``block_tokens``-token blocks of ``text``.

    The last partial block is not hashed (engines only cache full blocks). ``salt`` seeds the chain.
    """
    return _hash_pieces(_pieces(text), block_tokens, salt=salt)


def count_and_hash(text: str, block_tokens: int = 16, salt: bytes = b"") -> tuple[int, tuple[int, ...]]:
    """``(count_tokens(text), block_hashes(text, block_tokens, salt))`` with one pass over the text."""
    pieces = _pieces(text)
    return len(pieces), _hash_pieces(pieces, block_tokens, salt=salt)


def salt_seed(salt: bytes) -> bytes:
    """The chain's starting value for ``salt`` (empty: no salt, the hashes of an unsalted prompt)."""
    return blake2b(b"fleetgate-salt\0" + salt, digest_size=_HASH_BYTES).digest() if salt else b""


def _hash_pieces(
    pieces: list[str] | list[bytes], block_tokens: int, known: tuple[int, ...] = (), salt: bytes = b""
) -> tuple[int, ...]:
    """Chained block hashes; ``known``: already computed hashes of the first blocks (resume after them)."""
    if block_tokens <= 0:
        raise ValueError("block_tokens must be positive")
    full = len(pieces) // block_tokens
    if not full:
        return ()
    out: list[int] = list(known[:full])
    prev = out[-1].to_bytes(_HASH_BYTES, "big") if out else salt_seed(salt)
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


class PromptTokenizer:
    """Token counts and prefix hashes of chat prompts, with bounded caches (one instance per fleet).

    Multi-turn chats resend their history with every turn, so the pieces of long messages and the chained
    hashes of a history are kept: the next turn tokenizes and hashes only its new messages. Both caches are
    FIFO and bounded (``segment_cache_pieces`` pieces, ``chain_cache_blocks`` hashes). A history is looked
    up by a rolling digest over its messages (one pass, linear: never one key per prefix). Safe to call from
    worker threads (the caches are guarded by a lock; the tokenizing itself runs outside it).
    """

    __slots__ = (
        "_chain",
        "_chain_blocks",
        "_lock",
        "_segment_pieces_held",
        "_segments",
        "chain_cache_blocks",
        "segment_cache_pieces",
    )

    #: Only messages this long enter the segment cache (short ones are cheaper to re-tokenize).
    SEGMENT_MIN_CHARS = 256
    #: Only histories of at least this many full blocks enter the chain cache.
    CHAIN_MIN_BLOCKS = 8

    def __init__(self, *, segment_cache_pieces: int = 1 << 19, chain_cache_blocks: int = 1 << 18) -> None:
        self.segment_cache_pieces = segment_cache_pieces
        self.chain_cache_blocks = chain_cache_blocks
        self._segments: dict[str, list[bytes]] = {}
        self._segment_pieces_held = 0
        self._chain: dict[bytes, tuple[int, ...]] = {}
        self._chain_blocks = 0
        self._lock = threading.Lock()

    @classmethod
    def with_budget(cls, megabytes: float) -> PromptTokenizer:
        """Caches sized to about ``megabytes`` of memory (two thirds pieces, one third hashes)."""
        budget = max(0.0, megabytes) * (1 << 20)
        return cls(segment_cache_pieces=int(budget * 2 / 3 / 48), chain_cache_blocks=int(budget / 3 / 48))

    def count_and_hash_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        block_tokens: int = 16,
        *,
        hashes: bool = True,
        salt: bytes = b"",
    ) -> tuple[str, int, tuple[int, ...]]:
        """``(render_chat_prompt(m), count_tokens(text), block_hashes(text, salt=salt) or ())``.

        Same results as tokenizing the rendered text, computed per message: no piece crosses a message
        boundary, since every rendered message ends with ``">\\n"`` and the next starts with ``"<"``.
        tests/unit/test_tokenize_fast.py checks the equivalence.
        """
        segments = _chat_segments(messages)
        pieces: list[bytes] = []
        last = 0
        for segment in segments:
            got = self._segment_pieces(segment)
            pieces += got
            last = len(got)
        text = "".join(segments)
        if not hashes:
            return text, len(pieces), ()
        # Rolling digests of the history (the messages without the generation prompt): keys[k] names the
        # first k+1 messages. The newest remembered one says where hashing resumes.
        keys: list[bytes] = []
        key = blake2b(b"%d\0" % block_tokens + salt, digest_size=16).digest()
        for segment in segments[:-1]:
            key = blake2b(key + segment.encode("utf-8", "surrogatepass"), digest_size=16).digest()
            keys.append(key)
        known: tuple[int, ...] = ()
        chain = self._chain
        for key in reversed(keys):
            hit = chain.get(key)
            if hit is not None:
                known = hit
                break
        out = _hash_pieces(pieces, block_tokens, known, salt=salt)
        history_blocks = (len(pieces) - last) // block_tokens
        if keys and history_blocks >= self.CHAIN_MIN_BLOCKS and len(known) < history_blocks:
            self._remember_chain(keys[-1], out[:history_blocks])
        return text, len(pieces), out

    def _segment_pieces(self, segment: str) -> list[bytes]:
        cached = self._segments.get(segment)
        if cached is not None:
            return cached
        if segment.isascii():
            pieces: list[bytes] = _chunk_pieces(_ASCII_PATTERN, segment.encode("ascii"), CHUNK_CHARS)
        else:
            pieces = [
                p.encode("utf-8", "surrogatepass") for p in _chunk_pieces(TOKEN_PATTERN, segment, CHUNK_CHARS)
            ]
        if len(segment) >= self.SEGMENT_MIN_CHARS and len(pieces) <= self.segment_cache_pieces:
            with self._lock:
                cache = self._segments
                while cache and self._segment_pieces_held + len(pieces) > self.segment_cache_pieces:
                    self._segment_pieces_held -= len(cache.pop(next(iter(cache))))
                if segment not in cache:
                    cache[segment] = pieces
                    self._segment_pieces_held += len(pieces)
        return pieces

    def _remember_chain(self, key: bytes, hashes: tuple[int, ...]) -> None:
        size = len(hashes)
        if size > self.chain_cache_blocks:
            return
        with self._lock:
            chain = self._chain
            if key in chain:
                return
            while chain and self._chain_blocks + size > self.chain_cache_blocks:
                self._chain_blocks -= len(chain.pop(next(iter(chain))))
            chain[key] = hashes
            self._chain_blocks += size

    def cached_histories(self) -> int:
        """How many histories' hashes are remembered (for tests and metrics)."""
        return len(self._chain)


def count_and_hash_chat(
    messages: Sequence[Mapping[str, Any]], block_tokens: int = 16, *, hashes: bool = True, salt: bytes = b""
) -> tuple[str, int, tuple[int, ...]]:
    """``PromptTokenizer.count_and_hash_chat`` without caches (one-off callers: the simulated engine)."""
    uncached = PromptTokenizer(segment_cache_pieces=0, chain_cache_blocks=0)  # holds nothing
    return uncached.count_and_hash_chat(messages, block_tokens, hashes=hashes, salt=salt)
