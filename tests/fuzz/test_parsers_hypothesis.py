"""Hypothesis fuzzing of the input parsers: OpenAI request extraction, the SSE parser and stream tracker,
and the image decoder. Hostile input may only ever raise the module's own client error (a 400), never an
arbitrary exception (which the gateway would turn into a 500).

CI: 300 cases each; ``FLEETGATE_PARSER_FUZZ_EXAMPLES`` sets the count (see docs/reliability.md)."""

from __future__ import annotations

import io
import json
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from fleetgate.core.errors import InvalidRequestError
from fleetgate.core.openai import StreamTracker, load_json_body, parse_request, usage_from_body
from fleetgate.core.sse import SSEParser, parse_all
from fleetgate.multimodal.image import ImageError, ImageSpec, decode_base64, process_image
from fleetgate.multimodal.pipeline import split_data_url

N = int(os.environ.get("FLEETGATE_PARSER_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck))

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=20)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
part = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["text", "image_url", "input_audio", "x"]),
            "text": json_value,
            "image_url": json_value,
        }
    ),
    json_value,
)
message = st.one_of(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "system", "assistant", "tool", "", "x"]) | json_value,
            "content": st.one_of(st.text(max_size=40), st.lists(part, max_size=3), json_value),
        }
    ),
    json_value,
)
request_body = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.text(max_size=10), json_value),
        "messages": st.one_of(st.lists(message, max_size=4), json_value),
        "prompt": st.one_of(
            st.text(max_size=40),
            st.lists(st.integers(-5, 2**40), max_size=5),
            st.lists(st.text(), max_size=3),
            json_value,
        ),
        "stream": st.one_of(st.booleans(), json_value),
        "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": json_value}), json_value),
        "max_tokens": st.one_of(st.integers(-5, 2**70), json_value),
        "max_completion_tokens": st.one_of(st.integers(-5, 2**40), json_value),
        "n": json_value,
        "echo": json_value,
        "logprobs": json_value,
        "user": json_value,
    },
)


@FUZZ
@given(body=request_body, endpoint=st.sampled_from(["chat", "completions"]))
def test_parse_request_only_raises_invalid_request(body: dict[str, Any], endpoint: Any) -> None:
    try:
        parsed = parse_request(body, endpoint)
    except InvalidRequestError as exc:
        assert exc.status == 400
        return
    assert parsed.input_tokens >= 0
    assert parsed.model == body["model"]
    parsed.request_info("r")  # the core's view can always be built from what was accepted


@FUZZ
@given(raw=st.one_of(st.binary(max_size=200), request_body.map(lambda b: json.dumps(b).encode())))
def test_load_json_body_only_raises_invalid_request(raw: bytes) -> None:
    try:
        body = load_json_body(raw)
    except InvalidRequestError as exc:
        assert exc.status == 400
        return
    assert isinstance(body, dict)
    usage_from_body(raw)  # never raises on any body either


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, last = [], 0
    for p in points:
        out.append(data[last:p])
        last = p
    out.append(data[last:])
    return out


sse_bytes = st.one_of(
    st.binary(max_size=300),
    st.lists(
        st.sampled_from(
            [
                b"data: ",
                b"data:",
                b"event: x",
                b"id: 1",
                b"retry: 5",
                b": c",
                b"\n",
                b"\r\n",
                b"\r",
                b'{"a":1}',
                b"[DONE]",
                b'{"usage":{"completion_tokens":3}}',
                b'{"error":{}}',
                b"\x00",
                b"\xff",
                b'data: {"choices":[{"delta":{"content":"x"}}]}',
            ]
        ),
        max_size=40,
    ).map(b"".join),
)


@FUZZ
@given(data=sse_bytes, cuts=st.lists(st.integers(0, 400), max_size=8))
def test_sse_parser_total_and_split_invariant(data: bytes, cuts: list[int]) -> None:
    """Never raises; the events do not depend on how the bytes were cut into chunks."""
    whole = parse_all(data)
    parser = SSEParser()
    events = []
    for chunk in _split(data, cuts):
        events.extend(parser.feed(chunk))
    assert [(e.event, e.data) for e in events] == [(e.event, e.data) for e in whole]


@FUZZ
@given(data=sse_bytes, cuts=st.lists(st.integers(0, 400), max_size=8), strip=st.booleans())
def test_stream_tracker_never_raises_and_loses_nothing(data: bytes, cuts: list[int], strip: bool) -> None:
    tracker = StreamTracker(strip_usage=strip)
    out = b"".join(tracker.feed(chunk) for chunk in _split(data, cuts))
    if not strip:
        assert out == data  # relayed byte for byte
    tracker.truncated  # noqa: B018 - a property that must not raise


SPEC = ImageSpec(max_edge=32, max_pixels=1_000_000, max_bytes=200_000)


def _image(fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (1, 2, 3)).save(buf, fmt)
    return buf.getvalue()


SEEDS = [_image(f) for f in ("PNG", "JPEG", "GIF", "BMP", "WEBP")]


@FUZZ
@given(
    seed=st.sampled_from(SEEDS),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
    cut=st.integers(0, 10_000),
)
def test_image_decoder_only_raises_image_error(seed: bytes, flips: list[tuple[int, int]], cut: int) -> None:
    raw = bytearray(seed)
    for pos, value in flips:
        raw[pos % len(raw)] = value
    data = bytes(raw[: max(1, cut % (len(raw) + 1))])
    try:
        result = process_image(data, SPEC)
    except ImageError:
        return
    assert max(result.width, result.height) <= SPEC.max_edge


@FUZZ
@given(text=st.one_of(st.text(max_size=60), st.binary(max_size=60)))
def test_base64_and_data_url_only_raise_image_error(text: str | bytes) -> None:
    try:
        decode_base64(text, 1000)
    except ImageError:
        pass
    if isinstance(text, str):
        for url in (text, "data:" + text, "data:image/png;base64," + text):
            try:
                split_data_url(url)
            except ImageError:
                pass
