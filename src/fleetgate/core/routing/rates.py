"""Exponentially decaying MU rates for many items on one shared time base.

Each item keeps ``v = sum(c_i * exp((t_i - base) / tau))`` for its contributions ``c_i`` at times ``t_i``;
its rate at ``now`` is ``v * exp(-(now - base) / tau) / tau`` (MU per second). All items decay by the same
factor, so comparing items with each other (``v_a > 1.2 * mean(v)``) needs no exponentials at all; the base
is moved forward now and then so the stored values stay finite.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

_REBASE_AFTER_TAUS = 30.0


class DecayingRates(Generic[K]):
    """EWMA rates (time constant ``tau_s``) for items of type ``K``; ``values`` share one time base."""

    __slots__ = ("_exp", "base", "tau_s", "values")

    def __init__(self, tau_s: float) -> None:
        if tau_s <= 0:
            raise ValueError("tau_s must be positive")
        self.tau_s = tau_s
        self.base = 0.0
        self.values: dict[K, float] = {}
        self._exp = math.exp

    def add(self, key: K, amount: float, now: float) -> None:
        """Add ``amount`` MU observed at ``now``."""
        if now - self.base > _REBASE_AFTER_TAUS * self.tau_s:
            self.rebase(now)
        w = self._exp((now - self.base) / self.tau_s)
        vals = self.values
        vals[key] = vals.get(key, 0.0) + amount * w

    def add_rate(self, key: K, amount: float, now: float) -> float:
        """``add``, then ``rate(key, now)`` (the same arithmetic; once per dispatch for the key)."""
        if now - self.base > _REBASE_AFTER_TAUS * self.tau_s:
            self.rebase(now)
        exp = self._exp
        base = self.base
        tau = self.tau_s
        vals = self.values
        v = vals[key] = vals.get(key, 0.0) + amount * exp((now - base) / tau)
        return v * (exp(-(now - base) / tau) / tau)

    def scale(self, now: float) -> float:
        """Factor turning a stored value into a rate (MU/s) at ``now``."""
        return self._exp(-(now - self.base) / self.tau_s) / self.tau_s

    def rate(self, key: K, now: float) -> float:
        """MU per second for ``key`` at ``now``."""
        return self.values.get(key, 0.0) * self.scale(now)

    def shift(self, src: K, dst: K, rate: float, now: float) -> None:
        """Move ``rate`` MU/s of recent history from ``src`` to ``dst`` (after a reassignment)."""
        amount = rate / self.scale(now)
        vals = self.values
        moved = min(amount, vals.get(src, 0.0))
        vals[src] = vals.get(src, 0.0) - moved
        vals[dst] = vals.get(dst, 0.0) + moved

    def rebase(self, now: float) -> None:
        """Move the time base to ``now`` (rescales every stored value)."""
        if now <= self.base:
            return
        f = self._exp(-(now - self.base) / self.tau_s)
        self.values = {k: v * f for k, v in self.values.items()}
        self.base = now

    def discard(self, key: K) -> None:
        self.values.pop(key, None)


class SlidingSums:
    """Exact sums over the last ``window_s`` seconds per item (one time-ordered queue for all items).

    Expiring is amortised O(1) per contribution, and the ``total`` over all items is kept alongside, so a
    per-request "is this replica above the mean of the last minute" costs one dict lookup.
    """

    __slots__ = ("_queue", "sums", "total", "window_s")

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self.sums: dict[str, float] = {}
        self.total = 0.0
        self._queue: deque[tuple[float, str, float]] = deque()

    def add(self, key: str, amount: float, now: float) -> None:
        self.expire(now)
        self._queue.append((now, key, amount))
        self.sums[key] = self.sums.get(key, 0.0) + amount
        self.total += amount

    def expire(self, now: float) -> None:
        q = self._queue
        edge = now - self.window_s
        sums = self.sums
        while q and q[0][0] <= edge:
            _, key, amount = q.popleft()
            sums[key] -= amount
            self.total -= amount
        if not q:
            self.total = 0.0
            for key in sums:
                sums[key] = 0.0


class ReplicaLoads:
    """Per replica, in one dict entry ``[load, finish]`` (one lookup per replica on the hot path):

    - ``load``: dispatched MU, exponentially decayed with ``tau_s`` on a shared time base exactly like
      ``DecayingRates`` (``rate = load * scale(now)``); ``total`` is the sum over all replicas;
    - ``finish``: the virtual time at which the prefill work queued on the replica drains (a fluid queue).
    """

    __slots__ = ("_exp", "base", "reps", "tau_s", "total")

    def __init__(self, tau_s: float) -> None:
        if tau_s <= 0:
            raise ValueError("tau_s must be positive")
        self.tau_s = tau_s
        self.base = 0.0
        self.total = 0.0
        self.reps: dict[str, list[float]] = {}
        self._exp = math.exp

    def _entry(self, name: str) -> list[float]:
        st = self.reps.get(name)
        if st is None:
            st = self.reps[name] = [0.0, 0.0]
        return st

    def add(self, name: str, amount: float, now: float) -> None:
        """Add ``amount`` MU dispatched to (or settled on) ``name`` at ``now``."""
        if now - self.base > _REBASE_AFTER_TAUS * self.tau_s:
            self.rebase(now)
        v = amount * self._exp((now - self.base) / self.tau_s)
        self._entry(name)[0] += v
        self.total += v

    def queue(self, name: str, seconds: float, now: float) -> None:
        """Queue ``seconds`` of prefill work on ``name`` behind whatever is still queued."""
        st = self._entry(name)
        st[1] = (st[1] if st[1] > now else now) + seconds

    def scale(self, now: float) -> float:
        """Factor turning a stored load into MU per second at ``now``."""
        return self._exp(-(now - self.base) / self.tau_s) / self.tau_s

    def rate(self, name: str, now: float) -> float:
        st = self.reps.get(name)
        return 0.0 if st is None else st[0] * self.scale(now)

    def shift(self, src: str, dst: str, rate: float, now: float) -> None:
        """Move ``rate`` MU/s of recent load from ``src`` to ``dst`` (after a reassignment)."""
        a = self._entry(src)
        moved = min(rate / self.scale(now), a[0])
        a[0] -= moved
        self._entry(dst)[0] += moved

    def rebase(self, now: float) -> None:
        if now <= self.base:
            return
        f = self._exp(-(now - self.base) / self.tau_s)
        for st in self.reps.values():
            st[0] *= f
        self.total *= f
        self.base = now

    def discard(self, name: str) -> None:
        st = self.reps.pop(name, None)
        if st is not None:
            self.total -= st[0]
