"""Mid-stream failover pieces without sockets: the simulated engine's continuable text, the continuation
request, the refusal contract and the tracker that splices a continuation into the client's stream."""

from __future__ import annotations

import random

import orjson
import pytest

from fleetgate.core.failover import FailoverTracker, static_refusal
from fleetgate.core.json_codec import STDLIB_JSON, JsonCodec
from fleetgate.core.sse import DONE_DATA, parse_all
from fleetgate.core.tokenize import count_tokens, render_chat_prompt
from fleetgate.core.types import Usage
from fleetgate.engines.continuation import continuation_body, remaining_tokens
from fleetgate.engines.dialects import dialect
from fleetgate.orjson_codec import ORJSON
from fleetgate.simengine.textgen import continuation_prompt, start_index, tokens_text

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about rivers."}]


def test_sim_text_continues_exactly_from_any_prefix() -> None:
    prompt = "Once upon a time"
    whole = tokens_text(start_index(prompt), 0, 120)
    words = [" " + w for w in whole.split(" ")[1:]]
    assert len(words) == 120 and count_tokens(whole) == 120
    for k in (0, 1, 37, 119):
        head = "".join(words[:k])
        # completions: the prompt with the text so far appended
        assert tokens_text(start_index(prompt + head), 0, 120 - k) == "".join(words[k:])
        assert tokens_text(start_index(prompt), k, 120 - k) == "".join(words[k:])
    # chat: continue_final_message renders the messages, the assistant header, then the partial answer
    chat_start = start_index(render_chat_prompt(MESSAGES))
    chat = tokens_text(chat_start, 0, 50)
    head = chat[: chat.index(" ", 20)]
    body = {
        "messages": [*MESSAGES, {"role": "assistant", "content": head}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    rendered = continuation_prompt(body)
    assert rendered == render_chat_prompt(MESSAGES) + head
    assert head + tokens_text(start_index(rendered), 0, 50 - count_tokens(head)) == chat
    assert count_tokens(rendered) == count_tokens(render_chat_prompt(MESSAGES)) + count_tokens(head)


def test_continuation_request_shapes() -> None:
    chat = {
        "model": "m",
        "messages": MESSAGES,
        "max_tokens": 100,
        "max_completion_tokens": 90,
        "stream": True,
    }
    out = continuation_body(chat, "chat", " the river", 2)
    assert out["messages"][-1] == {"role": "assistant", "content": " the river"}
    assert out["messages"][:-1] == MESSAGES and chat["messages"] == MESSAGES  # the original is untouched
    assert out["continue_final_message"] is True and out["add_generation_prompt"] is False
    assert out["max_tokens"] == 98 and out["max_completion_tokens"] == 88
    assert out["stream_options"] == {"include_usage": True}
    assert remaining_tokens(chat, 2) == 88 and remaining_tokens({"messages": []}, 5) is None
    comp = {"model": "m", "prompt": ["Hello"], "max_tokens": 10, "min_tokens": 4}
    out = continuation_body(comp, "completions", " world", 3)
    assert out["prompt"] == "Hello world" and out["max_tokens"] == 7 and out["min_tokens"] == 1
    assert out["stream"] is True
    for engine in ("vllm", "sglang", "llamacpp", "sim", None):
        assert dialect(engine).continuation_body(chat, "chat", "x", 1) is not None


@pytest.mark.parametrize(
    ("endpoint", "extra", "reason"),
    [
        ("chat", {}, None),
        ("chat", {"n": 1, "logprobs": False, "response_format": {"type": "text"}}, None),
        ("chat", {"n": 2}, "n"),
        ("chat", {"logprobs": True}, "logprobs"),
        ("chat", {"top_logprobs": 3}, "logprobs"),
        ("chat", {"response_format": {"type": "json_object"}}, "guided_decoding"),
        ("chat", {"guided_regex": "a+"}, "guided_decoding"),
        ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}]}, None),  # decided on the stream
        ("completions", {"prompt": "hi"}, None),
        ("completions", {"prompt": "hi", "echo": True}, "echo"),
        ("completions", {"prompt": "hi", "logprobs": 2}, "logprobs"),
        ("completions", {"prompt": "hi", "best_of": 3}, "n"),
        ("completions", {"prompt": [1, 2, 3]}, "prompt_shape"),
        ("completions", {"prompt": ["a", "b"]}, "prompt_shape"),
    ],
)
def test_refusal_contract(endpoint: str, extra: dict[str, object], reason: str | None) -> None:
    body = {"model": "m", "messages": MESSAGES, **extra} if endpoint == "chat" else {"model": "m", **extra}
    assert static_refusal(endpoint, body) == reason  # type: ignore[arg-type]


def _chunk(rid: str, created: int, delta: dict[str, object], finish: str | None = None) -> bytes:
    obj = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _usage(rid: str, created: int, prompt: int, completion: int) -> bytes:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    obj = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": "m", "choices": []}
    return b"data: " + orjson.dumps({**obj, "usage": usage}) + b"\n\n"


