"""SSE parser/encoder: line endings, comments, multi-line data, fields, offsets."""

from __future__ import annotations

import pytest

from fleetgate.core.sse import DONE_EVENT, SSEEvent, SSEParser, encode_comment, encode_event, parse_all


def test_basic_events_and_offsets() -> None:
    stream = b'data: {"a":1}\n\ndata: [DONE]\n\n'
    events = parse_all(stream)
    assert [e.data for e in events] == ['{"a":1}', "[DONE]"]
    assert events[0].end == len(b'data: {"a":1}\n\n')
    assert events[1].end == len(stream)


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_line_endings(eol: bytes) -> None:
    stream = b"event: delta" + eol + b"data: one" + eol + b"data: two" + eol + eol
    assert parse_all(stream) == [SSEEvent(data="one\ntwo", event="delta")]


def test_crlf_split_between_chunks() -> None:
    parser = SSEParser()
    out = parser.feed(b"data: x\r")
    out += parser.feed(b"\n\r")
    out += parser.feed(b"\n")
    assert [e.data for e in out] == ["x"]
    # the lone \n after \r must not count as a second blank line
    assert not parser.pending


def test_comments_ignored_and_empty_event_not_dispatched() -> None:
    stream = b": keep-alive\n\nevent: ping\n\n:another\ndata: hi\n\n"
    assert parse_all(stream) == [SSEEvent(data="hi")]


def test_field_without_space_and_without_colon() -> None:
    events = parse_all(b"data:nospace\ndata\n\n")
    assert events == [SSEEvent(data="nospace\n")]


def test_id_and_retry() -> None:
    events = parse_all(b"id: 7\nretry: 1500\ndata: a\n\ndata: b\n\n")
    assert events[0] == SSEEvent(data="a", id="7", retry=1500)
    assert events[1] == SSEEvent(data="b", id="7")  # last event id persists, retry does not


def test_utf8_split_inside_character_and_bom() -> None:
    raw = "\ufeffdata: héllo ☃\n\n".encode()
    parser = SSEParser()
    events = []
    for i in range(len(raw)):
        events += parser.feed(raw[i : i + 1])
    assert [e.data for e in events] == ["héllo ☃"]
    assert events[0].end == len(raw)


def test_unterminated_event_is_pending() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: partial\n") == []
    assert parser.pending


def test_encoder_round_trip() -> None:
    raw = encode_event("line1\nline2", event="update", id="3", retry=10) + encode_comment("ka") + DONE_EVENT
    assert parse_all(raw) == [
        SSEEvent(data="line1\nline2", event="update", id="3", retry=10),
        SSEEvent(data="[DONE]", id="3"),
    ]
    assert encode_event(b"x") == b"data: x\n\n"
    with pytest.raises(ValueError):
        encode_event("x", event="bad\nname")


def test_whole_event_chunks_parse_as_line_by_line() -> None:
    """Chunks of whole one-line ``data: `` events take a split-at-blank-lines way; every other shape the
    line-by-line one. Random streams cut at random places (and at event ends) give the same events, ends,
    ids, retries and pending state as the same chunks fed with their final newlines one byte at a time
    (a chunk that does not end in a blank line never takes the fast way; one holding ``\\r`` is fed as is,
    it never takes it either)."""
    import random

    pieces = [
        b'data: {"a":1}\n\n',
        b"data: [DONE]\n\n",
        b"data:\n\n",
        b"data: \n\n",
        b"data:x\n\n",
        b"data: a\ndata: b\n\n",
        b"event: e\ndata: x\n\n",
        b"id: 7\n",
        b"retry: 30\n",
        b": ping\n\n",
        b"\n",
        b"\n\n",
        b"data: caf\xc3\xa9\n\n",
        b"data: \xff\n\n",
        b"data: x\r\n\r\n",
        b"\xef\xbb\xbfdata: bom\n\n",
    ]
    rng = random.Random(16)
    fast_chunks = 0
    for _ in range(600):
        stream = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 8)))
        cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randint(0, 4))))
        if rng.random() < 0.5:  # cut at event ends, as engines write
            cuts = [i + 2 for i in range(len(stream) - 1) if stream[i : i + 2] == b"\n\n"]
        fast, slow = SSEParser(), SSEParser()
        got: list[object] = []
        want: list[object] = []
        prev = 0
        for cut in [*cuts, len(stream)]:
            chunk = stream[prev:cut]
            prev = cut
            got += fast.feed_fields(chunk)
            head = chunk if b"\r" in chunk else chunk.rstrip(b"\n")
            want += slow.feed_fields(head)
            for i in range(len(head), len(chunk)):
                want += slow.feed_fields(chunk[i : i + 1])
            fast_chunks += head != chunk and chunk.startswith(b"data: ")
        assert got == want, stream
        assert (fast.pending, fast.offset) == (slow.pending, slow.offset)
    assert fast_chunks > 100  # the fast way was taken
