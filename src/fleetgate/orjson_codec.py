"""``orjson`` as the :class:`~fleetgate.core.json_codec.JsonCodec` the gateway hands to core."""

from __future__ import annotations

import orjson

from fleetgate.core.json_codec import JsonCodec

#: orjson's decoder and encoder (``orjson.JSONDecodeError`` is a ``ValueError``, as the codec requires).
ORJSON = JsonCodec(loads=orjson.loads, dumps=orjson.dumps)
