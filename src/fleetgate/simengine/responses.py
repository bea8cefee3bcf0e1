"""Response bodies and SSE chunks of the simulated engine, in OpenAI's (and vLLM's) shapes.

A request becomes one :class:`ChoicePlan` per output sequence (``n`` per prompt; a completions ``prompt``
list gives one group per prompt). A plan knows its tokens' text (filler words from ``textgen``, or the
pieces of a JSON answer / tool-call arguments), why it ends, and whether it echoes its prompt. Plain-text
streams without logprobs take a byte-template fast path (the engine serves benchmarks); everything else is
built with orjson per chunk.

Logprobs are deterministic pseudo values (the engine has no model): each output token is its own top
alternative, so greedy checks such as lm-evaluation-harness' hold.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from fleetgate.simengine.driver import Live
from fleetgate.simengine.structured import ToolCall
from fleetgate.simengine.textgen import WORDS, PlannedOutput, filler_words

#: Most alternatives per token an engine returns (vLLM's default ``--max-logprobs``).
MAX_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class LogprobSpec:
    """``top``: alternatives per token (chat ``top_logprobs``, completions ``logprobs``)."""

    top: int = 0


@dataclass(slots=True)
class ChoicePlan:
    """One output sequence: what it says and how it ends (decided up front)."""

    index: int
    start: int  # textgen start of the filler text
    plan: PlannedOutput
    prompt_tokens: int
    hashes: tuple[int, ...]
    pieces: tuple[str, ...] | None = None  # structured output, one piece per token (None: filler words)
    tool: ToolCall | None = None
    echo: tuple[str, ...] = ()  # the prompt's tokens, when completions ``echo`` is set
    live: Live | None = None
    sent: int = 0  # tokens streamed so far
    chars_left: int = -1  # stop string: characters of text still to send (-1: no limit)
    filler: tuple[str, ...] | None = None  # the filler words, made on first use

    @property
    def finish_reason(self) -> str:
        if self.tool is not None and self.plan.finish_reason != "length":
            return "tool_calls"
        return self.plan.finish_reason

    def token(self, i: int) -> str:
        return self.tokens()[i]

    def tokens(self) -> tuple[str, ...]:
        """Every output token's text, in order."""
        if self.pieces is not None:
            return self.pieces
        if self.filler is None:  # each filler word depends on the text before it: make them once, in order
            self.filler = filler_words(self.start, self.plan.tokens)
        return self.filler

    def text(self) -> str:
        text = "".join(self.token(i) for i in range(self.plan.tokens))
        return text[: self.plan.text_chars] if self.plan.text_chars is not None else text


def usage(choices: Sequence[ChoicePlan], prompts: Sequence[ChoicePlan], image_tokens: int) -> dict[str, Any]:
    """OpenAI ``usage``: prompt tokens counted once per prompt, completion tokens over every choice."""
    prompt = sum(c.prompt_tokens for c in prompts)
    completion = sum(c.plan.tokens for c in choices)
    details: dict[str, int] = {"cached_tokens": sum(c.live.cached for c in prompts if c.live is not None)}
    if image_tokens:
        details["image_tokens"] = image_tokens  # read by core.openai.usage_from_mapping
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": details,
    }


# -- logprobs ---------------------------------------------------------------------------------------------


def _logprob(token: str, position: int) -> float:
    return -round(0.05 + (zlib.crc32(f"{position}:{token}".encode()) % 1000) / 400, 4)


def _alternatives(token: str, position: int, top: int) -> list[tuple[str, float]]:
    """``top`` (token, logprob) pairs, best first: the token itself, then other words, each less likely."""
    lp = _logprob(token, position)
    out = [(token, lp)]
    seen = {token}
    start = zlib.crc32(token.encode())
    for k in range(len(WORDS)):  # bounded: at most every word once (WORDS repeats some)
        if len(out) >= top:
            break
        alt = WORDS[(start + 7 * k) % len(WORDS)]
        if alt not in seen:
            seen.add(alt)
            out.append((alt, round(lp - 0.5 * len(out), 4)))
    return out


def _chat_entry(token: str, position: int, top: int) -> dict[str, Any]:
    alts = _alternatives(token, position, max(top, 1))
    return {
        "token": token,
        "logprob": alts[0][1],
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in alts[:top]],
    }


