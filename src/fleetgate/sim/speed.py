"""Per-replica engine speed for the simulator: replicas that are not all the same engine at every moment.

The simulated engines of one deployment are otherwise identical and deterministic, so the rates the gateway
learns online for them agree to about 1% (docs/benchmarks.md, session 7), while on real machines identical
replicas are measured 1.5-2.4x apart (CPU shared with neighbours, session 6) and real fleets mix hardware.
``SpeedVariation`` gives each replica a speed factor (1: the profile's engine; 2: twice as fast):

* ``spread``: a fixed factor per replica, ``exp(spread * z)`` (a heterogeneous fleet: real differences);
* ``noise``: a factor redrawn every ``period_s`` seconds, ``exp(noise * z)`` (contention that comes and
  goes: identical replicas whose speed wanders, so a rate learned a minute ago is partly noise).

Both are seeded per replica name. ``SpeedVaryingEngine`` runs an unchanged ``perfmodel.EngineModel`` on its
own clock: engine time advances at the replica's speed, so every iteration (prefill and decode) takes
1 / speed of its usual wall time. The router sees none of this; it only sees the timings, like the gateway.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass

from fleetgate.simengine.perfmodel import EngineModel as PerfEngine
from fleetgate.simengine.perfmodel import EngineRequest, EngineStats, StepResult


@dataclass(frozen=True, slots=True)
class SpeedVariation:
    """How replica speeds vary (see the module docstring); all zero: every replica is the profile's engine."""

    spread: float = 0.0
    noise: float = 0.0
    period_s: float = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.spread < 0 or self.noise < 0 or not self.period_s > 0:
            raise ValueError("speed spread and noise must be >= 0 and period_s > 0")

    @property
    def active(self) -> bool:
        return self.spread > 0 or self.noise > 0

    def schedule(self, name: str, periods: int) -> list[float]:
        """Replica ``name``'s speed factor in each of its first ``periods`` periods (period k: wall time
        ``[k * period_s, (k + 1) * period_s)``), the factors its ``SpeedVaryingEngine`` runs at; a live
        replay applies the same schedule to real engines (``bench/router_compare.py --speed-noise``)."""
        return _Clock(self, name).speeds(periods)


class _Clock:
    """A replica's engine clock: piecewise linear in wall time, slope = the speed in each period."""

    def __init__(self, variation: SpeedVariation, name: str) -> None:
        self._rng = random.Random(f"{variation.seed}:{name}")
        self._base = math.exp(variation.spread * self._rng.gauss(0.0, 1.0))
        self._noise = variation.noise
        self._period = variation.period_s
        self._wall = [0.0]  # period starts (wall time)
        self._eng = [0.0]  # engine time at each period start
        self._speed: list[float] = []

    def _extend(self) -> None:
        s = self._base * (math.exp(self._noise * self._rng.gauss(0.0, 1.0)) if self._noise else 1.0)
        self._speed.append(s)
        self._wall.append(self._wall[-1] + self._period)
        self._eng.append(self._eng[-1] + s * self._period)

    def speeds(self, periods: int) -> list[float]:
        while len(self._speed) < periods:
            self._extend()
        return self._speed[:periods]

    def engine_time(self, wall: float) -> float:
        while wall >= self._wall[-1]:
            self._extend()
        k = bisect.bisect_right(self._wall, wall) - 1
        return self._eng[k] + self._speed[k] * (wall - self._wall[k])

    def speed_at(self, wall: float) -> float:
        return self._speed[bisect.bisect_right(self._wall, wall) - 1]

    def wall_time(self, eng: float) -> float:
        while eng >= self._eng[-1]:
            self._extend()
        k = bisect.bisect_right(self._eng, eng) - 1
        return self._wall[k] + (eng - self._eng[k]) / self._speed[k]


class SpeedVaryingEngine:
    """``perfmodel.EngineModel`` on a replica's own clock (the simulator's ``EngineModel`` protocol)."""

    def __init__(self, engine: PerfEngine, variation: SpeedVariation, name: str) -> None:
        self.engine = engine
        self.params = engine.params
        self._clock = _Clock(variation, name)

    def speed_at(self, now: float) -> float:
        """The replica's speed factor at wall time ``now``."""
        clock = self._clock
        clock.engine_time(now)  # (draws the periods up to ``now``)
        return clock.speed_at(now)

    def submit(self, request: EngineRequest, now: float) -> None:
        self.engine.submit(request, self._clock.engine_time(now))

    def cancel(self, request_id: str, now: float | None = None) -> bool:
        return self.engine.cancel(request_id, None if now is None else self._clock.engine_time(now))

    def next_event_time(self) -> float | None:
        t = self.engine.next_event_time()
        return None if t is None else self._clock.wall_time(t)

    def advance(self, until: float) -> StepResult:
        clock = self._clock
        eng = clock.engine_time(until)
        nxt = self.engine.next_event_time()
        if nxt is not None and eng < nxt and clock.wall_time(nxt) <= until:
            eng = nxt  # the event the simulator was woken for (lost to rounding between the two clocks)
        res = self.engine.advance(eng)
        wall = clock.wall_time
        res.start = wall(res.start)
        res.end = wall(res.end)
        for times in (res.first_token, res.finished, res.admitted):
            for rid, t in times.items():
                times[rid] = wall(t)
        return res

    def fits(self, input_tokens: int, max_output_tokens: int) -> bool:
        return self.engine.fits(input_tokens, max_output_tokens)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    @property
    def kv_usage(self) -> float:
        return self.engine.kv_usage

    # (settable, as the protocol declares them: the wrapped engine's counters)
    @property
    def prefix_cache_queries(self) -> int:
        return self.engine.prefix_cache_queries

    @prefix_cache_queries.setter
    def prefix_cache_queries(self, value: int) -> None:
        self.engine.prefix_cache_queries = value

    @property
    def prefix_cache_hits(self) -> int:
        return self.engine.prefix_cache_hits

    @prefix_cache_hits.setter
    def prefix_cache_hits(self, value: int) -> None:
        self.engine.prefix_cache_hits = value
