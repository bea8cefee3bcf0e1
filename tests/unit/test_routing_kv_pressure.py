"""``kv_pressure``: no penalty below the knee, the whole weight at a full KV cache, none when unknown."""

from __future__ import annotations

import random

import pytest

from fleetgate.core.routing import build_policy
from fleetgate.core.routing.pipeline import PickContext
from fleetgate.core.routing.scorers.kv_pressure import KvPressureParams, KvPressureScorer
from fleetgate.core.types import ReplicaSnapshot, RequestInfo
from fleetgate.profiles import load_profile


def test_hinge() -> None:
    s = KvPressureScorer(KvPressureParams(knee=0.6))
    reps = [
        ReplicaSnapshot(f"r{i}", engine_kv_usage=u) for i, u in enumerate((None, 0.2, 0.6, 0.8, 1.0, 1.3))
    ]
    got = s.score(RequestInfo(request_id="q", model="m"), reps, PickContext(0.0, None, frozenset()))
    assert got == pytest.approx([1.0, 1.0, 1.0, 0.5, 0.0, 0.0])


def test_fleetgate_avoids_a_replica_short_of_kv_memory() -> None:
    """Two idle replicas, one with 95% of its KV cache in use: with the scorer (60 s at a full cache) the
    request goes to the other, whichever it is."""
    profile = load_profile("llama2-70b-h100-tp4")
    reps = [ReplicaSnapshot("r0", engine_kv_usage=0.95), ReplicaSnapshot("r1", engine_kv_usage=0.1)]
    req = RequestInfo(request_id="q", model="m", input_tokens=1000, cost_mu=1.0)
    kv = build_policy("fleetgate", {"gate": "off", "scorers": {"kv_pressure": 60}}, profile=profile)
    assert kv.pick(req, reps, 0.0, random.Random(0)).replica == "r1"
    swapped = [ReplicaSnapshot("r0", engine_kv_usage=0.1), ReplicaSnapshot("r1", engine_kv_usage=0.95)]
    kv2 = build_policy("fleetgate", {"gate": "off", "scorers": {"kv_pressure": 60}}, profile=profile)
    assert kv2.pick(req, swapped, 0.0, random.Random(0)).replica == "r0"
