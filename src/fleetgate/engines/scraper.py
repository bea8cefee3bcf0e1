"""Engine /metrics scraping: one asyncio loop per replica feeding the fields of its ``ReplicaSnapshot``.

Each loop: GET ``{url}/metrics`` -> ``parse_prometheus_text`` -> ``engine_signals`` -> write the replica's
engine fields (waiting, running, KV usage, prefix hit rate since the previous scrape). A failed scrape clears
the engine fields (the router then falls back to the gateway's own counters) rather than keeping stale
numbers; health verdicts are the prober's business, not the scraper's. ``sync`` starts and stops loops as
replicas come and go (autoscaler, restarts).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from fleetgate.core.errors import UpstreamError
from fleetgate.core.types import RandomSource
from fleetgate.engines.client import UpstreamClient
from fleetgate.engines.metrics import EngineSignals, engine_signals, hit_rate, parse_prometheus_text

log = logging.getLogger("fleetgate.scraper")


class ScrapeTarget(Protocol):
    """What the scraper writes: ``gateway.fleet.ReplicaState`` fits."""

    name: str
    url: str
    deployment: str
    engine: EngineSignals | None
    engine_prefix_hit_rate: float | None
    last_scrape_ok: bool | None


async def scrape_once(client: UpstreamClient, target: ScrapeTarget, timeout_s: float) -> EngineSignals | None:
    """Scrape one replica now and update it; returns the new signals (``None`` when the scrape failed)."""
    previous = target.engine
    try:
        text = await client.get_text(target.url + "/metrics", timeout_s)
    except UpstreamError as exc:
        if target.last_scrape_ok is not False:
            log.info("scrape of %s failed: %s", target.name, exc.message)
        target.engine = None
        target.engine_prefix_hit_rate = None
        target.last_scrape_ok = False
        return None
    signals = engine_signals(parse_prometheus_text(text))
    target.engine = signals
    rate = hit_rate(previous, signals)
    if rate is not None:
        target.engine_prefix_hit_rate = rate
    target.last_scrape_ok = True
    return signals


#: Called with each target and its new signals (``None``: the scrape failed).
ScrapeObserver = Callable[[ScrapeTarget, EngineSignals | None], None]


class MetricsScraper:
    """Runs one scrape loop per target; ``sync(targets)`` reconciles the set of loops.

    Observers, given at construction (the health monitor's progress evidence, the engine-rate learner's
    counters), see every scrape's result, ``None`` when it failed.
    """

    def __init__(
        self,
        client: UpstreamClient,
        *,
        interval_s: float = 1.0,
        timeout_s: float = 1.0,
        rng: RandomSource | None = None,
        observers: Sequence[ScrapeObserver] = (),
    ) -> None:
        self.client = client
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.rng = rng
        self.observers = tuple(observers)
        self._tasks: dict[int, tuple[ScrapeTarget, asyncio.Task[None]]] = {}

    def sync(self, targets: Iterable[ScrapeTarget]) -> None:
        """Start loops for new targets and stop loops for targets no longer listed."""
        wanted = {id(t): t for t in targets}
        for key in list(self._tasks):
            if key not in wanted:
                self._tasks.pop(key)[1].cancel()
        for key, target in wanted.items():
            if key not in self._tasks:
                task = asyncio.create_task(self._loop(target), name=f"scrape-{target.name}")
                self._tasks[key] = (target, task)

    async def _loop(self, target: ScrapeTarget) -> None:
        # spread the loops over the period so replicas are not scraped in lock step
        if self.rng is not None:
            await asyncio.sleep(self.rng.random() * self.interval_s)
        while True:
            try:
                signals = await scrape_once(self.client, target, self.timeout_s)
                for observe in self.observers:
                    observe(target, signals)
            except Exception:  # a bug in one scrape must not kill the loop
                log.exception("scrape loop for %s", target.name)
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
