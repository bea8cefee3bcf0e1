"""``SortedOutputHistory``: ``core.units.OutputHistory`` with an O(1) p90, the estimate's input.

Both drivers of the lifecycle ask for a tenant's p90 once per request; keeping each tenant's window sorted
as it changes (``bisect``) and its p90 with it (an index into the sorted window, set at each observation)
makes that a dict lookup, and the answer is always current (``tests/sim/test_fast_paths.py`` checks it
against ``OutputHistory`` value by value).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque

from fleetgate.core.units import OutputHistory


class SortedOutputHistory(OutputHistory):
    """``core.units.OutputHistory`` (same window, minimum, tenant limit and answers) with an O(1) ``p90``."""

    def __init__(self, window: int = 256, min_samples: int = 8, max_tenants: int = 100_000) -> None:
        super().__init__(window, min_samples, max_tenants)
        self._sorted: dict[str, list[int]] = {}
        self._p90: dict[str, float | None] = {}
        #: window length -> index of the p90 in the sorted window (``quantile``'s nearest rank, precomputed)
        self._p90_at = [max(math.ceil(0.9 * n), 1) - 1 for n in range(self.window + 1)]

    def observe(self, tenant: str, output_tokens: int) -> None:
        """Record one completed request's output length."""
        buf = self._data.pop(tenant, None)
        if buf is None:
            buf = deque(maxlen=self.window)
            if len(self._data) >= self.max_tenants:
                old = next(iter(self._data))
                del self._data[old]
                self._sorted.pop(old, None)
                self._p90.pop(old, None)
            values: list[int] = []
            self._sorted[tenant] = values
        else:
            values = self._sorted[tenant]
        v = int(output_tokens)
        if v < 0:  # (``max(int(output_tokens), 0)``)
            v = 0
        if len(buf) == self.window:
            del values[bisect_left(values, buf[0])]  # the deque drops its oldest value on append
        buf.append(v)
        insort(values, v)
        self._data[tenant] = buf
        n = len(values)  # the p90 as ``quantile(tenant, 0.9)`` gives it, kept for ``p90``
        self._p90[tenant] = float(values[self._p90_at[n]]) if n >= self.min_samples else None

    def quantile(self, tenant: str, q: float) -> float | None:
        """Nearest-rank quantile of the tenant's recent output lengths (``None`` when too few)."""
        values = self._sorted.get(tenant)
        if values is None or len(values) < self.min_samples:
            return None
        rank = max(math.ceil(q * len(values)), 1)
        return float(values[rank - 1])

    def p90(self, tenant: str) -> float | None:
        """The tenant's 90th-percentile output length, or ``None`` until ``min_samples`` were seen."""
        return self._p90.get(tenant)
