"""Virtual token counters (VTC) in model units: fair shares between tenants of one priority class.

After Sheng et al., "Fairness in Serving Large Language Models" (OSDI '24): each tenant has a counter of the
service it received, divided by its weight; among backlogged tenants of a class the one with the smallest
counter goes first. A tenant that becomes backlogged again is lifted to the smallest counter of those already
backlogged, so idling never banks credit that it could later use to starve others.

Counters here count admitted MU (corrected at settle), which is what the fleet actually spends.
"""

from __future__ import annotations

from collections.abc import Hashable


class VirtualTokenCounters:
    """Per-(class, tenant) weighted service counters with backlog tracking."""

    def __init__(self) -> None:
        self._counter: dict[tuple[Hashable, str], float] = {}
        self._backlog: dict[tuple[Hashable, str], int] = {}

    def value(self, klass: Hashable, tenant: str) -> float:
        """The tenant's counter within ``klass`` (0 for a tenant never seen)."""
        return self._counter.get((klass, tenant), 0.0)

    def backlogged(self, klass: Hashable) -> dict[str, float]:
        """Counters of the tenants of ``klass`` that have queued work."""
        return {
            t: self._counter.get((k, t), 0.0) for (k, t), n in self._backlog.items() if k == klass and n > 0
        }

    def enter(self, klass: Hashable, tenant: str) -> None:
        """One more queued request for ``tenant``; lifts an idle tenant to the backlogged minimum."""
        key = (klass, tenant)
        if self._backlog.get(key, 0) == 0:
            others = self.backlogged(klass)
            if others:
                floor = min(others.values())
                self._counter[key] = max(self._counter.get(key, 0.0), floor)
        self._backlog[key] = self._backlog.get(key, 0) + 1

    def leave(self, klass: Hashable, tenant: str) -> None:
        """One queued request of ``tenant`` left the queue (admitted, rejected or expired)."""
        key = (klass, tenant)
        n = self._backlog.get(key, 0) - 1
        if n <= 0:
            self._backlog.pop(key, None)
        else:
            self._backlog[key] = n

    def charge(self, klass: Hashable, tenant: str, mu: float, weight: float = 1.0) -> None:
        """Add service received (``mu`` may be negative for a settle refund; the counter stays >= 0)."""
        key = (klass, tenant)
        w = weight if weight > 0 else 1.0
        self._counter[key] = max(0.0, self._counter.get(key, 0.0) + mu / w)
