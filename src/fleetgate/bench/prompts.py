"""Prompt synthesis for trace replay: prefix block ids -> real text with the same sharing structure.

Why: a trace such as Mooncake's records only lengths and ``hash_ids`` (ids of 512-token prefix blocks; two
requests share KV exactly as far as their leading ids agree). To replay it against a live engine with a prefix
cache, every request needs a real prompt whose leading text is shared exactly where the ids are shared. Each
block id maps to a deterministic block of words; a prompt is the concatenation of its blocks' words. Every
word is at most six lowercase letters after one space, which ``core.tokenize`` counts as exactly one token, so
a block of ``n`` words is ``n`` tokens and block boundaries never merge tokens. Requests that share their
first ``k`` ids therefore share their first ``k`` text blocks, and hence the corresponding leading
``core.tokenize.block_hashes`` that engines and the gateway key their prefix caches on.

``tokens_scale`` shrinks every length (a 512-token block becomes ``round(512 * tokens_scale)`` words;
1/32 gives 16, exactly one engine KV block) so that a small machine can serve a replay of a big-model trace.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["BlockKey", "PromptSynth"]

BlockKey = int | str
"""A block id: a trace ``hash_id`` (int) or a synthetic key for requests without prefix ids."""

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(slots=True)
class PromptSynth:
    """Deterministic text for prefix block ids (see the module docstring).

    ``source_block_tokens`` is the trace's block size (Mooncake: 512); ``seed`` changes every text (two
    synthesisers with the same seed produce identical prompts in any process).
    """

    tokens_scale: float = 1.0 / 32.0
    source_block_tokens: int = 512
    seed: int = 0
    _cache: dict[BlockKey, tuple[str, ...]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.tokens_scale > 0:
            raise ValueError("tokens_scale must be > 0")
        if self.source_block_tokens < 1:
            raise ValueError("source_block_tokens must be >= 1")

    @property
    def block_len(self) -> int:
        """Words (= approximate tokens) per synthesised block."""
        return max(1, round(self.source_block_tokens * self.tokens_scale))

    def scaled_tokens(self, tokens: int) -> int:
        """A trace length scaled by ``tokens_scale`` (at least 1)."""
        return max(1, round(tokens * self.tokens_scale))

    def block_words(self, key: BlockKey) -> tuple[str, ...]:
        """The words of block ``key`` (each ``" " + 1..6 letters``, i.e. exactly one token)."""
        words = self._cache.get(key)
        if words is None:
            # str seeds go through SHA-512 in ``random``: stable across processes (no hash randomisation).
            rng = random.Random(f"fleetgate-bench:{self.seed}:{type(key).__name__}:{key}")
            words = tuple(
                " " + "".join(rng.choices(_LETTERS, k=rng.randint(2, 6))) for _ in range(self.block_len)
            )
            self._cache[key] = words
        return words

    def text(self, hash_ids: Sequence[BlockKey], input_tokens: int, *, unique_key: str | None = None) -> str:
        """Prompt text of about ``scaled_tokens(input_tokens)`` tokens whose blocks follow ``hash_ids``.

        The last block is cut to the remaining length (the same cut of the same block for requests of the
        same length). When the ids cover fewer tokens than the length (or there are none, as in Azure
        traces), the rest is filled with blocks unique to ``unique_key`` (required then), so unrelated
        requests never share text by accident.
        """
        target = self.scaled_tokens(input_tokens)
        size = self.block_len
        keys: list[BlockKey] = list(hash_ids)
        missing = -(-target // size) - len(keys)
        if missing > 0:
            if unique_key is None:
                raise ValueError("hash_ids cover fewer tokens than input_tokens: pass unique_key")
            keys.extend(f"{unique_key}/{j}" for j in range(missing))
        parts: list[str] = []
        left = target
        for key in keys:
            if left <= 0:
                break
            words = self.block_words(key)
            take = min(size, left)
            parts.extend(words[:take])
            left -= take
        return "".join(parts)
