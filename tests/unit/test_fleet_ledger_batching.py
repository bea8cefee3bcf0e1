"""``admission.fleet_ledger.FleetLedger``: settlements batched per round, what an unreachable store did not
take kept for the next round, the fleet view answered only while fresh (else callers use their own ledger).
The store is the in-memory one with an outage switch (a stand-in for Redis going away; the Redis path runs
in tests/integration/test_fleet_ledger*.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fleetgate.admission.fleet_ledger import FleetLedger
from fleetgate.stores import MemoryStore, StoreUnavailableError
from fleetgate.stores.base import SettledUse


class FlakyStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.calls = 0

    async def add_used(self, settled: Sequence[SettledUse], now: float) -> None:
        self.calls += 1
        if self.down:
            raise StoreUnavailableError("down")
        await super().add_used(settled, now)


async def test_batches_keeps_what_failed_and_goes_stale() -> None:
    store = FlakyStore()
    mono = [0.0]
    ledger = FleetLedger(store, interval_s=1.0, clock=lambda: 1000.0, monotonic=lambda: mono[0])
    assert ledger.used_mu("chat") is None and not ledger.fresh  # nothing read yet
    ledger.record("chat", "gold", 2.0)
    ledger.record("chat", "gold", 3.0)
    ledger.record("chat", "(failover)", 0.5, requests=0.0)
    store.down = True
    with pytest.raises(StoreUnavailableError):
        await ledger.sync()
    assert ledger.used_mu("chat") is None
    store.down = False
    ledger.record("chat", "silver", 1.0)
    await ledger.sync()  # the failed round's settlements go with this one
    assert store.calls == 2
    assert ledger.used_mu("chat") == {"gold": 5.0, "silver": 1.0, "(failover)": 0.5}
    assert ledger.settled_requests("chat") == 3.0 and ledger.used_mu("code") == {}
    await ledger.sync()  # nothing new: the same window, nothing counted twice
    assert ledger.used_mu("chat") == {"gold": 5.0, "silver": 1.0, "(failover)": 0.5}
    mono[0] = 3.5  # three intervals without a read: stale
    assert ledger.used_mu("chat") is None and ledger.settled_requests("chat") is None
