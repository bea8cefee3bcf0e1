"""Fault kinds the simulated engine can inject, parsed from ``KIND[=VALUE]`` or ``{"kind", "value"}``.

- ``hang``: generation stops (engine clock frozen); HTTP, /health and /metrics keep answering, as a
  stuck vLLM does.
- ``crash``: the process exits with status 1 after ``value`` seconds (default 0: at once; as a start-up flag
  with no value, before printing the ready line, which makes a crash loop).
- ``slow``: every iteration takes ``value`` times longer (default 10); at time scale 0 the engine then runs
  at time scale 1 x value.
- ``error_rate``: that share of new requests (``value`` in [0, 1], default 1) gets an HTTP 500 OpenAI error.
- ``stall``: streams stop after ``value`` content chunks (default 2) and never finish (until the client
  goes away); non-stream requests are unaffected.
- ``none``: clear.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetgate.core.errors import InvalidRequestError

FAULT_KINDS: tuple[str, ...] = ("none", "hang", "crash", "slow", "error_rate", "stall")

_DEFAULTS: dict[str, float | None] = {
    "none": None,
    "hang": None,
    "crash": 0.0,
    "slow": 10.0,
    "error_rate": 1.0,
    "stall": 2.0,
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One active fault (``kind="none"`` for none) and its value."""

    kind: str = "none"
    value: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value}


NO_FAULT = Fault()


def make_fault(kind: Any, value: Any = None) -> Fault:
    """Validate a fault; raises ``InvalidRequestError`` (HTTP 400) with a clear message."""
    if not isinstance(kind, str) or kind not in FAULT_KINDS:
        raise InvalidRequestError(
            f"fault kind must be one of {', '.join(FAULT_KINDS)}; got {kind!r}", param="kind"
        )
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise InvalidRequestError("fault value must be a number", param="value")
    v = _DEFAULTS[kind] if value is None else float(value)
    if v is not None and not math.isfinite(v):
        raise InvalidRequestError("fault value must be finite", param="value")
    if kind == "slow" and v is not None and v <= 0:
        raise InvalidRequestError("slow factor must be > 0", param="value")
    if kind == "error_rate" and v is not None and not 0.0 <= v <= 1.0:
        raise InvalidRequestError("error_rate must be within [0, 1]", param="value")
    if kind in ("crash", "stall") and v is not None and v < 0:
        raise InvalidRequestError(f"{kind} value must be >= 0", param="value")
    return Fault(kind, v)


def parse_fault(spec: str) -> Fault:
    """``"slow=5"`` -> ``Fault("slow", 5.0)``; ``"hang"`` -> ``Fault("hang", None)``."""
    kind, sep, raw = spec.strip().partition("=")
    if not sep:
        return make_fault(kind.strip())
    try:
        value = float(raw)
    except ValueError as exc:
        raise InvalidRequestError(f"fault value must be a number: {spec!r}", param="value") from exc
    return make_fault(kind.strip(), value)


def fault_from_json(body: Any) -> Fault:
    """Parse the body of ``POST /admin/fault``."""
    if not isinstance(body, Mapping):
        raise InvalidRequestError('body must be a JSON object like {"kind": "hang"}')
    extra = set(body) - {"kind", "value"}
    if extra:
        raise InvalidRequestError(f"unknown field(s): {', '.join(sorted(extra))}")
    return make_fault(body.get("kind"), body.get("value"))
