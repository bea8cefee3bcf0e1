"""OpenAI request and usage extraction (sans-IO).

The gateway reads only what it needs from a request body (model, streaming flags, output limit, prompt text
for token counts and prefix hashes) and validates exactly those fields, naming the bad ``param`` in a 400.
Everything else is left for the engine to judge: the body is forwarded unchanged whenever possible.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from fleetgate.core.errors import InvalidRequestError
from fleetgate.core.json_codec import STDLIB_JSON, JsonCodec
from fleetgate.core.sse import DONE_DATA, SSEParser
from fleetgate.core.tokenize import PromptTokenizer, block_hashes, count_and_hash, count_tokens
from fleetgate.core.tokenizer import Tokenizer, count_and_hash_chat_ids, count_and_hash_text
from fleetgate.core.types import Priority, RequestInfo, Usage

Endpoint = Literal["chat", "completions"]

#: Fields whose value must be a boolean when present, per endpoint. ``logprobs`` differs: a boolean on chat
#: (with an integer ``top_logprobs``), the number of alternatives per token on completions (OpenAI's legacy
#: API and vLLM; lm-evaluation-harness sends ``logprobs: 1, echo: true``).
_BOOL_FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"chat": ("stream", "logprobs"), "completions": ("stream", "echo")}
)
#: Integer fields >= 0, per endpoint. The upper bound is the engine's to judge (vLLM: ``--max-logprobs``).
_COUNT_FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"chat": ("top_logprobs",), "completions": ("logprobs",)}
)


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What the gateway extracted from one OpenAI request body."""

    endpoint: Endpoint
    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    max_output_tokens: int | None
    prompt_text: str
    input_tokens: int
    image_parts: int = 0
    prefix_hashes: tuple[int, ...] = ()
    block_tokens: int = 16
    body_changed: bool = False  # ``body`` differs from the client's bytes (e.g. a cache salt was set)

    def request_info(
        self,
        request_id: str,
        *,
        tenant: str = "anonymous",
        cost_mu: float = 0.0,
        estimated_output_tokens: int = 0,
        priority: Priority = Priority.INTERACTIVE,
        session_key: str | None = None,
        arrival_s: float = 0.0,
        image_tokens: int = 0,
        bound_mu: float | None = None,
    ) -> RequestInfo:
        """The core's view of this request."""
        return RequestInfo.of(
            request_id,
            self.model,
            tenant,
            self.input_tokens,
            self.max_output_tokens,
            estimated_output_tokens,
            cost_mu,
            self.stream,
            priority,
            session_key,
            self.prefix_hashes,
            self.block_tokens,
            image_tokens,
            arrival_s,
            bound_mu,
        )


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Bounds on the shape of one request body, checked before any per-item work (OpenAI-style 400s)."""

    max_messages: int = 2048
    max_content_parts: int = 4096  # content parts of all messages together
    max_json_values: int = 300_000  # JSON values (array items, object members) in the whole body


#: A JSON string (skipped whole) or one structural character that starts a value: ``,`` ``{`` ``[``.
_JSON_STRUCTURE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[,\[{]')


def count_json_values(raw: bytes, limit: int) -> int:
    """Commas and opening brackets outside strings, stopping at ``limit + 1`` (about the number of values).

    Decoding builds one object per value in a single call that cannot be interrupted; this bound is
    checked first. Linear; bodies whose raw bytes hold few such characters skip the scan entirely.
    """
    rough = raw.count(b",") + raw.count(b"{") + raw.count(b"[")
    if rough <= limit:
        return rough
    count = 0
    for match in _JSON_STRUCTURE.finditer(raw):
        if match.end() - match.start() == 1 and raw[match.start()] != 0x22:
            count += 1
            if count > limit:
                break
    return count


def load_json_body(
    raw: bytes, limits: RequestLimits | None = None, codec: JsonCodec = STDLIB_JSON
) -> dict[str, Any]:
    """Decode a request body; anything but a JSON object is a 400 (so is one with too many values)."""
    if not raw:
        raise InvalidRequestError("The request body is empty; expected a JSON object.")
    if limits is not None and count_json_values(raw, limits.max_json_values) > limits.max_json_values:
        raise InvalidRequestError(
            f"The request body holds more than {limits.max_json_values} JSON values.", code="too_many_values"
        )
    try:
        body = codec.loads(raw)
    except ValueError as exc:
        raise InvalidRequestError(f"The request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    return body


def parse_request(
    body: Mapping[str, Any],
    endpoint: Endpoint,
    block_tokens: int = 16,
    *,
    hashes: bool = True,
    tokenizer: Tokenizer | None = None,
    prompt_tokenizer: PromptTokenizer | None = None,
    limits: RequestLimits | None = None,
    salt: bytes = b"",
) -> ParsedRequest:
    """Validate the fields the gateway relies on and extract them; raise ``InvalidRequestError`` otherwise.

    Token count and prefix block hashes (``block_tokens`` per block) come from one pass of the shared
    tokenizer approximation, so they agree with what the simulated engine caches. ``hashes=False`` skips the
    hashes (``prefix_hashes`` stays empty) for deployments whose routing policy does not read them.
    ``tokenizer``: the model's real tokenizer (``core.tokenizer``), used instead of the approximation.
    ``prompt_tokenizer`` keeps the approximation's caches (the fleet's; none: uncached), ``limits`` bound
    the message and part counts (checked before any tokenizing), ``salt`` scopes the prefix hashes (a
    tenant's own).
    """
    model = body.get("model")
    if model is None:
        raise InvalidRequestError("you must provide a model parameter", param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' must be a non-empty string", param="model")
    for name in _BOOL_FIELDS[endpoint]:
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise InvalidRequestError(f"'{name}' must be a boolean", param=name)
    for name in _COUNT_FIELDS[endpoint]:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise InvalidRequestError(f"'{name}' must be an integer >= 0", param=name)
    stream = bool(body.get("stream", False))
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, Mapping):
            raise InvalidRequestError("'stream_options' must be an object", param="stream_options")
        if not stream:
            raise InvalidRequestError(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                param="stream_options",
            )
        flag = options.get("include_usage")
        if flag is not None and not isinstance(flag, bool):
            raise InvalidRequestError(
                "'stream_options.include_usage' must be a boolean", param="stream_options.include_usage"
            )
        include_usage = bool(flag)
    max_tokens = _positive_int_or_none(body, "max_tokens")
    if endpoint == "chat":
        max_completion = _positive_int_or_none(body, "max_completion_tokens")
        if max_completion is not None:
            max_tokens = max_completion if max_tokens is None else min(max_tokens, max_completion)
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise InvalidRequestError("'n' must be an integer >= 1", param="n")
    image_parts = 0
    if endpoint == "chat":
        messages = body.get("messages")
        _check_messages(messages, limits)
        assert isinstance(messages, list)
        if tokenizer is None:
            tok = prompt_tokenizer if prompt_tokenizer is not None else _uncached()
            rendered = tok.count_and_hash_chat(messages, block_tokens, hashes=hashes, salt=salt)
        else:
            rendered = count_and_hash_chat_ids(tokenizer, messages, block_tokens, hashes=hashes, salt=salt)
        text, input_tokens, prefix = rendered
        image_parts = _count_image_parts(messages)
    else:
        text, ids = _prompt_text(body.get("prompt"))
        if ids is None and tokenizer is not None:
            input_tokens, prefix = count_and_hash_text(
                tokenizer, text, block_tokens, hashes=hashes, salt=salt
            )
        elif ids is None:
            input_tokens, prefix = _count(text, block_tokens, hashes, salt)
        else:
            input_tokens, prefix = ids, (block_hashes(text, block_tokens, salt) if hashes else ())
    return ParsedRequest(
        endpoint=endpoint,
        body=dict(body),
        model=model,
        stream=stream,
        include_usage=include_usage,
        max_output_tokens=max_tokens,
        prompt_text=text,
        input_tokens=input_tokens,
        image_parts=image_parts,
        prefix_hashes=prefix,
        block_tokens=block_tokens,
    )


def _uncached() -> PromptTokenizer:
    return PromptTokenizer(segment_cache_pieces=0, chain_cache_blocks=0)


def _count(text: str, block_tokens: int, hashes: bool, salt: bytes) -> tuple[int, tuple[int, ...]]:
    return count_and_hash(text, block_tokens, salt) if hashes else (count_tokens(text), ())


def _positive_int_or_none(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"'{name}' must be an integer", param=name)
    if value < 1:
        raise InvalidRequestError(f"'{name}' must be at least 1, got {value}", param=name)
    return value


def _check_messages(messages: Any, limits: RequestLimits | None = None) -> None:
    if messages is None:
        raise InvalidRequestError("you must provide a messages parameter", param="messages")
    if not isinstance(messages, list):
        raise InvalidRequestError("'messages' must be an array of message objects", param="messages")
    if not messages:
        raise InvalidRequestError("'messages' must contain at least one message", param="messages")
    if limits is not None:
        _check_counts(messages, limits)
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"'{where}' must be an object", param=where)
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidRequestError(f"'{where}.role' must be a non-empty string", param=f"{where}.role")
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise InvalidRequestError(
                f"'{where}.content' must be a string or an array of content parts", param=f"{where}.content"
            )
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                raise InvalidRequestError(
                    f"'{where}.content[{j}]' must be an object with a 'type'", param=f"{where}.content[{j}]"
                )
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise InvalidRequestError(
                    f"'{where}.content[{j}].text' must be a string", param=f"{where}.content[{j}].text"
                )


def _check_counts(messages: list[Any], limits: RequestLimits) -> None:
    """Message and content-part counts within ``limits`` (before any per-part work)."""
    if len(messages) > limits.max_messages:
        raise InvalidRequestError(
            f"'messages' has {len(messages)} items; at most {limits.max_messages} are allowed.",
            param="messages",
            code="too_many_messages",
        )
    parts = 0
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            parts += len(content)
    if parts > limits.max_content_parts:
        raise InvalidRequestError(
            f"The messages have {parts} content parts; at most {limits.max_content_parts} are allowed.",
            param="messages",
            code="too_many_content_parts",
        )


def _count_image_parts(messages: Sequence[Mapping[str, Any]]) -> int:
    count = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            count += sum(1 for part in content if part.get("type") in ("image_url", "input_image"))
    return count


def _prompt_text(prompt: Any) -> tuple[str, int | None]:
    """Text of a completions ``prompt`` (string, strings, token ids, or lists of ids), and its token count
    when it is given as token ids (``None``: count the text)."""
    if prompt is None:
        raise InvalidRequestError("you must provide a prompt parameter", param="prompt")
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "".join(prompt), None
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return " ".join(map(str, prompt)), len(prompt)
        if all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt):
            flat = [t for p in prompt for t in p]
            return " ".join(map(str, flat)), len(flat)
    raise InvalidRequestError(
        "'prompt' must be a string, an array of strings, or an array of token ids", param="prompt"
    )


# -- usage ------------------------------------------------------------------------------------------------


def usage_from_mapping(usage: Any) -> Usage | None:
    """OpenAI ``usage`` object -> ``Usage`` (``None`` when absent or malformed)."""
    if type(usage) is not dict and not isinstance(usage, Mapping):  # (a dict: no ABC check)
        return None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    cached = 0
    image = 0
    details = usage.get("prompt_tokens_details")
    if isinstance(details, Mapping):
        value = details.get("cached_tokens")
        cached = value if isinstance(value, int) else 0
        value = details.get("image_tokens")
        image = value if isinstance(value, int) else 0
    return Usage.of(prompt, completion, cached, image)


def usage_from_body(raw: bytes, codec: JsonCodec = STDLIB_JSON) -> Usage | None:
    """``usage`` of a non-streamed response body (``None`` when it has none or is not JSON)."""
    try:
        body = codec.loads(raw)
    except ValueError:
        return None
    return usage_from_mapping(body.get("usage")) if isinstance(body, dict) else None


class StreamTracker:
    """Watches an upstream OpenAI SSE stream on its way to the client.

    ``feed(chunk)`` returns the bytes to forward. Normally that is ``chunk`` itself (zero copy) and the
    tracker only reads: the final chunk's ``usage``, whether ``[DONE]`` arrived, an in-band ``error``, and
    how many data events passed (a fallback count of output tokens). With ``strip_usage=True`` (the
    gateway asked the engine for usage on the client's behalf) it forwards whole events only, as the raw
    bytes the engine sent, minus the usage-only chunk the client did not ask for.
    """

    __slots__ = (
        "_base",
        "_codec",
        "_parser",
        "_pending",
        "data_events",
        "done",
        "error",
        "strip_usage",
        "usage",
    )

    def __init__(self, *, strip_usage: bool = False, codec: JsonCodec = STDLIB_JSON) -> None:
        self._codec = codec
        self._parser = SSEParser()
        self.strip_usage = strip_usage
        self._pending = bytearray()
        self._base = 0  # absolute stream offset of _pending[0]
        self.usage: Usage | None = None
        self.done = False
        self.error: dict[str, Any] | None = None
        self.data_events = 0

    @property
    def truncated(self) -> bool:
        """True when the stream stopped inside an event or before ``[DONE]``."""
        return not self.done or self._parser.pending

    def feed(self, chunk: bytes) -> bytes:
        events = self._parser.feed_fields(chunk)  # (data, end, ...) per event
        if not self.strip_usage:
            for event in events:
                self._observe(event[0])
            return chunk
        self._pending += chunk
        out = bytearray()
        cut = 0
        for data, end, _, _, _ in events:
            keep = self._observe(data)
            stop = end - self._base
            if keep:
                out += self._pending[cut:stop]
            cut = stop
        if cut:
            del self._pending[:cut]
            self._base += cut
        return bytes(out)

    def _observe(self, data: str) -> bool:
        """Record what ``data`` says; return whether its event should reach the client."""
        if data == DONE_DATA:
            self.done = True
            return True
        self.data_events += 1
        if '"usage"' not in data and '"error"' not in data:
            return True
        try:
            obj = self._codec.loads(data)
        except ValueError:
            return True
        if not isinstance(obj, dict):
            return True
        err = obj.get("error")
        if isinstance(err, Mapping):
            self.error = dict(err)
        usage = usage_from_mapping(obj.get("usage"))
        if usage is None:
            return True
        self.usage = usage
        if obj.get("choices"):
            return True
        self.data_events -= 1  # the usage-only chunk carries no output
        return not self.strip_usage


def with_stream_usage(body: dict[str, Any]) -> dict[str, Any]:
    """A copy of a streaming request body that asks the engine to report usage in its last chunk."""
    options = dict(body.get("stream_options") or {})
    options["include_usage"] = True
    return {**body, "stream_options": options}
