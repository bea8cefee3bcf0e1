"""What the JSON codec costs core's per-request and per-event work: the standard library's ``json`` (core's
default) against orjson (what the gateway passes), on the same streams and bodies, interleaved, best of 7.

Usage: python bench/json_codec_cost.py   (prints one line per case; ratios carry over, absolute times do not)
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fleetgate.core.failover import FailoverTracker
from fleetgate.core.json_codec import STDLIB_JSON, JsonCodec
from fleetgate.core.openai import StreamTracker, load_json_body, usage_from_body
from fleetgate.orjson_codec import ORJSON


def _chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    event = {"id": "a", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    return b"data: " + ORJSON.dumps(event) + b"\n\n"


STREAM = [_chunk({"role": "assistant", "content": ""}), *(_chunk({"content": f" w{i}"}) for i in range(200))]
STREAM += [
    _chunk({}, "stop"),
    b'data: {"id":"a","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":200}}\n\n',
    b"data: [DONE]\n\n",
]
RESPONSE = ORJSON.dumps({"id": "x", "choices": [{"message": {"content": "word " * 200}}], "usage": {}})
REQUEST = ORJSON.dumps({"model": "m", "messages": [{"role": "user", "content": "word " * 2000}]})


def _failover(codec: JsonCodec) -> None:
    tracker = FailoverTracker("chat", client_usage=True, codec=codec)
    for chunk in STREAM:
        tracker.feed(chunk)
    assert tracker.text


def _strip(codec: JsonCodec) -> None:
    tracker = StreamTracker(strip_usage=True, codec=codec)
    for chunk in STREAM:
        tracker.feed(chunk)


CASES: dict[str, tuple[Callable[[JsonCodec], object], int]] = {
    "FailoverTracker, a 204-event stream": (_failover, 300),
    "StreamTracker(strip_usage), the same stream": (_strip, 300),
    "usage_from_body, 1 KB response": (lambda c: usage_from_body(RESPONSE, c), 5000),
    "load_json_body, 10 KB request": (lambda c: load_json_body(REQUEST, None, c), 5000),
}


def main() -> None:
    for name, (case, n) in CASES.items():
        best = {"stdlib": 1e9, "orjson": 1e9}
        for _ in range(7):
            for label, codec in (("stdlib", STDLIB_JSON), ("orjson", ORJSON)):
                t0 = time.perf_counter()
                for _ in range(n):
                    case(codec)
                best[label] = min(best[label], (time.perf_counter() - t0) / n)
        print(
            f"{name}: stdlib {best['stdlib'] * 1e6:.2f} us, orjson {best['orjson'] * 1e6:.2f} us, "
            f"stdlib/orjson {best['stdlib'] / best['orjson']:.2f}"
        )


if __name__ == "__main__":
    main()
