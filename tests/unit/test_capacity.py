"""Unit tests for the capacity ledger (core/capacity/ledger.py)."""

from __future__ import annotations

import math
import random

import pytest

from fleetgate.core.capacity import CapacityLedger, capacity_of
from fleetgate.core.types import HealthState, ReplicaSnapshot, Usage
from fleetgate.core.units import CostProfile

REPLICAS = [
    ReplicaSnapshot(name="a", capacity_mu_per_min=100.0),
    ReplicaSnapshot(name="b", capacity_mu_per_min=100.0, health=HealthState.SUSPECT),
    ReplicaSnapshot(name="c", capacity_mu_per_min=100.0, health=HealthState.UNHEALTHY),
    ReplicaSnapshot(name="d", capacity_mu_per_min=50.0, draining=True),
]


def test_capacity_counts_routable_replicas() -> None:
    assert capacity_of(REPLICAS) == 200.0


def test_snapshot_fields() -> None:
    led = CapacityLedger("m", window_s=60.0)
    led.record("t1", 10.0, now=0.0)
    led.record("t2", 5.0, now=30.0)
    snap = led.snapshot(45.0, REPLICAS, {"t1": 50.0, "t2": 30.0})
    assert snap.replicas == 2
    assert snap.capacity_mu_per_min == 200.0
    assert snap.sold_mu_per_min == 80.0
    assert snap.used_mu == 15.0 and snap.used_mu_per_min == 15.0
    assert snap.headroom_mu_per_min == 185.0
    assert snap.unsold_mu_per_min == 120.0
    assert snap.utilisation == pytest.approx(0.075)
    assert snap.used_by_tenant_mu_per_min == {"t1": 10.0, "t2": 5.0}
    d = snap.to_dict()
    assert d["headroom_mu_per_min"] == 185.0 and d["settled_requests"] == 2


def test_window_slides() -> None:
    led = CapacityLedger("m", window_s=10.0)
    led.record("t", 1.0, now=0.0)
    led.record("t", 2.0, now=5.0)
    assert led.used_mu(9.9) == 3.0
    assert led.used_mu(10.0) == 2.0  # (now - window, now]: the first one left at exactly t=10
    assert led.used_mu_per_min(10.0) == pytest.approx(12.0)
    assert led.used_mu(15.1) == 0.0
    assert led.total_settled_requests == 2


def test_used_equals_sum_of_settled_costs_exactly() -> None:
    """Settle is exact: the ledger's used MU equals the sum of settled request costs (bit for bit)."""
    profile = CostProfile(alpha=0.0013, beta=0.017, gamma=0.031, delta=0.002)
    rng = random.Random(11)
    led = CapacityLedger("m", window_s=1e9)
    settled = []
    now = 0.0
    for _ in range(5000):
        now += rng.random()
        usage = Usage(
            prompt_tokens=rng.randrange(1, 8000),
            completion_tokens=rng.randrange(0, 1000),
            cached_tokens=rng.randrange(0, 4000),
        )
        mu = profile.settle(usage)
        settled.append(mu)
        led.record(rng.choice("xyz"), mu, now)
    assert led.used_mu(now) == math.fsum(settled)
    assert math.fsum(led.used_by_tenant(now).values()) == pytest.approx(math.fsum(settled), rel=1e-15)


def test_record_rejects_bad_costs() -> None:
    led = CapacityLedger("m")
    with pytest.raises(ValueError):
        led.record("t", -1.0, 0.0)
    with pytest.raises(ValueError):
        led.record("t", math.nan, 0.0)
    with pytest.raises(ValueError):
        CapacityLedger("m", window_s=0)


def test_no_capacity_utilisation() -> None:
    led = CapacityLedger("m")
    led.record("t", 1.0, 0.0)
    snap = led.snapshot(1.0, [])
    assert math.isinf(snap.utilisation) and snap.to_dict()["utilisation"] is None
