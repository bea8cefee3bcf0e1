"""Parity: the same policy, fed the same snapshots, decides identically in the simulator and the gateway path.

The simulator's calls are recorded, then replayed through the live gateway's own objects
(``gateway.fleet.Deployment`` / ``ReplicaState``: ``deployment.pick`` -> ``replica.begin`` ->
``policy.on_dispatch`` ... ``replica.end`` -> ``policy.on_complete``, the sequence ``gateway/proxy.py`` runs)
with a fresh policy built by the same name. The engine metrics are copied into ``ReplicaState.engine`` as the
scraper would write them. No HTTP is involved: the point is the decision path, not the transport.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from fleetgate.config import DeploymentConfig, ReplicaConfig, RoutingConfig
from fleetgate.core.routing.base import PolicyBase
from fleetgate.core.routing.registry import POLICY_NAMES, build_policy
from fleetgate.core.types import ReplicaSnapshot
from fleetgate.core.units import load_profile
from fleetgate.engines.metrics import EngineSignals
from fleetgate.gateway.fleet import build_deployment
from fleetgate.sim.des import SimConfig, Simulator
from fleetgate.sim.engine import engine_factory
from fleetgate.sim.traces import synthetic_trace


class Recorder(PolicyBase):
    """Passes every call to the real policy and keeps a log of it (inputs and outputs)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.log: list[tuple[Any, ...]] = []

    def pick(self, request, replicas, now, rng, exclude=frozenset()):  # type: ignore[no-untyped-def]
        d = self.inner.pick(request, replicas, now, rng, exclude)
        self.log.append(("pick", request, list(replicas), now, exclude, d.replica))
        return d

    def on_dispatch(self, request, replica, now):  # type: ignore[no-untyped-def]
        self.log.append(("dispatch", request, replica, now))
        self.inner.on_dispatch(request, replica, now)

    def on_complete(self, request, replica, now, cost_mu, ok):  # type: ignore[no-untyped-def]
        self.log.append(("complete", request, replica, now, cost_mu, ok))
        self.inner.on_complete(request, replica, now, cost_mu, ok)


def _comparable(s: ReplicaSnapshot) -> ReplicaSnapshot:
    return replace(s, url="", inflight_mu=round(s.inflight_mu, 9))


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_simulator_and_gateway_path_make_identical_decisions(policy: str) -> None:
    seed = 11
    profile = load_profile("llama2-70b-h100-tp4")
    trace = synthetic_trace(600, 12.0, seed=3, prefix_groups=8, prefix_blocks=3, block_tokens=512)
    rec = Recorder(build_policy(policy))
    sim = Simulator(
        trace, rec, profile, engine_factory(profile, hash_block_tokens=512), SimConfig(replicas=4, seed=seed)
    )
    assert sim.run().summary["completed"] == 600

    dep = build_deployment(
        DeploymentConfig(
            model="sim-model",
            replicas=[
                ReplicaConfig(name=f"replica-{i}", url=f"http://127.0.0.1:{9000 + i}") for i in range(4)
            ],
            routing=RoutingConfig(policy=policy),  # type: ignore[arg-type]
            capacity_mu_per_min=profile.capacity_mu_per_min,
        )
    )
    rng = random.Random(seed)  # the gateway's rng, seeded like the simulator's
    picks = 0
    for entry in rec.log:
        kind = entry[0]
        if kind == "pick":
            _, info, snaps, now, exclude, chosen = entry
            for s in snaps:  # the scraper's job: copy the engine's metrics into the replica state
                st = dep.replicas[s.name]
                st.engine = EngineSignals(
                    waiting=s.engine_waiting, running=s.engine_running, kv_usage=s.engine_kv_usage
                )
                st.engine_prefix_hit_rate = s.engine_prefix_hit_rate
            gw_snaps = dep.snapshots()
            assert [_comparable(s) for s in gw_snaps] == [_comparable(s) for s in snaps]
            decision = dep.pick(info, now, rng, exclude)
            assert decision.replica == chosen, f"request {info.request_id}"
            picks += 1
        elif kind == "dispatch":
            _, info, name, now = entry
            dep.lifecycle.dispatch(info, name, dep.replicas[name], now)
        else:
            _, info, name, now, cost, ok = entry
            assert ok
            dep.replicas[name].end(info.cost_mu, ok, now)
            dep.policy.on_complete(info, name, now, cost, ok)
    assert picks == 600
