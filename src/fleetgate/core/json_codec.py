"""The JSON codec core decodes and encodes with, passed in by the shell (core imports no JSON library).

Core code that reads or rewrites JSON bytes (request bodies, SSE events) takes a :class:`JsonCodec`; the
default is the standard library, so core runs and is tested without third-party packages. The gateway passes
``fleetgate.orjson_codec.ORJSON`` (several times faster on the per-request and per-event path).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class JsonCodec:
    """``loads`` raises ``ValueError`` on anything that is not JSON (invalid UTF-8 and too deep nesting
    included); ``dumps`` returns compact UTF-8 bytes."""

    loads: Callable[[bytes | str], Any]
    dumps: Callable[[Any], bytes]


def _std_loads(data: bytes | str) -> Any:
    try:
        return json.loads(data)
    except RecursionError as exc:  # orjson reports this as a decode error; so does this codec
        raise ValueError("JSON nested too deeply") from exc


def _std_dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


#: The standard library's ``json``: the default wherever core takes a codec.
STDLIB_JSON = JsonCodec(loads=_std_loads, dumps=_std_dumps)
