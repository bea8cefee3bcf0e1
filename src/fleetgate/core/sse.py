"""Incremental Server-Sent Events parser and encoder (sans-IO, WHATWG event-stream rules).

Feed the parser bytes exactly as they come off the socket, split anywhere (even inside a ``\\r\\n`` or a
multi-byte UTF-8 character): it returns each event once its terminating blank line has arrived. Every event
carries ``end``, the absolute byte offset in the stream just past the line that dispatched it, so a proxy can
forward the *raw* bytes of whole events without re-encoding them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_EOL = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"
DONE_DATA = "[DONE]"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event. ``end`` (not part of equality) is where its raw bytes end in the stream."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None
    end: int = field(default=0, compare=False)


#: One completed event as ``SSEParser.feed_fields`` returns it: (data, end, event, id, retry).
EventFields = tuple[str, int, str, str | None, int | None]


class SSEParser:
    """Incremental parser: ``feed(chunk) -> [SSEEvent, ...]``.

    Handles ``\\n``, ``\\r\\n`` and lone ``\\r`` line ends, comments (``:`` lines), multi-line ``data``,
    ``event``/``id``/``retry`` fields and a leading UTF-8 BOM. An event without data is not dispatched (as in
    browsers); an unterminated event at end of stream is discarded (``pending`` tells whether one exists).
    """

    __slots__ = ("_bom_checked", "_buf", "_buf_start", "_data", "_event", "_last_id", "_retry", "_skip_lf")

    def __init__(self) -> None:
        self._buf = b""
        self._buf_start = 0  # absolute stream offset of _buf[0]
        self._skip_lf = False  # the previous chunk ended in "\r": a leading "\n" belongs to it
        self._bom_checked = False
        self._data: list[str] = []
        self._event = ""
        self._last_id: str | None = None
        self._retry: int | None = None

    @property
    def pending(self) -> bool:
        """Whether bytes of an unfinished event are buffered (a stream ending now would be truncated)."""
        return bool(self._buf) or bool(self._data) or bool(self._event)

    @property
    def offset(self) -> int:
        """Absolute stream offset up to which every byte has been consumed into a complete line."""
        return self._buf_start

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume ``chunk`` and return the events it completed, in order."""
        return [
            SSEEvent(data=data, event=event, id=id_, retry=retry, end=end)
            for data, end, event, id_, retry in self.feed_fields(chunk)
        ]

    def feed_fields(self, chunk: bytes) -> list[EventFields]:
        """``feed`` without the ``SSEEvent`` objects: ``(data, end, event, id, retry)`` per completed event
        (the stream trackers' hot path, which reads only ``data`` and ``end``; a tuple builds much faster)."""
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
                self._buf_start += 1
                if not chunk:
                    return []
        if (
            chunk[-2:] == b"\n\n"
            and chunk[:6] == b"data: "  # (so the stream has no BOM)
            and not self._buf
            and not self._data
            and not self._event
            and self._retry is None
            and 0x0D not in chunk
        ):
            # The common case of a relay (engines write whole events of one ``data: `` line each): split
            # at the blank lines; anything else in the chunk takes the line-by-line way below.
            breaks = chunk.count(b"\n")
            if breaks == 2:  # one event (the most common chunk of all)
                off = self._buf_start + len(chunk)
                self._buf_start = off
                self._bom_checked = True
                return [(chunk[6:-2].decode("utf-8", "replace"), off, "message", self._last_id, None)]
            blocks = chunk.split(b"\n\n")
            n = len(blocks) - 1
            if (
                not blocks.pop()
                and breaks == 2 * n  # no line breaks inside the events
                and chunk.count(b"\n\ndata: ") == n - 1  # every event a data line
            ):
                off = self._buf_start
                last_id = self._last_id
                events: list[EventFields] = []
                for block in blocks:
                    off += len(block) + 2
                    events.append((block[6:].decode("utf-8", "replace"), off, "message", last_id, None))
                self._buf_start = off
                self._bom_checked = True
                return events
        buf = self._buf + chunk if self._buf else chunk
        base = self._buf_start
        if not self._bom_checked:
            if len(buf) < len(_BOM) and _BOM.startswith(buf):
                self._buf = buf
                return []
            self._bom_checked = True
            if buf.startswith(_BOM):
                buf = buf[len(_BOM) :]
                base += len(_BOM)
        events = []
        if 0x0D not in buf:  # the common case: "\n" line ends only, split at C speed
            lines = buf.split(b"\n")
            rest = lines.pop()
            off = base
            data = self._data
            for line in lines:
                off += len(line) + 1
                if line[:5] == b"data:":
                    data.append((line[6:] if line[5:6] == b" " else line[5:]).decode("utf-8", "replace"))
                elif line:
                    self._field(line)
                elif data:
                    events.append(self._dispatch(off))
                    data = self._data
                else:
                    self._event = ""
            self._buf = rest
            self._buf_start = off
            return events
        pos = 0
        size = len(buf)
        for match in _EOL.finditer(buf):
            line = buf[pos : match.start()]
            pos = match.end()
            if pos == size and buf[pos - 1] == 0x0D:
                self._skip_lf = True
            if line:
                self._field(line)
            elif self._data:
                events.append(self._dispatch(base + pos))
            else:
                self._event = ""
        self._buf = buf[pos:]
        self._buf_start = base + pos
        return events

    def _field(self, line: bytes) -> None:
        if line[0] == 0x3A:  # ":" comment / keep-alive
            return
        colon = line.find(b":")
        if colon < 0:
            name, value = line, b""
        else:
            name = line[:colon]
            value = line[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        if name == b"data":
            self._data.append(value.decode("utf-8", "replace"))
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id":
            if b"\x00" not in value:
                self._last_id = value.decode("utf-8", "replace")
        elif name == b"retry" and value.isdigit():
            self._retry = int(value)

    def _dispatch(self, end: int) -> EventFields:
        data = self._data[0] if len(self._data) == 1 else "\n".join(self._data)
        event = (data, end, self._event or "message", self._last_id, self._retry)
        self._data = []
        self._event = ""
        self._retry = None
        return event


def parse_all(stream: bytes) -> list[SSEEvent]:
    """Parse a complete byte stream at once (tests, small bodies)."""
    return SSEParser().feed(stream)


def encode_event(
    data: str | bytes, *, event: str | None = None, id: str | None = None, retry: int | None = None
) -> bytes:
    """Encode one event. Multi-line data becomes several ``data:`` lines, so it round-trips exactly."""
    raw = data.encode() if isinstance(data, str) else data
    parts: list[bytes] = []
    if event is not None and event != "message":
        parts.append(b"event: " + _single_line(event) + b"\n")
    if id is not None:
        parts.append(b"id: " + _single_line(id) + b"\n")
    if retry is not None:
        parts.append(b"retry: " + str(int(retry)).encode() + b"\n")
    if b"\r" in raw:
        raw = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    for line in raw.split(b"\n"):
        parts.append(b"data: " + line + b"\n")
    parts.append(b"\n")
    return b"".join(parts)


def encode_comment(text: str = "") -> bytes:
    """A comment line (e.g. a keep-alive) that parsers ignore."""
    return b": " + _single_line(text) + b"\n\n" if text else b":\n\n"


def _single_line(text: str) -> bytes:
    if "\n" in text or "\r" in text:
        raise ValueError("SSE field values other than data cannot contain line breaks")
    return text.encode()


DONE_EVENT = encode_event(DONE_DATA)
