"""Property: an SSE byte stream split anywhere parses to the same events (and encode/parse round-trips)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgate.core.sse import SSEParser, encode_event, parse_all

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
_line_text = _text.map(lambda s: s.replace("\r", "").replace("\n", ""))


@st.composite
def sse_streams(draw: st.DrawFn) -> bytes:
    eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    lines: list[str] = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["data", "data", "event", "id", "retry", "comment", "blank", "junk"]))
        value = draw(_line_text)
        if kind == "comment":
            lines.append(":" + value)
        elif kind == "blank":
            lines.append("")
        elif kind == "retry":
            lines.append(f"retry: {draw(st.integers(0, 10_000))}")
        elif kind == "junk":
            lines.append(value)
        else:
            lines.append(f"{kind}:{draw(st.sampled_from(['', ' ']))}{value}")
        if draw(st.booleans()):
            lines.append("")
    return eol.join(lines).encode() + draw(st.sampled_from([b"", eol.encode(), (eol * 2).encode()]))


@settings(max_examples=300, deadline=None)
@given(stream=sse_streams(), data=st.data())
def test_split_anywhere_gives_same_events(stream: bytes, data: st.DataObject) -> None:
    whole = parse_all(stream)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    parser = SSEParser()
    pieces = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        pieces += parser.feed(stream[prev:cut])
        prev = cut
    assert pieces == whole
    if b"\r" not in stream:  # offsets are exact whenever line ends are unambiguous
        assert [e.end for e in pieces] == [e.end for e in whole]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_text, st.sampled_from([None, "message", "delta"])), max_size=6))
def test_encode_then_parse_round_trips(items: list[tuple[str, str | None]]) -> None:
    raw = b"".join(encode_event(d, event=e) for d, e in items)
    events = parse_all(raw)
    expected = [(d.replace("\r\n", "\n").replace("\r", "\n"), e or "message") for d, e in items]
    assert [(ev.data, ev.event) for ev in events] == expected
