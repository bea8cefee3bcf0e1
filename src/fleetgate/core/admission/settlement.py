"""What a request can have cost: the engine's reported usage cut to what the request could produce.

Settlement trusts the engine's token counts only within bounds the gateway knows independently: output no
longer than the request's ``max_tokens``, the deployment's context length, and (for a stream) what was
actually streamed; prompts no longer than the context; no count below zero. Each cut is an *anomaly*,
named so the gateway can count it: an engine that reports a billion tokens, or minus five, is broken or
hostile, and the tenant must not pay for it (nor get credit).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fleetgate.core.types import RequestInfo, Usage

STREAM_TOKENS_PER_EVENT = 16
"""Most output tokens one SSE event may carry (engines send one per event; speculative decoding or a
``stream_interval`` a few)."""


@dataclass(frozen=True, slots=True)
class BoundedUsage:
    usage: Usage
    anomalies: tuple[str, ...]  # negative, output_over_bound, prompt_over_context, parts_over_prompt


def output_limit(max_output_tokens: int | None, context_tokens: int | None) -> int | None:
    """Most output tokens a request can produce: its ``max_tokens`` and the context length, when known.

    (The gateway's own prompt count is an estimate, so the context is not reduced by it.)
    """
    if max_output_tokens is None:
        return context_tokens
    if context_tokens is None or max_output_tokens <= context_tokens:
        return max_output_tokens
    return context_tokens


def output_bound(request: RequestInfo, context_tokens: int | None) -> int | None:
    """``output_limit`` of ``request``."""
    return output_limit(request.max_output_tokens, context_tokens)


def bound_usage(
    usage: Usage,
    request: RequestInfo,
    *,
    context_tokens: int | None = None,
    streamed_events: int | None = None,
) -> BoundedUsage:
    """``usage`` cut to what ``request`` could have produced (see the module docstring).

    ``streamed_events``: output events relayed to the client, for a stream (``None`` or 0: not a stream,
    or an engine that answered it with one body).
    """
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    cached, image = usage.cached_tokens, usage.image_tokens
    limit = output_bound(request, context_tokens)
    if streamed_events:
        streamed = streamed_events * STREAM_TOKENS_PER_EVENT
        limit = streamed if limit is None else min(limit, streamed)
    if (  # the common case, checked without building anything: every count within its bound
        prompt >= 0
        and completion >= 0
        and 0 <= cached <= prompt
        and 0 <= image <= prompt
        and (limit is None or completion <= limit)
        and (context_tokens is None or prompt <= context_tokens)
    ):
        return BoundedUsage(usage, ())
    anomalies: list[str] = []
    fields = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
        "image_tokens": usage.image_tokens,
    }
    if any(v < 0 for v in fields.values()):
        anomalies.append("negative")
        fields = {k: max(0, v) for k, v in fields.items()}
    if limit is not None and fields["completion_tokens"] > limit:
        anomalies.append("output_over_bound")
        fields["completion_tokens"] = limit
    if context_tokens is not None and fields["prompt_tokens"] > context_tokens:
        anomalies.append("prompt_over_context")
        fields["prompt_tokens"] = context_tokens
    if max(fields["cached_tokens"], fields["image_tokens"]) > fields["prompt_tokens"]:
        anomalies.append("parts_over_prompt")  # cached or image tokens are parts of the prompt
        fields["cached_tokens"] = min(fields["cached_tokens"], fields["prompt_tokens"])
        fields["image_tokens"] = min(fields["image_tokens"], fields["prompt_tokens"])
    if not anomalies:
        return BoundedUsage(usage, ())
    return BoundedUsage(replace(usage, **fields), tuple(anomalies))
