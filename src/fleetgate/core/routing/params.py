"""Shared parameter checking for routing policies built from config (cache_aware, fleetgate)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def parse_params(
    policy: str,
    params: Mapping[str, Any],
    spec: Mapping[str, Callable[[Any], Any]],
    *,
    keep_none: bool = False,
) -> dict[str, Any]:
    """Coerce ``params`` with the converters in ``spec``; unknown names raise ``ValueError``.

    With ``keep_none`` a ``None`` value is passed through unconverted (meaning "use the default").
    """
    unknown = set(params) - set(spec)
    if unknown:
        raise ValueError(f"unknown parameter(s) for routing policy {policy!r}: {', '.join(sorted(unknown))}")
    return {k: (None if keep_none and v is None else spec[k](v)) for k, v in params.items()}
