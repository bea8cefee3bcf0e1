"""OpenAI request extraction/validation and usage extraction from bodies and streams."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from fleetgate.core.errors import InvalidRequestError
from fleetgate.core.openai import (
    StreamTracker,
    load_json_body,
    parse_request,
    usage_from_body,
    with_stream_usage,
)
from fleetgate.core.sse import parse_all
from fleetgate.core.tokenize import block_hashes, count_tokens, render_chat_prompt
from fleetgate.core.types import Usage


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "Hello there, how are you?"}], **extra}


def test_chat_extraction_uses_shared_tokenizer() -> None:
    body = chat(stream=True, stream_options={"include_usage": True}, max_completion_tokens=20, max_tokens=50)
    parsed = parse_request(body, "chat")
    text = render_chat_prompt(body["messages"])
    assert parsed.model == "m" and parsed.stream and parsed.include_usage
    assert parsed.max_output_tokens == 20
    assert parsed.prompt_text == text and parsed.input_tokens == count_tokens(text)
    info = parsed.request_info("r1", tenant="t", cost_mu=1.5)
    assert info.prefix_hashes == block_hashes(text, 16)
    assert (info.request_id, info.tenant, info.cost_mu, info.stream) == ("r1", "t", 1.5, True)


def test_completions_prompt_forms() -> None:
    assert parse_request({"model": "m", "prompt": "abc def"}, "completions").input_tokens == count_tokens(
        "abc def"
    )
    assert parse_request({"model": "m", "prompt": [1, 2, 3]}, "completions").input_tokens == 3
    assert parse_request({"model": "m", "prompt": [[1, 2], [3]]}, "completions").input_tokens == 3
    assert parse_request({"model": "m", "prompt": ["a", "b"]}, "completions").prompt_text == "ab"
    long = "The quick brown fox jumps over the lazy dog. " * 20
    parsed = parse_request({"model": "m", "prompt": long}, "completions", block_tokens=8)
    assert parsed.prefix_hashes == block_hashes(long, 8) and len(parsed.prefix_hashes) >= 2
    assert parsed.request_info("r").prefix_block_tokens == 8


def test_multimodal_parts_counted() -> None:
    msg = {
        "role": "user",
        "content": [{"type": "text", "text": "what"}, {"type": "image_url", "image_url": {}}],
    }
    assert parse_request({"model": "m", "messages": [msg]}, "chat").image_parts == 1


@pytest.mark.parametrize(
    ("body", "endpoint", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "chat", "model"),
        ({"model": 3, "messages": []}, "chat", "model"),
        ({"model": "m"}, "chat", "messages"),
        ({"model": "m", "messages": []}, "chat", "messages"),
        ({"model": "m", "messages": "hi"}, "chat", "messages"),
        ({"model": "m", "messages": [{"content": "x"}]}, "chat", "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "chat", "messages[0].content"),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "chat",
            "messages[0].content[0].text",
        ),
        ({**chat(), "stream": "yes"}, "chat", "stream"),
        ({**chat(), "max_tokens": 0}, "chat", "max_tokens"),
        ({**chat(), "max_tokens": 1.5}, "chat", "max_tokens"),
        ({**chat(), "max_completion_tokens": "9"}, "chat", "max_completion_tokens"),
        ({**chat(), "stream_options": {"include_usage": True}}, "chat", "stream_options"),
        (
            {**chat(), "stream": True, "stream_options": {"include_usage": 1}},
            "chat",
            "stream_options.include_usage",
        ),
        ({**chat(), "n": 0}, "chat", "n"),
        ({"model": "m"}, "completions", "prompt"),
        ({"model": "m", "prompt": {"a": 1}}, "completions", "prompt"),
    ],
)
def test_invalid_fields_name_the_param(body: dict[str, Any], endpoint: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_request(body, endpoint)
    assert info.value.param == param
    assert info.value.status == 400


@pytest.mark.parametrize("raw", [b"", b"{", b"[1,2]", b'"x"', b"\xff\xfe"])
def test_bad_json_bodies(raw: bytes) -> None:
    with pytest.raises(InvalidRequestError):
        load_json_body(raw)


def test_usage_from_body() -> None:
    body = {
        "usage": {"prompt_tokens": 10, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 8}}
    }
    assert usage_from_body(orjson.dumps(body)) == Usage(10, 4, 8)
    assert usage_from_body(b'{"usage": null}') is None
    assert usage_from_body(b"not json") is None


def _stream(include_usage_chunk: bool) -> bytes:
    parts = [
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n',
        b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n',
    ]
    if include_usage_chunk:
        parts.append(b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n')
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def test_stream_tracker_passthrough_is_zero_copy() -> None:
    stream = _stream(True)
    tracker = StreamTracker()
    out = []
    for i in range(0, len(stream), 7):
        chunk = stream[i : i + 7]
        forwarded = tracker.feed(chunk)
        assert forwarded is chunk
        out.append(forwarded)
    assert b"".join(out) == stream
    assert tracker.usage == Usage(5, 2) and tracker.done and not tracker.truncated
    assert tracker.data_events == 2


def test_stream_tracker_strips_injected_usage_chunk() -> None:
    stream = _stream(True)
    tracker = StreamTracker(strip_usage=True)
    out = b"".join(tracker.feed(stream[i : i + 5]) for i in range(0, len(stream), 5))
    assert out == _stream(False)
    assert tracker.usage == Usage(5, 2) and tracker.done


def test_stream_tracker_truncation_and_error() -> None:
    tracker = StreamTracker()
    tracker.feed(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"error": {"message": "boom"}}\n\n')
    assert tracker.truncated and tracker.error == {"message": "boom"}
    assert [e.data for e in parse_all(b"data: [DONE]\n\n")] == ["[DONE]"]


def test_with_stream_usage_copies() -> None:
    body = {"model": "m", "stream": True}
    out = with_stream_usage(body)
    assert out["stream_options"] == {"include_usage": True} and "stream_options" not in body