def _split(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), 12))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


#: The tracker gives the same stream with either codec (core's default; the one the gateway passes).
CODECS = pytest.mark.parametrize("codec", [STDLIB_JSON, ORJSON], ids=["stdlib", "orjson"])


@CODECS
@pytest.mark.parametrize("seed", range(5))
def test_tracker_splices_a_continuation_into_one_stream(seed: int, codec: JsonCodec) -> None:
    rng = random.Random(seed)
    words = [" w" + str(i) for i in range(10)]
    # the first replica: role chunk, 4 words, then half of the fifth event, and the connection breaks
    first = _chunk("a", 1, {"role": "assistant", "content": ""})
    first += b"".join(_chunk("a", 1, {"content": w}) for w in words[:4])
    broken = _chunk("a", 1, {"content": words[4]})
    tracker = FailoverTracker("chat", strip_usage=False, prompt_tokens=20, client_usage=True, codec=codec)
    sent = b"".join(tracker.feed(part) for part in _split(first + broken[:15], rng))
    assert sent == first  # whole events only: the half event never reaches the client
    assert tracker.truncated and tracker.produced == 4 and tracker.text == "".join(words[:4])
    tracker.end_attempt("r0")
    # the second replica continues: its own id and created, its own role chunk, 6 more words and usage
    second = _chunk("b", 2, {"role": "assistant", "content": ""})
    second += b"".join(_chunk("b", 2, {"content": w}) for w in words[4:])
    second += _chunk("b", 2, {}, "length") + _usage("b", 2, 20 + 4, 6) + b"data: [DONE]\n\n"
    sent += b"".join(tracker.feed(part) for part in _split(second, rng))
    assert not tracker.truncated
    events = parse_all(sent)
    assert events[-1].data == DONE_DATA and sum(e.data == DONE_DATA for e in events) == 1
    objs = [orjson.loads(e.data) for e in events[:-1]]
    assert {(o["id"], o["created"], o["model"]) for o in objs} == {("a", 1, "m")}
    deltas = [c["delta"] for o in objs for c in o["choices"]]
    assert sum("role" in d for d in deltas) == 1
    assert "".join(d.get("content") or "" for d in deltas) == "".join(words)
    assert objs[-1]["usage"] == {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}
    assert tracker.final_usage() == Usage(prompt_tokens=20, completion_tokens=10)
    # the fleet's real work: 20 + 4 on the first replica, 24 + 6 on the second (re-prefill included)
    work = tracker.real_work("r1")
    assert [(a.replica, a.prompt_tokens, a.completion_tokens) for a in work] == [("r0", 20, 4), ("r1", 24, 6)]


def test_tracker_finishes_a_complete_answer_whose_end_was_lost() -> None:
    tracker = FailoverTracker("chat", prompt_tokens=7, client_usage=True)
    out = tracker.feed(_chunk("a", 1, {"role": "assistant", "content": " hi"}) + _chunk("a", 1, {}, "stop"))
    assert tracker.finish_reason == "stop" and tracker.truncated
    out += tracker.closing_events(include_usage=True)
    events = parse_all(out)
    assert events[-1].data == DONE_DATA
    assert orjson.loads(events[-2].data)["usage"]["completion_tokens"] == 1
    assert sum('"finish_reason":"stop"' in e.data for e in events) == 1


def test_tracker_sees_tool_calls_and_holds_back_in_band_errors() -> None:
    tracker = FailoverTracker("chat")
    tool = {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "{"}}]}
    tracker.feed(_chunk("a", 1, tool))
    assert tracker.refusal() == "tool_calls"
    err = b'data: {"error": {"message": "engine died", "type": "server_error"}}\n\n'
    assert tracker.feed(err) == b"" and tracker.error is not None and tracker.error_raw == err


@CODECS
def test_tracker_keeps_escaped_and_unicode_text_exactly(codec: JsonCodec) -> None:
    """Plain chunks are recorded as the engine's JSON string literals (decoded only on a break): quotes,
    backslashes, unicode and engines that put spaces in their JSON all come back as the text sent."""
    pieces = [' say "hi"', " back\\slash", ' \\\\"', " caf\u00e9 \u4e2d", "\n", " end\\"]
    tracker = FailoverTracker("chat", codec=codec)
    raw = _chunk("a", 1, {"role": "assistant", "content": ""})
    raw += b"".join(_chunk("a", 1, {"content": p}) for p in pieces)
    spaced = (
        b'data: {"id": "a", "choices": [{"index": 0, "delta": {"content": " spaced"}, '
        b'"finish_reason": null}]}\n\n'
    )
    assert tracker.feed(raw) == raw and tracker.feed(spaced) == spaced
    assert tracker.text == "".join(pieces) + " spaced"
    assert tracker.produced == len(pieces) + 1
    comp = FailoverTracker("completions", codec=codec)
    obj = {"id": "c", "object": "text_completion", "created": 1, "model": "m"}
    for text in (" one", ' "two"'):
        event = {**obj, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]}
        comp.feed(b"data: " + orjson.dumps(event) + b"\n\n")
    assert comp.text == ' one "two"' and comp.produced == 2


