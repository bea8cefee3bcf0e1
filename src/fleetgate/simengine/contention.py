"""CPU contention between simulated replicas that share one machine's cores (opt-in).

The simulator's replicas run independently, each at its calibrated speed. Live llama-server replicas of the
bench share a few cores (3 single-thread replicas, the gateway and the client on a 2-core VM): while several
compute at once each one's iterations take longer (docs/benchmarks.md, "Session 13: CPU contention in the
llama-server prediction"). ``SharedCpu`` is one machine: the replicas of one simulated run that share it
register with it, and each iteration's time is multiplied by ``slowdown[k - 1]``, ``k`` the replicas
computing when it starts (itself included; beyond the table the last entry). An approximation of processor
sharing: an iteration keeps the factor it started with when others start or stop during it (a decode
iteration lasts milliseconds, a prompt chunk of 512 tokens about 0.1 s on the tiny model).

Sans-IO and deterministic: time is passed in; one ``SharedCpu`` per simulated run (never shared between
runs: it holds the replicas' iterations in flight).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["SharedCpu", "parse_slowdown"]


def parse_slowdown(values: Sequence[float]) -> tuple[float, ...]:
    """A slowdown table, checked: finite factors >= 1 (``slowdown[k - 1]``: with k replicas computing)."""
    out = tuple(float(v) for v in values)
    for v in out:
        if not (math.isfinite(v) and v >= 1.0):
            raise ValueError(f"slowdown factors must be finite and >= 1, got {v}")
    return out


class SharedCpu:
    """One machine's cores shared by the replicas that ``join`` it: ``stretch`` scales an iteration's time
    by the slowdown for the number of replicas computing at its start."""

    def __init__(self, slowdown: Sequence[float]) -> None:
        self.slowdown = parse_slowdown(slowdown)
        if not self.slowdown:
            raise ValueError("a SharedCpu needs at least one slowdown factor")
        self._busy: list[tuple[float, float]] = []  # per member: (start, end) of its iteration in flight
        self.stretched = 0  # iterations slowed (k > 1 with a factor above 1)

    def join(self) -> int:
        """Register a replica; its key for ``stretch``."""
        self._busy.append((0.0, 0.0))
        return len(self._busy) - 1

    def computing(self, at: float, key: int | None = None) -> int:
        """Members with an iteration in flight at ``at`` (``key``'s own aside)."""
        return sum(1 for i, (s, e) in enumerate(self._busy) if i != key and s <= at < e)

    def factor(self, k: int) -> float:
        """The slowdown with ``k`` replicas computing (1.0 for none or one unless the table says more)."""
        if k <= 0:
            return 1.0
        return self.slowdown[min(k, len(self.slowdown)) - 1]

    def stretch(self, key: int, start: float, duration: float) -> float:
        """Member ``key`` starts an iteration of ``duration`` (its own, uncontended) at ``start``: the time it
        takes with the others computing then; recorded as in flight until it ends."""
        f = self.factor(1 + self.computing(start, key))
        if f != 1.0:
            self.stretched += 1
        dt = duration * f
        self._busy[key] = (start, start + dt)
        return dt
