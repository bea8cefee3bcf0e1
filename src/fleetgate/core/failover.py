"""Mid-stream failover (sans-IO): decide whether a broken stream may be continued on another replica, keep
the transcript that a continuation needs, and rewrite the continuation's events so the client sees one stream.

A stream that breaks after its first byte (reset, crash, a stall longer than the idle timeout, an end without
``[DONE]``, an in-band engine error) is continued elsewhere by asking another replica to go on with the same
answer: the original prompt plus the text already sent (``engines.continuation`` builds that request). That
is exact only for plain text, so :func:`static_refusal` and :meth:`FailoverTracker.refusal` name the cases
where the gateway ends the stream with an SSE error instead (tool calls, guided decoding, ``n > 1``,
logprobs, echo).

:class:`FailoverTracker` replaces ``core.openai.StreamTracker`` on streams that may be continued. It forwards
whole events only (a continuation must never follow half an event), records the text, the number of content
events (one per generated token, as engines stream) and the stream's ``id``/``created``/``model``; in
continuation mode it rewrites those fields into the continuation's events, drops its second ``role`` chunk
and reports usage as the client sees it: the client's prompt once and every generated token once. On the
first stream (most streams never break) it looks at each event only for what every stream needs (the end,
an error, usage, the event count) and keeps the rest, the transcript, as a log of the events' parts; the log
is read into the transcript when something asks for it (a continuation, the non-streamed answer, the
finish reason), with the same result as reading each event as it came.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetgate.core.json_codec import STDLIB_JSON, JsonCodec
from fleetgate.core.openai import Endpoint, usage_from_mapping
from fleetgate.core.sse import DONE_DATA, SSEParser
from fleetgate.core.types import Usage

#: Why a broken stream was not continued (the ``reason`` label of the refusal metric).
REFUSAL_REASONS = (
    "disabled",  # the deployment turned failover off
    "n",  # several choices (n > 1, best_of): one continuation cannot rebuild all of them
    "logprobs",  # logprobs of the text already sent cannot be reproduced by the new replica
    "echo",  # the prompt is part of the output
    "guided_decoding",  # response_format / guided_* / grammar: the grammar state is not transferable
    "prompt_shape",  # completions with token ids or several prompts: no text to extend
    "tool_calls",  # a tool call was being streamed
    "reasoning",  # reasoning content was being streamed (engines continue content, not reasoning)
    "exhausted",  # max_continuations already used
    "no_replica",  # no other routable replica
    "engine",  # the deployment's engine dialect cannot continue a chat message
)

_GUIDED_FIELDS = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    "grammar",
    "json_schema",
)

#: Every field that ``static_refusal`` reads: a chat body with none of them is plain text.
_REFUSAL_FIELDS = frozenset(
    ("n", "best_of", "logprobs", "top_logprobs", "echo", "response_format", *_GUIDED_FIELDS)
)


def static_refusal(endpoint: Endpoint, body: Mapping[str, Any]) -> str | None:
    """The reason a stream of this request can never be continued exactly, or ``None`` (plain text)."""
    if endpoint == "chat" and _REFUSAL_FIELDS.isdisjoint(body):  # the common case, in one set operation
        return None
    n = body.get("n")
    best_of = body.get("best_of")
    if (isinstance(n, int) and n > 1) or (isinstance(best_of, int) and best_of > 1):
        return "n"
    logprobs = body.get("logprobs")
    if (logprobs is not None and logprobs is not False) or body.get("top_logprobs"):
        return "logprobs"
    if body.get("echo"):
        return "echo"
    fmt = body.get("response_format")
    if isinstance(fmt, Mapping) and fmt.get("type", "text") != "text":
        return "guided_decoding"
    for name in _GUIDED_FIELDS:  # (a loop, not any(): this runs for every streamed request)
        if body.get(name) is not None:
            return "guided_decoding"
    if endpoint == "completions":
        prompt = body.get("prompt")
        single = isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str)
        if not (isinstance(prompt, str) or single):
            return "prompt_shape"
    return None


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one upstream stream of a continued request did (for the capacity ledger's real work)."""

    replica: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


