"""The dispatch gate (core.routing.gate) and its use by the fleetgate policy, without sockets."""

from __future__ import annotations

import random

import pytest

from fleetgate.core.routing import build_policy
from fleetgate.core.routing.fleetgate import FleetgatePolicy
from fleetgate.core.routing.gate import DispatchGate, GateParams
from fleetgate.core.types import HealthState, ReplicaSnapshot, RequestInfo


def test_holds_only_while_every_replica_is_busy_or_others_wait() -> None:
    gate: DispatchGate[str] = DispatchGate(GateParams(lead_s=0.05))
    assert not gate.should_hold(0.0)
    assert not gate.should_hold(0.05)
    assert gate.should_hold(0.2)
    gate.push("a", 1.0, now=0.0)
    assert gate.should_hold(0.0)  # no overtaking a held request on arrival


def test_releases_shortest_prefill_first_when_a_replica_is_free() -> None:
    gate: DispatchGate[str] = DispatchGate(GateParams(lead_s=0.05, aging=0.0))
    for name, size in (("long", 0.9), ("short", 0.1), ("mid", 0.4)):
        gate.push(name, size, now=0.0)
    assert gate.pop(backlog_s=0.3, now=0.1) is None  # every replica still busy
    assert gate.next_wake(0.3, now=0.1) == pytest.approx(0.35)
    assert [gate.pop(0.0, 0.4) for _ in range(3)] == ["short", "mid", "long"]
    assert gate.pop(0.0, 0.4) is None
    assert gate.next_wake(0.0, 0.4) is None
    assert (gate.held_total, gate.released_total, len(gate)) == (3, 3, 0)


def test_aging_lets_an_old_long_request_pass_new_short_ones() -> None:
    gate: DispatchGate[str] = DispatchGate(GateParams(aging=1.0))
    gate.push("old-long", 0.8, now=0.0)
    gate.push("new-short", 0.2, now=1.0)  # waited 1 s less: 0.8 - 1.0 * 1.0 < 0.2
    assert gate.pop(0.0, now=1.0) == "old-long"
    pure: DispatchGate[str] = DispatchGate(GateParams(aging=0.0))
    pure.push("old-long", 0.8, now=0.0)
    pure.push("new-short", 0.2, now=1.0)
    assert pure.pop(0.0, now=1.0) == "new-short"


def test_max_wait_valve_and_removal() -> None:
    gate: DispatchGate[str] = DispatchGate(GateParams(max_wait_s=2.0, aging=0.0))
    gate.push("a", 5.0, now=0.0)
    gate.push("b", 0.1, now=1.0)
    gate.push("c", 0.2, now=1.5)
    assert gate.remove("b")
    assert not gate.remove("b")
    assert gate.next_wake(float("inf"), now=1.0) == pytest.approx(2.0)  # nothing routable: the valve
    assert gate.pop(10.0, now=1.9) is None
    assert gate.pop(10.0, now=2.0) == "a"  # held 2 s: released whatever the backlog
    assert gate.timed_out == 1
    assert gate.pop(0.0, now=2.0) == "c"
    assert len(gate) == 0


def test_full_queue_stops_holding() -> None:
    gate: DispatchGate[int] = DispatchGate(GateParams(max_queued=2))
    gate.push(1, 0.1, 0.0)
    gate.push(2, 0.1, 0.0)
    assert not gate.should_hold(5.0)


def test_params_are_checked() -> None:
    with pytest.raises(ValueError):
        GateParams(lead_s=-1)
    with pytest.raises(ValueError):
        GateParams(max_wait_s=0)


def _snap(name: str, health: HealthState = HealthState.HEALTHY, inflight: int = 1) -> ReplicaSnapshot:
    return ReplicaSnapshot(
        name=name,
        url=f"http://127.0.0.1:1/{name}",
        health=health,
        capacity_mu_per_min=6000,
        inflight_requests=inflight,
    )


def _req(rid: str, tokens: int) -> RequestInfo:
    return RequestInfo(request_id=rid, model="m", tenant="t", input_tokens=tokens, cost_mu=float(tokens))


def policy_(**params: object) -> FleetgatePolicy:
    p = build_policy("fleetgate", params)
    assert isinstance(p, FleetgatePolicy)
    return p


def test_policy_gate_is_on_when_the_engine_prefill_rate_is_known() -> None:
    auto = policy_()
    assert auto.gate is not None and not auto.gate_active  # waits for a rate (configured or learned)
    assert auto.backlog_s([_snap("a", inflight=3)], 0.0) == 0.0  # so it never holds
    assert policy_(gate="on").gate_active
    assert policy_(prefill_tokens_per_s=1000.0).gate_active
    assert policy_(prefill_tokens_per_s=1000.0, gate="off").gate is None
    assert policy_(gate=False).gate is None  # YAML booleans
    with pytest.raises(ValueError):
        policy_(gate="sometimes")


