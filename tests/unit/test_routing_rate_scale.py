"""``learned_rate_scale: relative``: learned prefill rates only scale the cost profile's MU seconds by the
median learned rate over the replica's own, so replicas with and without a learned rate are on one scale
(sans-IO)."""

from __future__ import annotations

import random

import pytest

from fleetgate.core.routing import build_policy
from fleetgate.core.routing.fleetgate import FleetgatePolicy
from fleetgate.core.types import ReplicaSnapshot, RequestInfo
from fleetgate.profiles import load_profile

PROFILE = load_profile("llama2-70b-h100-tp4")


def snap(name: str, rate: float | None) -> ReplicaSnapshot:
    return ReplicaSnapshot(name, learned_prefill_tokens_per_s=rate)


#: The rule on each replica's own rate (no pooling) and, unless asked otherwise, in seconds: the policy's
#: default is ``relative`` with ``learned_rate_noise: 2`` since session 10.
OWN_SECONDS = {"learned_rate_noise": 1.0, "learned_rate_scale": "seconds"}


def policy(**params: object) -> FleetgatePolicy:
    """No gate and the load guard out of the way: the TTFT estimate alone decides."""
    base = {"gate": "off", "load_bound": 10.0, **OWN_SECONDS}
    p = build_policy("fleetgate", {**base, **params}, profile=PROFILE)
    assert isinstance(p, FleetgatePolicy)
    return p


def request(i: int, output: int = 256) -> RequestInfo:
    """A 2,048-token prompt with nothing cached anywhere, priced by the profile (with its long-context
    decode term, which the prefill MU carries)."""
    return RequestInfo(
        request_id=f"q{i}", model="m", input_tokens=2048, prefix_hashes=(10_000 + i,),
        prefix_block_tokens=2048, estimated_output_tokens=output, cost_mu=PROFILE.cost(2048, output),
    )  # fmt: skip


def estimate(p: FleetgatePolicy, replicas: list[ReplicaSnapshot], req: RequestInfo) -> tuple[str, float]:
    d = p.pick(req, replicas, 0.0, random.Random(0))
    return d.replica, d.scores["est_ttft_s"]


def test_the_default_is_relative_and_a_configured_rate_wins() -> None:
    default = build_policy("fleetgate", {}, profile=PROFILE)
    assert isinstance(default, FleetgatePolicy) and default.estimate.relative is True
    assert policy().estimate.relative is False
    assert policy(learned_rate_scale="relative").estimate.relative is True
    assert policy(learned_rate_scale="relative", prefill_tokens_per_s=3000.0).estimate.relative is False


def test_a_replica_at_the_median_rate_is_estimated_as_on_the_mu_rate() -> None:
    """On one idle replica set at the median, ``relative`` gives the profile's MU seconds exactly (what a
    replica without a learned rate gets), while ``seconds`` gives tokens / rate, a different scale: here the
    learned rate is the profile's own prefill speed, and the two still differ by the prefill MU's share of
    the long-context decode term."""
    req = request(0, output=2000)
    est = policy().estimate
    mu_s = est.prefill_mu(req) / (100.0 / 60.0)
    tps = 100.0 / 60.0 / PROFILE.alpha  # the profile's prefill speed in tokens/s
    fleet = [snap("a", tps), snap("b", tps), snap("c", tps)]
    _, unlearned = estimate(policy(), [snap("a", None), snap("b", None), snap("c", None)], req)
    _, rel = estimate(policy(learned_rate_scale="relative"), fleet, req)
    _, sec = estimate(policy(), fleet, req)
    assert unlearned == pytest.approx(mu_s)
    assert rel == pytest.approx(mu_s)
    assert sec == pytest.approx(2048 / tps)
    assert mu_s > 1.05 * sec  # (the decode term the cost, and so the prefill MU, carries)


def test_relative_speed_and_unlearned_replicas_on_one_scale() -> None:
    """A replica learned at half the median takes twice the MU seconds; one not learned yet counts as the
    median; the fluid queue is fed on the same scale."""
    req = request(1)
    mu_s = policy().estimate.prefill_mu(req) / (100.0 / 60.0)
    fleet = [snap("slow", 1000.0), snap("mid", 2000.0), snap("fast", 8000.0), snap("new", None)]
    p = policy(learned_rate_scale="relative")
    est = p.estimate
    assert est.pool is not None
    est.pool.update(fleet)
    assert est.pool.median == 2000.0
    cap = 100.0 / 60.0
    spt = est.prefill_mu(req) / req.input_tokens
    assert est.sec_per_mu(1000.0, spt, cap) * est.prefill_mu(req) == pytest.approx(2 * mu_s)
    assert est.sec_per_mu(est.learned_rate(fleet[3]), spt, cap) * est.prefill_mu(req) == pytest.approx(mu_s)
    # The pick goes to the fastest (its MU seconds x 2,000 / 8,000), and the queue it leaves there matches.
    name, t = estimate(p, fleet, req)
    assert name == "fast" and t == pytest.approx(mu_s / 4)
    p.on_dispatch(req, name, 0.0)
    assert p.loads.reps["fast"][1] == pytest.approx(mu_s / 4)


def test_learned_and_unlearned_replicas_of_one_speed_share_the_load_on_one_scale() -> None:
    """Two replicas of the profile's speed, one with a learned rate (exactly that speed) and one without:
    with ``seconds`` the unlearned one is charged the MU seconds, which carry the decode term, so it looks
    slower and gets fewer requests; with ``relative`` both are on the MU scale and split evenly."""
    tps = 100.0 / 60.0 / PROFILE.alpha
    replicas = [snap("learned", tps), snap("unlearned", None)]

    def split(p: FleetgatePolicy) -> dict[str, int]:
        got = {"learned": 0, "unlearned": 0}
        rng = random.Random(0)
        for i in range(60):
            req = request(100 + i, output=2000)
            d = p.pick(req, replicas, 0.0, rng)
            p.on_dispatch(req, d.replica, 0.0)
            got[d.replica] += 1
        return got

    seconds = split(policy())
    relative = split(policy(learned_rate_scale="relative"))
    assert seconds["learned"] > seconds["unlearned"] + 5  # (36 / 24 here)
    assert abs(relative["learned"] - relative["unlearned"]) <= 1
