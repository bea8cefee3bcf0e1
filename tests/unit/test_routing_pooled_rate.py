"""Learned prefill rates pooled per deployment (``learned_rate_noise``): identical replicas whose learned
rates scatter by noise get one rate, genuinely different ones keep most of their difference (sans-IO)."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from fleetgate.core.routing import build_policy
from fleetgate.core.routing.fleetgate import FleetgatePolicy
from fleetgate.core.routing.scorers.ttft import PooledRates
from fleetgate.core.types import ReplicaSnapshot, RequestInfo
from fleetgate.profiles import load_profile

PROFILE = load_profile("llama2-70b-h100-tp4")


def snap(name: str, rate: float | None) -> ReplicaSnapshot:
    return ReplicaSnapshot(name, learned_prefill_tokens_per_s=rate)


def test_within_the_noise_every_replica_gets_the_median() -> None:
    pool = PooledRates(2.0)
    pool.update([snap("a", 2100.0), snap("b", 2600.0), snap("c", 4100.0), snap("d", None)])
    assert pool.median == 2600.0  # of the learned ones
    assert [pool.rate(x) for x in (2100.0, 2600.0, 4100.0, None)] == [2600.0] * 4


def test_beyond_the_noise_the_difference_is_shrunk_not_dropped() -> None:
    pool = PooledRates(1.5)
    pool.update([snap("a", 1000.0), snap("b", 4000.0), snap("c", 16000.0)])
    s = math.log(1.5)
    for own in (1000.0, 16000.0):
        d = math.log(own / 4000.0)
        assert pool.rate(own) == pytest.approx(4000.0 * math.exp(d - s * s / d))
    assert 16000.0 > pool.rate(16000.0) > 0.85 * 16000.0  # 4x the median counts as about 3.6x
    assert 1000.0 < pool.rate(1000.0) < 1000.0 / 0.85
    assert pool.rate(5000.0) == 4000.0  # 1.25x: noise


def test_median_follows_the_candidates() -> None:
    pool = PooledRates(1.2)
    pool.update([snap("a", 1000.0), snap("b", 3000.0)])
    assert pool.median == 2000.0
    pool.update([snap("a", 1000.0), snap("b", 3000.0), snap("c", 3000.0)])
    assert pool.median == 3000.0
    pool.update([snap("a", None)])
    assert pool.median is None and pool.rate(1234.0) == 1234.0  # nothing learned: own rate (none: none)


#: Each replica's own learned rate in seconds (the policy's default pools them on the MU scale since
#: session 10: ``learned_rate_noise: 2``, ``learned_rate_scale: relative``).
OWN_RATES = {"learned_rate_noise": 1.0, "learned_rate_scale": "seconds"}


def policy(**params: object) -> FleetgatePolicy:
    """No gate, and the load guard's bound out of the way (10x the mean): the TTFT estimate alone decides;
    each replica's own learned rate unless ``params`` say otherwise."""
    p = build_policy("fleetgate", {"gate": "off", "load_bound": 10.0, **OWN_RATES, **params}, profile=PROFILE)
    assert isinstance(p, FleetgatePolicy)
    return p


def split(p: FleetgatePolicy, replicas: list[ReplicaSnapshot], n: int = 120) -> Counter[str]:
    """Where ``n`` unrelated prompts (no shared prefix) dispatched at once go."""
    rng = random.Random(0)
    got: Counter[str] = Counter()
    for i in range(n):
        req = RequestInfo(
            request_id=f"q{i}", model="m", input_tokens=2048, prefix_hashes=(10_000 + i,),
            prefix_block_tokens=2048, cost_mu=1.0,
        )  # fmt: skip
        d = p.pick(req, replicas, 0.0, rng)
        p.on_dispatch(req, d.replica, 0.0)
        got[d.replica] += 1
    return got


def test_identical_replicas_with_noisy_rates_share_the_load_when_pooled() -> None:
    """Three identical replicas read 2,100 / 2,600 / 4,100 tokens/s (session 6's first readings on one
    machine): per-replica rates send the fast-looking one about twice the slow one's requests; pooled
    (noise 2) they split evenly."""
    replicas = [snap("r0", 2100.0), snap("r1", 2600.0), snap("r2", 4100.0)]
    own = split(policy(), replicas)
    assert own["r2"] > 1.6 * own["r0"]  # (54 / 30 here)
    pooled = split(policy(learned_rate_noise=2.0), replicas)
    assert max(pooled.values()) - min(pooled.values()) <= 2


def test_a_genuinely_faster_replica_still_gets_more_when_pooled() -> None:
    """A 4x faster replica (different hardware in one deployment) is beyond the noise: pooling keeps it."""
    replicas = [snap("r0", 1000.0), snap("r1", 1000.0), snap("r2", 4000.0)]
    own = split(policy(), replicas)
    pooled = split(policy(learned_rate_noise=1.5), replicas)
    assert pooled["r2"] > 2.5 * pooled["r0"]  # (73 / 24 here)
    assert pooled["r2"] >= 0.9 * own["r2"]


def test_a_configured_rate_is_not_pooled() -> None:
    assert policy(learned_rate_noise=2.0, prefill_tokens_per_s=3000.0).estimate.pool is None
    assert policy().estimate.pool is None  # learned_rate_noise 1: each replica's own rate
    default = build_policy("fleetgate", {}, profile=PROFILE)
    assert isinstance(default, FleetgatePolicy) and default.estimate.pool is not None  # the default pools