def test_continuation_chunks_are_rewritten_even_when_whole_and_the_same_size() -> None:
    tracker = FailoverTracker("chat")
    tracker.feed(_chunk("a", 1, {"role": "assistant", "content": ""}) + _chunk("a", 1, {"content": " x"}))
    tracker.end_attempt("r0")
    whole = _chunk("b", 2, {"content": " y"}) + _chunk("b", 2, {"content": " z"})
    out = tracker.feed(whole)
    assert {orjson.loads(e.data)["id"] for e in parse_all(out)} == {"a"}
    assert tracker.feed(_chunk("b", 2, {"content": " w"})).count(b'"id":"a"') == 1


def _random_event(rng: random.Random, endpoint: str) -> bytes:
    """One SSE event of the kinds a stream may carry (plain content, role, finish, usage, tool calls,
    reasoning, logprobs, an error, odd JSON)."""
    word = rng.choice(["hi", " there", ' "q"', " back\\\\slash", " é", ""])
    kind = rng.random()
    head: dict[str, object] = {"object": "chunk", "created": 7, "model": "m"}
    if rng.random() < 0.9:
        head["id"] = rng.choice(["c1", "c2"])
    if kind < 0.05:
        return b"data: [DONE]\n\n"
    if kind < 0.08:
        return b"data: not json\n\n"
    if kind < 0.1:
        return b"data: [1, 2]\n\n"
    if kind < 0.12:
        return b'data: {"error": {"message": "boom"}}\n\n'
    if kind < 0.18:
        return b"data: " + orjson.dumps({**head, "choices": [], "usage": {"prompt_tokens": 5,
                                         "completion_tokens": 3}}) + b"\n\n"  # fmt: skip
    if endpoint == "completions":
        choice: dict[str, object] = {"index": 0, "text": word, "finish_reason": None}
    else:
        delta: dict[str, object] = {"content": word}
        if kind < 0.3:
            delta["role"] = "assistant"
        elif kind < 0.34:
            delta["tool_calls"] = [{"index": 0, "function": {"arguments": "{"}}]
        elif kind < 0.38:
            delta["reasoning_content"] = "hmm"
        choice = {"index": 0, "delta": delta, "finish_reason": None}
    if kind > 0.95:
        choice["finish_reason"] = "stop"
    if 0.9 < kind <= 0.92:
        choice["logprobs"] = {"content": []}
    return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_transcript_read_late_equals_read_at_every_event(endpoint: str) -> None:
    """A first stream's transcript is read only when asked for; asked at any moment (here: never until
    the end, or after every chunk) it is the same, through breaks and continuations."""
    rng = random.Random(20)
    for _ in range(300):
        events = [_random_event(rng, endpoint) for _ in range(rng.randint(1, 40))]
        stream = b"".join(events)
        cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randint(0, 6))))
        late = FailoverTracker(endpoint, strip_usage=rng.random() < 0.5, codec=ORJSON)  # type: ignore[arg-type]
        eager = FailoverTracker(endpoint, strip_usage=late.strip_usage, codec=ORJSON)  # type: ignore[arg-type]
        break_at = rng.choice([None, len(cuts) // 2])
        prev = 0
        for i, cut in enumerate([*cuts, len(stream)]):
            chunk = stream[prev:cut]
            prev = cut
            assert late.feed(chunk) == eager.feed(chunk)
            _ = eager.finish_reason, eager.produced  # read after every chunk
            assert (late.done, late.error, late.usage, late.data_events, late.truncated) == (
                eager.done, eager.error, eager.usage, eager.data_events, eager.truncated
            )  # fmt: skip
            if i == break_at and eager.refusal() is None:
                assert late.refusal() is None
                late.end_attempt("a")
                eager.end_attempt("a")
        assert (late.text, late.produced, late.finish_reason, late.refusal()) == (
            eager.text, eager.produced, eager.finish_reason, eager.refusal()
        )  # fmt: skip
        assert late.final_usage() == eager.final_usage() and late.real_work("b") == eager.real_work("b")
        assert late.response_body() == eager.response_body()
        if break_at is None:  # the stream's id: the first decoded event's that has one
            ids = [_event_id(e) for e in events]
            assert late.response_body()["id"] == next((i for i in ids if i is not None), None)
        assert late.closing_events(True) == eager.closing_events(True)


def _event_id(event: bytes) -> object:
    try:
        obj = orjson.loads(event[6:])
    except orjson.JSONDecodeError:
        return None
    return obj.get("id") if isinstance(obj, dict) and not isinstance(obj.get("error"), dict) else None
