"""Plotting is optional: matplotlib comes with the ``plots`` extra (``pip install 'fleetgate[plots]'``).

Why: the gateway never plots; only ``fleetgate calibrate --plot`` and ``fleetgate simulate --report`` draw
PNGs. They ask for pyplot here, lazily, and get one clear error when the extra is missing.
"""

from __future__ import annotations

from typing import Any

MISSING = "plots need matplotlib: pip install 'fleetgate[plots]'"


class PlotsUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend; ``PlotsUnavailableError`` without it."""
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotsUnavailableError(MISSING) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def require() -> None:
    """Fail early (before a long run) when plots were asked for and cannot be drawn."""
    pyplot()
