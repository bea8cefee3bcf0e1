"""The codec contract core relies on (``core.json_codec``), held by the standard-library default and by the
orjson codec the gateway passes: the same values both ways, ``ValueError`` for anything that is not JSON."""

from __future__ import annotations

import pytest

from fleetgate.core.json_codec import STDLIB_JSON, JsonCodec
from fleetgate.orjson_codec import ORJSON

CODECS = pytest.mark.parametrize("codec", [STDLIB_JSON, ORJSON], ids=["stdlib", "orjson"])
VALUE = {"a": [1, 2.5, None, True], "text": ' "caf\u00e9" \\ \u4e2d\n', "nested": {"x": {}}}


@CODECS
def test_round_trip_and_compact_utf8(codec: JsonCodec) -> None:
    raw = codec.dumps(VALUE)
    assert raw == ORJSON.dumps(VALUE)  # byte-identical: core rewrites events with either
    assert codec.loads(raw) == VALUE and codec.loads(raw.decode()) == VALUE


@CODECS
@pytest.mark.parametrize("bad", [b"", b"{", b'{"a": 1} x', b'"\xff"', b"[" * 100_000])
def test_not_json_is_a_value_error(codec: JsonCodec, bad: bytes) -> None:
    with pytest.raises(ValueError):
        codec.loads(bad)
