"""Deterministic output text for the simulated engine, and stop-string handling.

Every output token is one word of at most six letters preceded by a space (``" river"``), which the shared
tokenizer approximation (``core.tokenize``) counts as exactly one token, so ``count_tokens`` of an output of
``n`` tokens is ``n``.

The text behaves like greedy decoding of a real model: each word is a function of everything before it, the
prompt and the words already generated (word ``i`` is picked by the CRC-32 of ``prompt + words[:i]``, computed
as a running CRC, one word at a time). So the same prompt always gives the same text, and a *continuation*
request — the prompt followed by the first ``k`` words, as ``/v1/completions`` text or as a chat whose final
assistant message is continued (``continue_final_message``) — produces exactly words ``k, k+1, ...`` of the
uninterrupted answer. That is what lets a continued stream be compared token for token with an unbroken one.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetgate.core.errors import InvalidRequestError
from fleetgate.core.tokenize import render_chat_prompt

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


_WORD_BYTES: tuple[bytes, ...] = tuple(w.encode() for w in WORDS)


def start_index(seed_text: str) -> int:
    """The generator state after ``seed_text`` (the rendered prompt): its running CRC-32 (stable across
    processes). The name is historical: it used to be an index into ``WORDS``."""
    return zlib.crc32(seed_text.encode("utf-8", "surrogatepass"))


class WordChain:
    """The output words after a given state, one at a time (``next``), each chosen by the running CRC of
    all text before it."""

    __slots__ = ("state",)

    def __init__(self, state: int) -> None:
        self.state = state

    def next(self) -> str:
        i = self.state % len(WORDS)
        self.state = zlib.crc32(_WORD_BYTES[i], self.state)
        return WORDS[i]


def tokens_text(start: int, first: int, count: int) -> str:
    """Text of ``count`` output tokens from token ``first`` for a request whose state is ``start``."""
    chain = WordChain(start)
    for _ in range(first):
        chain.next()
    return "".join([chain.next() for _ in range(count)])


def filler_words(start: int, count: int) -> tuple[str, ...]:
    """The first ``count`` output tokens for a request whose state is ``start``, one string per token."""
    chain = WordChain(start)
    return tuple([chain.next() for _ in range(count)])


def token_text(start: int, index: int) -> str:
    """Text of output token ``index`` (0-based) for a request whose state is ``start``."""
    return tokens_text(start, index, 1)


def continuation_prompt(body: Mapping[str, Any]) -> str | None:
    """The rendered prompt of a chat request that continues its final assistant message (vLLM's
    ``continue_final_message: true`` with ``add_generation_prompt: false``), else ``None``.

    Rendered like ``core.tokenize.render_chat_prompt`` of the messages before it (which ends with the
    assistant header, the generation prompt) followed by the partial answer, without an end-of-turn marker:
    the same text a real engine's chat template produces, so the answer goes on where it stopped.
    """
    if not body.get("continue_final_message"):
        return None
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], Mapping):
        raise InvalidRequestError("'continue_final_message' needs messages", param="messages")
    last = messages[-1]
    if last.get("role") != "assistant":
        raise InvalidRequestError(
            "'continue_final_message' is set but the final message is not an assistant message",
            param="continue_final_message",
        )
    if body.get("add_generation_prompt", True) is not False:
        raise InvalidRequestError(
            "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true.",
            param="add_generation_prompt",
        )
    content = last.get("content")
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
        content = "".join(str(p.get("text", "")) for p in parts)
    return render_chat_prompt(messages[:-1]) + (content if isinstance(content, str) else "")


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
    words = WordChain(start)
    pieces = [words.next() for _ in range(limit)]
    text = "".join(pieces)
    best: int | None = None
    best_end = 0
    for s in stops:
        pos = text.find(s)
        if pos >= 0 and (best is None or pos < best):
            best, best_end = pos, pos + len(s)
    if best is None:
        return PlannedOutput(limit, reason)
    # Token count up to (and including) the token that holds the stop string's last character.
    chars = 0
    tokens = 0
    while chars < best_end:
        chars += len(pieces[tokens])
        tokens += 1
    return PlannedOutput(max(1, tokens), "stop", best)