def _completion_logprobs(
    tokens: Sequence[str], first: int, top: int, offset: int, echoed: int
) -> dict[str, Any]:
    """Completions ``logprobs`` for ``tokens`` at positions ``first``...; the very first echoed prompt token
    has no logprob (``None``), as in OpenAI's and vLLM's answers."""
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets = []
    for k, token in enumerate(tokens):
        pos = first + k
        offsets.append(offset)
        offset += len(token)
        if pos == 0 and echoed:
            token_lps.append(None)
            tops.append(None)
            continue
        alts = _alternatives(token, pos, max(top, 1))
        token_lps.append(alts[0][1])
        tops.append(dict(alts[:top]) if top else {})
    return {"tokens": list(tokens), "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


# -- whole responses --------------------------------------------------------------------------------------


def full_body(
    endpoint: str,
    rid: str,
    created: int,
    model: str,
    choices: Sequence[ChoicePlan],
    usage_obj: dict[str, Any],
    logprobs: LogprobSpec | None,
) -> dict[str, Any]:
    out = [(_chat_choice if endpoint == "chat" else _text_choice)(c, logprobs) for c in choices]
    return {
        "id": rid,
        "object": "chat.completion" if endpoint == "chat" else "text_completion",
        "created": created,
        "model": model,
        "choices": out,
        "usage": usage_obj,
    }


def _chat_choice(c: ChoicePlan, logprobs: LogprobSpec | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": []}
    if c.tool is not None:
        message["tool_calls"] = [
            {"id": c.tool.id, "type": "function", "function": {"name": c.tool.name, "arguments": c.text()}}
        ]
    else:
        message["content"] = c.text()
    lp = None
    if logprobs is not None:
        lp = {"content": [_chat_entry(c.token(i), i, logprobs.top) for i in range(c.plan.tokens)]}
    return {
        "index": c.index,
        "message": message,
        "logprobs": lp,
        "finish_reason": c.finish_reason,
        "stop_reason": None,
    }


def _text_choice(c: ChoicePlan, logprobs: LogprobSpec | None) -> dict[str, Any]:
    text = c.text()
    lp = None
    if logprobs is not None:
        tokens = [*c.echo, *(c.token(i) for i in range(c.plan.tokens))]
        lp = _completion_logprobs(tokens, 0, logprobs.top, 0, len(c.echo))
    return {
        "index": c.index,
        "text": "".join(c.echo) + text,
        "logprobs": lp,
        "finish_reason": c.finish_reason,
        "stop_reason": None,
    }


# -- streams ----------------------------------------------------------------------------------------------


class StreamEncoder:
    """SSE chunks of one streamed response (``data: {...}\\n\\n``)."""

    def __init__(
        self, endpoint: str, rid: str, created: int, model: str, logprobs: LogprobSpec | None
    ) -> None:
        self.chat = endpoint == "chat"
        self.logprobs = logprobs
        self.base = {
            "id": rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": created,
            "model": model,
        }
        head = orjson.dumps({"id": rid, "created": created, "model": model})[:-1]  # '{"id":..,"model":".."'
        self._head = b"data: " + head + b',"object":' + orjson.dumps(self.base["object"]) + b',"choices":[{'
        self._templates: dict[int, tuple[bytes, bytes]] = {}

    def _chunk(self, choice: dict[str, Any], **extra: Any) -> bytes:
        return b"data: " + orjson.dumps({**self.base, "choices": [choice], **extra}) + b"\n\n"

    def opening(self, c: ChoicePlan) -> bytes:
        """What a choice sends before its first token: the assistant role (chat), the start of a tool call,
        or the echoed prompt (completions)."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""}
            if c.tool is not None:
                delta = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": c.tool.id,
                            "type": "function",
                            "function": {"name": c.tool.name, "arguments": ""},
                        }
                    ],
                }
            return self._chunk({"index": c.index, "delta": delta, "logprobs": None, "finish_reason": None})
        if not c.echo:
            return b""
        lp = None
        if self.logprobs is not None:
            lp = _completion_logprobs(c.echo, 0, self.logprobs.top, 0, len(c.echo))
        return self._chunk({"index": c.index, "text": "".join(c.echo), "logprobs": lp, "finish_reason": None})

    def plain(self, c: ChoicePlan) -> tuple[bytes, bytes] | None:
        """The byte template ``(before, after)`` of ``c``'s token chunks when they carry only text (the
        fast path: ``before + orjson.dumps(text) + after``), else ``None``."""
        return self._template(c.index) if self.logprobs is None and c.tool is None else None

    def token(self, c: ChoicePlan, i: int, text: str) -> bytes:
        """The chunk carrying output token ``i`` (its text possibly cut short by a stop string)."""
        if self.logprobs is None and c.tool is None:
            pre, post = self._template(c.index)
            return pre + orjson.dumps(text) + post
        choice: dict[str, Any] = {"index": c.index}
        lp: Any = None
        if self.chat:
            if c.tool is not None:
                choice["delta"] = {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
            else:
                choice["delta"] = {"content": text}
            if self.logprobs is not None:
                lp = {"content": [_chat_entry(text, i, self.logprobs.top)]}
        else:
            choice["text"] = text
            if self.logprobs is not None:
                offset = sum(len(t) for t in c.echo) + sum(len(c.token(k)) for k in range(i))
                lp = _completion_logprobs([text], len(c.echo) + i, self.logprobs.top, offset, len(c.echo))
        choice["logprobs"] = lp
        choice["finish_reason"] = None
        return self._chunk(choice)

    def _template(self, index: int) -> tuple[bytes, bytes]:
        tpl = self._templates.get(index)
        if tpl is None:
            idx = b'"index":' + str(index).encode()
            if self.chat:
                tpl = (
                    self._head + idx + b',"delta":{"content":',
                    b'},"logprobs":null,"finish_reason":null}]}\n\n',
                )
            else:
                tpl = (self._head + idx + b',"text":', b',"logprobs":null,"finish_reason":null}]}\n\n')
            self._templates[index] = tpl
        return tpl

    def closing(self, c: ChoicePlan) -> bytes:
        choice: dict[str, Any] = (
            {"index": c.index, "delta": {}} if self.chat else {"index": c.index, "text": ""}
        )
        choice.update(logprobs=None, finish_reason=c.finish_reason, stop_reason=None)
        return self._chunk(choice)

    def usage(self, usage_obj: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps({**self.base, "choices": [], "usage": usage_obj}) + b"\n\n"