class FailoverTracker:
    """A ``StreamTracker`` for streams that may be continued (same ``feed``/``usage``/``done``/``truncated``
    interface), forwarding whole events and recording what a continuation needs."""

    __slots__ = (
        "_attempt_events",
        "_base",
        "_client_prompt",
        "_codec",
        "_created",
        "_fingerprint",
        "_finish_reason",
        "_id",
        "_id_known",
        "_log",
        "_model",
        "_parser",
        "_parts",
        "_pending",
        "_produced",
        "_produced_before",
        "_read",
        "_reasoning",
        "_role_sent",
        "_text_key",
        "_tool_calls",
        "attempt_usage",
        "attempts",
        "client_usage",
        "continuing",
        "data_events",
        "done",
        "endpoint",
        "error",
        "error_raw",
        "strip_usage",
        "usage",
    )

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        strip_usage: bool = False,
        prompt_tokens: int = 0,
        client_usage: bool = False,
        codec: JsonCodec = STDLIB_JSON,
    ) -> None:
        self.endpoint = endpoint
        self._codec = codec
        self.strip_usage = strip_usage
        self.client_usage = client_usage  # the client asked for usage (stream_options.include_usage)
        self._parser = SSEParser()
        self._pending = bytearray()
        self._base = 0
        self.usage: Usage | None = None
        self.done = False
        self.error: dict[str, Any] | None = None
        self.error_raw = b""
        self.data_events = 0
        self.attempt_usage: Usage | None = None  # usage the current upstream stream reported
        self.attempts: list[Attempt] = []  # finished (broken) upstream streams, for the ledger
        self.continuing = False  # the current upstream is a continuation: rewrite its events
        self._produced_before = 0  # content events before the current continuation
        self._client_prompt = prompt_tokens  # the gateway's count; replaced by the engine's when known
        self._text_key = '"content":"' if endpoint == "chat" else '"text":"'
        # The transcript: made by the first ``_replay``, which brings it up to date with ``_log`` and runs
        # before anything reads it (most streams never need it).
        self._log: list[str | dict[str, Any]] = []  # first stream: content literals and decoded events
        self._id_known = False  # a decoded event gave the stream's id (``_id`` once the log is read)
        self._read = False  # the transcript's fields exist

    def _replay(self) -> None:
        """Read the first stream's logged events into the transcript, as ``_event`` would have as they came:
        a content literal of ``_fast``, or a decoded event (its id if none yet, its choices)."""
        if not self._read:
            self._read = True
            self._parts: list[str] = []  # the text sent to the client, in order, as JSON string literals
            self._produced = 0  # content events sent to the client: one per generated token
            self._attempt_events = 0  # content events of the current upstream stream
            self._finish_reason: str | None = None
            self._tool_calls = False
            self._reasoning = False
            self._role_sent = False
            self._id: Any = None
            self._created: Any = None
            self._model: Any = None
            self._fingerprint: Any = None
        log = self._log
        if not log:
            return
        self._log = []
        for item in log:
            if type(item) is str:
                self._parts.append(item)
                self._produced += 1
                self._attempt_events += 1
                continue
            assert isinstance(item, dict)
            if self._id is None:
                self._id, self._created, self._model = item.get("id"), item.get("created"), item.get("model")
                self._fingerprint = item.get("system_fingerprint")
            choices = item.get("choices")
            if choices:
                self._choices(choices)

    @property
    def produced(self) -> int:
        """Content events sent to the client: one per generated token."""
        self._replay()
        return self._produced

    @property
    def finish_reason(self) -> str | None:
        self._replay()
        return self._finish_reason

    # -- the stream ---------------------------------------------------------------------------------------

    @property
    def truncated(self) -> bool:
        return not self.done or self._parser.pending

    @property
    def text(self) -> str:
        """The text sent to the client so far."""
        self._replay()
        if not self._parts:
            return ""
        return "".join(self._codec.loads("[" + ",".join(self._parts) + "]"))

    def feed(self, chunk: bytes) -> bytes:
        """Consume upstream bytes; return the whole events to forward (possibly rewritten)."""
        events = self._parser.feed_fields(chunk)  # (data, end, ...) per event
        size = len(chunk)
        if events and not self._pending and events[-1][1] - self._base == size:
            # the common case: the chunk holds whole events only (engines write one or more per chunk)
            if len(events) == 1:
                kept = self._event(events[0][0], chunk, 0, size)
                self._base += size
                return chunk if kept is None else kept
            pending = chunk
        else:
            self._pending += chunk
            pending = bytes(self._pending)
        out: bytearray | None = None  # made only once an event is rewritten or dropped
        cut = 0
        base = self._base
        for data, end, _, _, _ in events:
            stop = end - base
            kept = self._event(data, pending, cut, stop)
            if kept is not None:
                if out is None:
                    out = bytearray(pending[:cut])  # the events before, as they came
                out += kept
            elif out is not None:
                out += pending[cut:stop]
            cut = stop
        if cut:
            if pending is not chunk:
                del self._pending[:cut]
            self._base += cut
        if out is not None:
            return bytes(out)
        return chunk if pending is chunk else pending[:cut]

    def _event(self, data: str, raw: bytes, start: int, stop: int) -> bytes | None:
        """Record one event (its bytes are ``raw[start:stop]``); return ``None`` to forward them as they
        are, else what to forward instead."""
        if data == DONE_DATA:  # (before ``_fast``, which never takes it)
            self.done = True
            return None
        if self._fast(data):
            return None
        try:
            obj = self._codec.loads(data)
        except ValueError:
            self.data_events += 1
            return None
        if not isinstance(obj, dict):
            self.data_events += 1
            return None
        err = obj.get("error")
        if err is not None and isinstance(err, Mapping):  # held back: the stream is treated as broken
            self.error = dict(err)
            self.error_raw = raw[start:stop]
            return b""
        continuing = self.continuing  # (``_out`` rewrites only a continuation's events: not called else)
        if not continuing:  # the transcript's part waits in the log
            log = self._log
            log.append(obj)
            if not self._id_known:
                self._id_known = obj.get("id") is not None
            if len(log) > _MAX_LOGGED:  # (a stream of decoded events: keep the log small)
                self._replay()
        elif self._id is None:
            self._id, self._created, self._model = obj.get("id"), obj.get("created"), obj.get("model")
            self._fingerprint = obj.get("system_fingerprint")
        usage = obj.get("usage")
        if usage is not None:
            usage = usage_from_mapping(usage)
            if usage is not None:
                self.attempt_usage = usage
                self.usage = self._client_usage(usage)
        choices = obj.get("choices")
        if not choices:
            if usage is not None and self.strip_usage:
                return b""
            return self._out(obj) if continuing else None
        self.data_events += 1
        if not continuing:
            return None  # a first stream passes through as it is
        return self._out(obj) if self._choices(choices) else b""

    def _choices(self, choices: Any) -> bool:
        """Record the choices of one chunk; False when the chunk must not reach the client (a continuation's
        own ``role`` chunk)."""
        keep = False
        chat = self.endpoint == "chat"
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                keep = True
                continue
            reason = choice.get("finish_reason")
            if reason is not None:
                self._finish_reason = reason
                keep = True
            piece: Any
            if chat:
                delta = choice.get("delta")
                if not isinstance(delta, dict):
                    keep = True
                    continue
                if not delta.keys() <= _PLAIN_DELTA:  # (role and content only: nothing else to look at)
                    if delta.get("tool_calls"):
                        self._tool_calls = True
                        keep = True
                    if delta.get("reasoning_content") or delta.get("reasoning"):
                        self._reasoning = True
                        keep = True
                if "role" in delta:
                    if self._role_sent and self.continuing:
                        del delta["role"]
                    else:
                        self._role_sent = True
                        keep = True
                piece = delta.get("content")
            else:
                piece = choice.get("text")
            if piece and isinstance(piece, str):
                self._parts.append(self._codec.dumps(piece).decode())
                self._produced += 1
                self._attempt_events += 1
                keep = True
        return keep

    def _fast(self, data: str) -> bool:
        """A first stream's plain content chunk, recorded without decoding it: its text stays the JSON
        string literal as the engine wrote it (decoded only if the stream breaks). False: decode it."""
        if self.continuing or not self._id_known or '"finish_reason":null' not in data:
            return False
        # Chunks holding one of these are decoded (usage, errors, tool calls, reasoning, the role chunk,
        # logprobs): one expression, no loop (this runs for every token)
        if (
            '"usage"' in data
            or '"error"' in data
            or '"tool_calls"' in data
            or '"reasoning' in data
            or '"role"' in data
            or '"logprobs":{' in data
        ):
            return False
        key = self._text_key
        start = data.find(key)
        if start < 0:
            return False
        start += len(key) - 1  # the literal's opening quote
        end = data.find('"', start + 1)
        while end > 0 and data[end - 1] == "\\" and _escaped(data, end):  # (no backslash: not escaped)
            end = data.find('"', end + 1)
        if end < 0:
            return False
        self.data_events += 1
        if end > start + 1:
            self._log.append(data[start : end + 1])
        return True

    def _out(self, obj: dict[str, Any]) -> bytes | None:
        if not self.continuing:
            return None
        obj["id"], obj["created"], obj["model"] = self._id, self._created, self._model
        if self._fingerprint is None:
            obj.pop("system_fingerprint", None)
        else:
            obj["system_fingerprint"] = self._fingerprint
        if obj.get("usage") is not None and self.usage is not None:
            obj["usage"] = usage_dict(self.usage)
        return b"data: " + self._codec.dumps(obj) + b"\n\n"

    # -- continuation ------------------------------------------------------------------------------------

    def refusal(self) -> str | None:
        """Why what was streamed so far cannot be continued exactly (``None``: it can)."""
        self._replay()
        if self._tool_calls:
            return "tool_calls"
        if self._reasoning:
            return "reasoning"
        return None

    def end_attempt(self, replica: str) -> None:
        """The current upstream stream broke: keep what it cost and get ready for a continuation's stream."""
        self._replay()
        prompt = self._client_prompt + self._produced_before
        usage = self.attempt_usage
        cached = usage.cached_tokens if usage is not None else 0
        self.attempts.append(Attempt(replica, prompt, self._attempt_events, cached))
        self._parser = SSEParser()
        self._pending.clear()
        self._base = 0
        self.done = False
        self.error = None
        self.error_raw = b""
        self._attempt_events = 0
        self.attempt_usage = None
        self._produced_before = self._produced
        self.continuing = True

    def _client_usage(self, usage: Usage) -> Usage:
        """Usage as the client sees it: the engine's prompt minus the text it was given back, and every
        generated token once (those sent before the break, one per content event, plus the new ones)."""
        if not self.continuing:
            self._client_prompt = usage.prompt_tokens
            return usage
        prompt = usage.prompt_tokens - self._produced_before
        if prompt < 1:  # an engine that counts differently: keep the gateway's own count
            prompt = self._client_prompt
        self._client_prompt = prompt
        return Usage.of(
            prompt,
            self._produced_before + usage.completion_tokens,
            min(usage.cached_tokens, prompt),
            usage.image_tokens,
        )

    def final_usage(self) -> Usage:
        """The client-visible usage, also when no engine reported one (counted from the events)."""
        if self.usage is not None:
            return self.usage
        return Usage.of(self._client_prompt, self.produced, 0, 0)

    def real_work(self, replica: str) -> list[Attempt]:
        """Every upstream stream of this request as the fleet ran it (the last one included)."""
        self._replay()
        usage = self.attempt_usage
        prompt = self._client_prompt + self._produced_before
        last = (
            Attempt(replica, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
            if usage is not None
            else Attempt(replica, prompt, self._attempt_events)
        )
        return [*self.attempts, last]

    def response_body(self) -> dict[str, Any]:
        """The non-streamed answer this stream amounts to (``failover.non_stream``: the gateway streamed a
        non-streamed request from the engine): OpenAI's ``chat.completion`` or ``text_completion``."""
        self._replay()
        choice: dict[str, Any] = {"index": 0}
        if self.endpoint == "chat":
            choice["message"] = {"role": "assistant", "content": self.text}
        else:
            choice["text"] = self.text
        choice["logprobs"] = None
        choice["finish_reason"] = self._finish_reason
        body: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion" if self.endpoint == "chat" else "text_completion",
            "created": self._created,
            "model": self._model,
            "choices": [choice],
            "usage": usage_dict(self.final_usage()),
        }
        if self._fingerprint is not None:
            body["system_fingerprint"] = self._fingerprint
        return body

    def closing_events(self, include_usage: bool) -> bytes:
        """What ends a stream whose answer was already complete (finish seen, or no tokens left) although
        its upstream broke before ``[DONE]``: a finish chunk when none was sent, usage if asked, and
        ``[DONE]``."""
        self._replay()
        out = bytearray()
        base = {
            "id": self._id,
            "object": _object(self.endpoint),
            "created": self._created,
            "model": self._model,
        }
        if self._finish_reason is None:
            self._finish_reason = "length"
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
            choice["delta" if self.endpoint == "chat" else "text"] = {} if self.endpoint == "chat" else ""
            out += b"data: " + self._codec.dumps({**base, "choices": [choice]}) + b"\n\n"
        if include_usage:
            usage = usage_dict(self.final_usage())
            out += b"data: " + self._codec.dumps({**base, "choices": [], "usage": usage}) + b"\n\n"
        out += b"data: [DONE]\n\n"
        self.done = True
        return bytes(out)


#: Decoded events the first stream's log holds before it is read into the transcript (memory stays small).
_MAX_LOGGED = 32

#: The delta keys of a plain content chunk (a delta with others is looked at for tool calls and reasoning).
_PLAIN_DELTA = frozenset(("role", "content"))


def _escaped(data: str, quote: int) -> bool:
    """Whether the quote at ``quote`` is escaped (an odd number of backslashes before it)."""
    n = 0
    i = quote - 1
    while i >= 0 and data[i] == "\\":
        n += 1
        i -= 1
    return n % 2 == 1


def usage_dict(usage: Usage) -> dict[str, Any]:
    """OpenAI ``usage`` object of ``usage``."""
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cached_tokens or usage.image_tokens:
        details: dict[str, int] = {"cached_tokens": usage.cached_tokens}
        if usage.image_tokens:
            details["image_tokens"] = usage.image_tokens
        out["prompt_tokens_details"] = details
    return out


def _object(endpoint: Endpoint) -> str:
    return "chat.completion.chunk" if endpoint == "chat" else "text_completion"
