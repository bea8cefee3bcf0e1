"""The one place rate-limit numbers become HTTP headers: OpenAI's ``x-ratelimit-*`` and ``Retry-After``.

Admission (``fleetgate.core.admission``) hands out numbers (``MeterReading``: limit per minute, what is left,
seconds until the meter has drained; a ``retry_after_s``); this module spells them the way OpenAI clients
read them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fleetgate.core.admission import EPS, ChargeKind, Decision, MeterReading


def format_duration(seconds: float) -> str:
    """OpenAI's reset format: ``20ms``, ``1.5s``, ``6m0s``."""
    seconds = max(0.0, seconds)
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60.0:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    minutes = int(seconds // 60)
    return f"{minutes}m{int(seconds - 60 * minutes)}s"


def _integer(v: float) -> str:
    return str(math.floor(v + EPS))


def _decimal(v: float) -> str:
    return f"{v:.3f}".rstrip("0").rstrip(".")


def meter_headers(meters: Sequence[MeterReading]) -> dict[str, str]:
    """``x-ratelimit-{limit,remaining,reset}-{requests,tokens,mu}`` for the meters the tenant has.

    Each suffix speaks its own unit: ``requests`` the requests-per-minute limit, ``tokens`` the
    tokens-per-minute limit (absent when the tenant has none: model units are never passed off as tokens),
    ``mu`` the tier's model-unit meter. Limits are per minute; ``remaining-requests`` is how many requests
    pass if sent now; ``reset`` is the time until the meter has fully drained.
    """
    by_kind = {m.kind: m for m in reversed(meters)}  # the first reading of each kind
    headers: dict[str, str] = {}

    def put(suffix: str, m: MeterReading, integer: bool) -> None:
        fmt = _integer if integer else _decimal
        headers[f"x-ratelimit-limit-{suffix}"] = fmt(m.limit_per_min)
        headers[f"x-ratelimit-remaining-{suffix}"] = fmt(m.remaining)
        headers[f"x-ratelimit-reset-{suffix}"] = format_duration(m.reset_s)

    if ChargeKind.REQUESTS in by_kind:
        put("requests", by_kind[ChargeKind.REQUESTS], True)
    if ChargeKind.TOKENS in by_kind:
        put("tokens", by_kind[ChargeKind.TOKENS], True)
    if ChargeKind.MU in by_kind:
        put("mu", by_kind[ChargeKind.MU], False)
    return headers


def decision_headers(decision: Decision) -> dict[str, str]:
    """What an admission verdict tells the client: its meters, and why when no meter explains it."""
    headers = meter_headers(decision.meters)
    if decision.note:
        headers["x-fleetgate-reason"] = decision.note
    return headers


def retry_after_headers(retry_after_s: float) -> dict[str, str]:
    """``Retry-After`` (whole seconds, at least 1) and the SDKs' finer ``retry-after-ms``."""
    return {
        "Retry-After": str(max(1, math.ceil(retry_after_s))),
        "retry-after-ms": str(max(1, math.ceil(retry_after_s * 1000))),
    }