def test_learned_prefill_rate_turns_the_automatic_gate_on_and_a_configured_one_wins() -> None:
    """Without an operator-set rate the estimate uses each replica's learned rate once the snapshots carry
    one, and ``gate: auto`` (with first-token feedback) turns on; a configured rate is used as before."""
    learned = [
        ReplicaSnapshot("a", capacity_mu_per_min=6000, learned_prefill_tokens_per_s=500.0),
        ReplicaSnapshot("b", capacity_mu_per_min=6000, learned_prefill_tokens_per_s=2000.0),
    ]
    # each replica's own learned rate in seconds (the default pools them on the MU scale since session 10)
    auto = policy_(learned_rate_noise=1.0, learned_rate_scale="seconds")
    req = _req("r0", 1000)
    d = auto.pick(req, learned, 0.0, random.Random(1))
    assert d.replica == "b" and d.scores["est_ttft_s"] == pytest.approx(0.5)  # 1,000 tokens at 2,000/s
    assert auto.gate_active and auto.estimate.feedback
    auto.on_dispatch(req, d.replica, 0.0)
    assert auto.loads.reps["b"][1] == pytest.approx(0.5)  # the fluid queue runs at b's learned rate
    busy = [ReplicaSnapshot(r.name, capacity_mu_per_min=6000, inflight_requests=1) for r in learned]
    assert auto.backlog_s(busy, 0.0) == 0.0  # nothing queued on a
    assert auto.backlog_s(busy[1:], 0.1) == pytest.approx(0.4)
    d2 = auto.pick(_req("r1", 1000), learned, 0.0, random.Random(1))  # b is above the load bound now
    assert d2.replica == "a" and d2.scores["est_ttft_s"] == pytest.approx(2.0)  # at a's 500/s
    configured = policy_(prefill_tokens_per_s=1000.0)
    d3 = configured.pick(_req("r2", 1000), learned, 0.0, random.Random(1))
    assert d3.scores["est_ttft_s"] == pytest.approx(1.0)  # the configured rate, not the learned ones
    assert policy_(gate="off").pick(_req("r3", 1000), learned, 0.0, random.Random(1)).replica == "b"


def test_backlog_is_the_least_loaded_routable_replica() -> None:
    policy = policy_(prefill_tokens_per_s=1000.0)
    reps = [_snap("a"), _snap("b"), _snap("c", HealthState.UNHEALTHY)]
    rng = random.Random(1)
    assert policy.backlog_s(reps, 0.0) == 0.0
    for i in range(2):
        req = _req(f"r{i}", 1000)
        d = policy.pick(req, reps, 0.0, rng)
        policy.on_dispatch(req, d.replica, 0.0)
    # one 1-s prefill queued on each healthy replica (the unhealthy one does not count as free)
    assert policy.backlog_s(reps, 0.0) == pytest.approx(1.0, rel=1e-6)
    assert policy.backlog_s(reps, 0.4) == pytest.approx(0.6, rel=1e-6)
    assert policy.backlog_s(reps, 2.0) == 0.0
    assert policy.gate_prefill_s(_req("x", 500)) == pytest.approx(0.5, rel=1e-6)
    assert policy.backlog_s([_snap("c", HealthState.UNHEALTHY)], 0.0) == float("inf")


def test_first_token_feedback_follows_the_engine_without_adding_up_a_constant_delay() -> None:
    policy = policy_(prefill_tokens_per_s=1000.0, first_token_feedback="on", min_subset=1)
    reps = [_snap("a")]
    rng = random.Random(1)
    reqs = [_req(f"r{i}", 1000) for i in range(3)]
    for r in reqs:
        policy.pick(r, reps, 0.0, rng)
        policy.on_dispatch(r, "a", 0.0)
    assert policy.backlog_s(reps, 0.0) == pytest.approx(3.0)
    # every first token arrives 0.1 s after the model says its prefill ends: the queue moves by 0.1 once
    policy.on_first_token(reqs[0], "a", 1.1)
    assert policy.backlog_s(reps, 1.1) == pytest.approx(2.0)
    policy.on_first_token(reqs[1], "a", 2.1)
    assert policy.backlog_s(reps, 2.1) == pytest.approx(1.0)
    # the engine turns out twice as fast for the last one: the queue is pulled in
    policy.on_first_token(reqs[2], "a", 2.6)
    assert policy.backlog_s(reps, 2.6) == 0.0


def test_an_idle_replica_has_no_backlog_whatever_the_estimate() -> None:
    """A configured prefill rate far below the engine's must not hold requests while a replica idles."""
    policy = policy_(prefill_tokens_per_s=1.0)  # 1,000 s per request by the estimate
    rng = random.Random(1)
    req = _req("r0", 1000)
    d = policy.pick(req, [_snap("a")], 0.0, rng)
    policy.on_dispatch(req, d.replica, 0.0)
    assert policy.backlog_s([_snap("a", inflight=1)], 5.0) == pytest.approx(995.0)
    assert policy.backlog_s([_snap("a", inflight=0)], 5.0) == 0.0  # it finished: idle


def test_first_token_feedback_follows_the_gate_by_default() -> None:
    assert policy_(prefill_tokens_per_s=1000.0).estimate.feedback
    assert not policy_().estimate.feedback
    assert policy_(gate="on").estimate.feedback
    assert not policy_(prefill_tokens_per_s=1000.0, first_token_feedback="off").estimate.feedback
    assert policy_(first_token_feedback="on").estimate.feedback
    assert policy_(first_token_feedback=True).estimate.feedback
