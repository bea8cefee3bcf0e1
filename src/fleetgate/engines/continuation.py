"""The continuation request: how an engine is asked to go on with an answer another replica started.

Chat: the client's messages plus the text already sent as a final assistant message, with
``continue_final_message: true`` and ``add_generation_prompt: false``. The engine renders its chat template
for the messages before it, opens the assistant turn and appends the partial text without closing the turn,
so generation resumes where it stopped. vLLM and SGLang accept this shape; llama.cpp's ``llama-server``
accepts the same two fields (``tools/server/server-common.cpp``: ``continue_final_message``, and without it
a final assistant message is prefilled by default), which is its equivalent of rendering the template and
calling ``/v1/completions`` — done by the engine, with the engine's own template. The simulated engine
(``fleetgate engine sim``) implements it too.

Completions: the prompt with the text appended, on ``/v1/completions`` (every engine).

In both, ``max_tokens`` (and ``max_completion_tokens``, ``min_tokens``) shrink by what was produced, and the
stream always asks for usage (the gateway reports the client's usage from it). Each engine dialect
(``engines.dialects``) says whether and how its engine continues a chat message (``chat_continuation``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from fleetgate.core.openai import Endpoint

#: How an engine continues a final assistant message: the two request fields vLLM introduced.
ChatContinuation = Literal["continue_final_message"]


def continuation_body(
    body: Mapping[str, Any], endpoint: Endpoint, text: str, produced_tokens: int
) -> dict[str, Any]:
    """The request that continues ``body`` (the upstream body the first replica got) after ``text``, which
    took ``produced_tokens`` tokens. The caller checked that there are tokens left (``remaining_tokens``)."""
    out = dict(body)
    out["stream"] = True
    out["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    if endpoint == "chat":
        messages = list(body.get("messages") or ())
        out["messages"] = [*messages, {"role": "assistant", "content": text}]
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    else:
        prompt = body.get("prompt")
        out["prompt"] = (prompt if isinstance(prompt, str) else prompt[0]) + text  # type: ignore[index]
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            out[name] = max(1, value - produced_tokens)
    min_tokens = body.get("min_tokens")
    if isinstance(min_tokens, int) and not isinstance(min_tokens, bool) and min_tokens > 0:
        out["min_tokens"] = max(0, min_tokens - produced_tokens)
    return out


def remaining_tokens(body: Mapping[str, Any], produced_tokens: int) -> int | None:
    """Output tokens the request may still produce (``None``: no explicit limit)."""
    limits = [
        v
        for v in (body.get("max_tokens"), body.get("max_completion_tokens"))
        if isinstance(v, int) and not isinstance(v, bool)
    ]
    return None if not limits else min(limits) - produced_tokens
