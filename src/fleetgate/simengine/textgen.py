"""Deterministic filler text for the simulated engine, and stop-string handling.

Every output token is one word of at most six letters preceded by a space (``" river"``), which the shared
tokenizer approximation (``core.tokenize``) counts as exactly one token, so ``count_tokens`` of an output of
``n`` tokens is ``n``. The words cycle through a fixed list from a start chosen by the prompt, so the same
prompt gives the same text.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

WORDS: tuple[str, ...] = tuple(
    " " + w
    for w in [
        "the",
        "river",
        "runs",
        "past",
        "old",
        "stone",
        "walls",
        "while",
        "small",
        "birds",
        "sing",
        "and",
        "green",
        "trees",
        "sway",
        "in",
        "cool",
        "wind",
        "under",
        "a",
        "pale",
        "sky",
        "then",
        "light",
        "rain",
        "falls",
        "on",
        "quiet",
        "roads",
        "near",
        "the",
        "busy",
        "town",
        "where",
        "people",
        "walk",
        "home",
        "after",
        "long",
        "days",
        "of",
        "work",
        "and",
        "talk",
        "about",
        "plans",
        "for",
        "the",
        "coming",
        "week",
    ]
)
"""Output vocabulary: each entry is one approximate token (a space plus at most six letters)."""


def start_index(seed_text: str) -> int:
    """Where in ``WORDS`` the output of a prompt starts (stable across processes)."""
    return zlib.crc32(seed_text.encode("utf-8", "surrogatepass")) % len(WORDS)


def token_text(start: int, index: int) -> str:
    """Text of output token ``index`` (0-based) for a request starting at ``start``."""
    return WORDS[(start + index) % len(WORDS)]


def tokens_text(start: int, first: int, count: int) -> str:
    """Text of ``count`` output tokens from ``first``."""
    n = len(WORDS)
    return "".join(WORDS[(start + i) % n] for i in range(first, first + count))


@dataclass(frozen=True, slots=True)
class PlannedOutput:
    """How many tokens a request generates, why it stops, and how much text to return."""

    tokens: int
    finish_reason: str  # "length" or "stop"
    text_chars: int | None = None  # stop string found: return only this many characters of the text


def plan_output(start: int, max_tokens: int, stop: Sequence[str], eos_at: int | None = None) -> PlannedOutput:
    """Decide the output length up front.

    ``eos_at``: a sampled end-of-sequence after that many tokens (``None``: no EOS). A stop string ends the
    output at the token that completes it; the returned text stops before the stop string (OpenAI semantics)
    and the token count includes that token, as real engines report.
    """
    limit = max_tokens
    reason = "length"
    if eos_at is not None and eos_at < limit:
        limit, reason = max(1, eos_at), "stop"
    stops = [s for s in stop if s]
    if not stops:
        return PlannedOutput(limit, reason)
    text = tokens_text(start, 0, limit)
    best: int | None = None
    best_end = 0
    for s in stops:
        pos = text.find(s)
        if pos >= 0 and (best is None or pos < best):
            best, best_end = pos, pos + len(s)
    if best is None:
        return PlannedOutput(limit, reason)
    # Token count up to (and including) the token that holds the stop string's last character.
    n = len(WORDS)
    chars = 0
    tokens = 0
    while chars < best_end:
        chars += len(WORDS[(start + tokens) % n])
        tokens += 1
    return PlannedOutput(max(1, tokens), "stop", best)
