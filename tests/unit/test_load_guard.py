"""The load guard's signal (``filters.load_guard``, ``rates.ReplicaLoads``): time is an argument throughout.

``guard_signal: outstanding`` counts a request at full weight until it completes and decays only what was
served, from its completion; ``dispatched`` (the default) decays every request from its dispatch, so a
replica that stops answering reads lighter and lighter while it holds its work (docs/benchmarks.md,
"Session 10: a load guard that sees a stuck replica").
"""

from __future__ import annotations

import math
import random

import pytest

from fleetgate.core.lifecycle import Lifecycle, ReplicaLoad
from fleetgate.core.routing import build_policy
from fleetgate.core.routing.fleetgate import FleetgatePolicy
from fleetgate.core.routing.pipeline import PickContext
from fleetgate.core.routing.rates import ReplicaLoads
from fleetgate.core.types import ReplicaSnapshot, RequestInfo, Usage
from fleetgate.profiles import load_profile

PROFILE = load_profile("llama2-70b-h100-tp4")
TAU = 60.0


def policy(**params: object) -> FleetgatePolicy:
    p = build_policy("fleetgate", {"rate_tau_s": TAU, **params}, profile=PROFILE)
    assert isinstance(p, FleetgatePolicy)
    return p


def req(i: int, cost: float = 1.0) -> RequestInfo:
    return RequestInfo(request_id=f"q{i}", model="m", input_tokens=512, prefix_block_tokens=512, cost_mu=cost)


def signal(p: FleetgatePolicy, name: str, now: float) -> float:
    """The guard's load of ``name`` ("MU over the last tau"), as ``filter`` and ``pick`` read it."""
    k = p.guard.limits(0.0, 1, now)[0]
    st = p.loads.reps.get(name)
    return 0.0 if st is None else st[0] * k + st[2]


def test_replica_loads_hold_and_release() -> None:
    loads = ReplicaLoads(tau_s=10.0)
    loads.hold("a", 5.0)
    loads.hold("a", 3.0)
    loads.add("b", 10.0, 0.0)
    # held MU does not decay: at full weight after many time constants
    assert loads.reps["a"][2] == 8.0 and loads.held_total == 8.0
    assert loads.rate("a", 100.0) == pytest.approx(0.8)  # 8 MU over tau = 10 s
    assert loads.rate("b", 0.0) == pytest.approx(1.0)
    loads.release("a", 5.0, 6.0, 100.0)  # served 6 MU at 100 s: history from then, decaying
    assert loads.reps["a"][2] == pytest.approx(3.0) and loads.held_total == pytest.approx(3.0)
    assert loads.rate("a", 100.0) == pytest.approx(0.6 + 0.3)
    assert loads.rate("a", 110.0) == pytest.approx(0.6 * math.exp(-1.0) + 0.3)
    loads.discard("a")
    assert loads.held_total == 0.0
    loads.release("a", 3.0, 3.0, 120.0)  # a replica discarded meanwhile: nothing to release, nothing made
    assert "a" not in loads.reps and loads.held_total == 0.0
    loads.hold("c", 1.0)
    loads.release("c", 2.0, 0.0, 1.0)  # never below zero
    assert loads.reps["c"][2] == 0.0 and loads.held_total == 0.0


def test_outstanding_requests_are_not_lighter_than_served_ones() -> None:
    """N requests on each of two replicas at 0 s: one answers them at 1 s, the other never does. The held
    replica stays at N x cost while the served one decays; with ``dispatched`` both decay alike."""
    n, cost = 7, 4.0
    for mode in ("outstanding", "dispatched"):
        p = policy(guard_signal=mode)
        for i in range(n):
            p.guard.charge(f"s{i}", "stuck", cost, 0.0)
            p.guard.charge(f"h{i}", "healthy", cost, 0.0)
        for i in range(n):
            p.guard.on_complete(RequestInfo(request_id=f"h{i}", model="m"), "healthy", 1.0, cost, True)
        for now in (1.0, 30.0, TAU, 3 * TAU, 30 * TAU, 100 * TAU):
            stuck, healthy = signal(p, "stuck", now), signal(p, "healthy", now)
            assert stuck >= healthy * (1.0 - 1e-12)  # (equal at 1 s, when the served ones ended)
            if mode == "outstanding":
                assert stuck == pytest.approx(n * cost)
            else:
                assert stuck == pytest.approx(n * cost * math.exp(-now / TAU))


def _stuck_fleet(mode: str) -> tuple[FleetgatePolicy, list[ReplicaSnapshot]]:
    """``r0`` took six long requests at 0 s and has answered none; ``r1`` and ``r2`` served a steady stream
    (one request a second, each done in half a second) until 60 s."""
    p = policy(guard_signal=mode)
    fleet = [ReplicaSnapshot(f"r{i}", capacity_mu_per_min=60.0) for i in range(3)]
    for i in range(6):
        p.guard.charge(f"long{i}", "r0", 10.0, 0.0)
    for t in range(60):
        r = req(t, 2.0)
        p.guard.charge(r.request_id, f"r{1 + t % 2}", 2.0, float(t))
        p.guard.on_complete(r, f"r{1 + t % 2}", t + 0.5, 2.0, True)
    return p, fleet


def test_the_guard_drops_a_stuck_replica_with_outstanding_work() -> None:
    rng = random.Random(0)
    # dispatched MU decayed from dispatch: the stuck replica looks the lightest, the healthy ones are dropped
    p, fleet = _stuck_fleet("dispatched")
    assert signal(p, "r0", 60.0) < signal(p, "r1", 60.0)
    kept = p.guard.filter(req(100), fleet, PickContext(60.0, rng, frozenset()))
    assert [r.name for r in kept] == ["r0"]
    assert p.pick(req(100), fleet, 60.0, rng).replica == "r0"
    # outstanding work at full weight: it is the heaviest, and it is the one dropped
    p, fleet = _stuck_fleet("outstanding")
    assert signal(p, "r0", 60.0) > signal(p, "r1", 60.0)
    kept = p.guard.filter(req(100), fleet, PickContext(60.0, rng, frozenset()))
    assert sorted(r.name for r in kept) == ["r1", "r2"]
    assert p.pick(req(100), fleet, 60.0, rng).replica in {"r1", "r2"}
    # once r0 answers, its work leaves the held MU and decays from then like anyone's
    for i in range(6):
        p.guard.on_complete(RequestInfo(request_id=f"long{i}", model="m"), "r0", 60.0, 10.0, True)
    assert p.loads.held_total == 0.0
    assert signal(p, "r0", 60.0) == pytest.approx(60.0)
    assert signal(p, "r0", 60.0 + TAU) == pytest.approx(60.0 * math.exp(-1.0))


def test_a_failed_or_retried_request_is_released() -> None:
    p = policy(guard_signal="outstanding")
    p.guard.charge("a", "r0", 5.0, 0.0)
    p.guard.on_complete(RequestInfo(request_id="a", model="m"), "r0", 2.0, 0.0, False)
    # failed: no longer held; its estimate joins the history from its end
    assert p.loads.reps["r0"][2] == 0.0 and signal(p, "r0", 2.0) == pytest.approx(5.0)
    p.guard.charge("b", "r0", 3.0, 3.0)
    p.guard.charge("b", "r1", 3.0, 4.0)  # dispatched again before its outcome came back
    assert p.loads.reps["r0"][2] == 0.0 and p.loads.reps["r1"][2] == 3.0
    p.guard.on_complete(RequestInfo(request_id="b", model="m"), "r1", 5.0, 2.5, True)
    assert p.loads.held_total == 0.0
    assert signal(p, "r1", 5.0) == pytest.approx(2.5)  # settled to what it really cost
    p.guard.charge("", "r2", 4.0, 6.0)  # no id: it could never be released, so it decays as dispatched
    assert p.loads.reps["r2"][2] == 0.0 and signal(p, "r2", 6.0) == pytest.approx(4.0)


def test_guard_signal_params() -> None:
    assert policy().guard.holds is False  # the default signal: decayed from dispatch
    assert policy(guard_signal="outstanding").guard.holds is True
    with pytest.raises(ValueError, match="guard_signal: Input should be 'dispatched' or 'outstanding'"):
        policy(guard_signal="held")


@pytest.mark.parametrize("rate", [None, 2000.0])
def test_fused_pick_agrees_with_the_guard_on_outstanding_work(rate: float | None) -> None:
    """The fused ``pick`` reads the held MU as the ``load_guard`` part does: it never picks a replica the
    part drops (unless the part would drop all), with requests left outstanding for long stretches."""
    p = policy(guard_signal="outstanding", **({} if rate is None else {"prefill_tokens_per_s": rate}))
    rng = random.Random(7)
    replicas = [
        ReplicaSnapshot(f"r{j}", capacity_mu_per_min=60.0 + 10 * j, learned_prefill_tokens_per_s=1500.0 + j)
        for j in range(6)
    ]
    open_: list[tuple[RequestInfo, str]] = []
    for i in range(400):
        now = i * 0.25
        r = RequestInfo(
            request_id=f"q{i}",
            model="m",
            input_tokens=512 * (1 + i % 3),
            prefix_hashes=(i % 5, 100 + i % 11, 1000 + i),
            prefix_block_tokens=512,
            cost_mu=0.2 + (i % 7) * 0.3,
        )
        kept = p.guard.filter(r, list(replicas), PickContext(now, rng, frozenset()))
        d = p.pick(r, replicas, now, rng)
        assert len(kept) == len(replicas) or d.replica in {x.name for x in kept}
        p.on_dispatch(r, d.replica, now)
        open_.append((r, d.replica))
        if d.replica != "r0" and i % 2 == 0:  # r0 never answers; the others answer some, later
            done, rep = open_.pop(rng.randrange(len(open_)))
            if rep != "r0":
                p.on_complete(done, rep, now, done.cost_mu * 1.1, True)
            else:
                open_.append((done, rep))
    assert p.loads.held_total > 0.0
    assert p.loads.held_total == pytest.approx(sum(st[2] for st in p.loads.reps.values()))
    for r, rep in open_:  # every outcome comes back: nothing stays held
        p.on_complete(r, rep, 200.0, r.cost_mu, True)
    assert p.loads.held_total == 0.0 and all(st[2] == 0.0 for st in p.loads.reps.values())


def test_the_lifecycle_releases_what_it_dispatched() -> None:
    """Through ``Lifecycle`` (what the gateway and the simulator both call): a request is held from
    ``dispatch`` to ``finish`` / ``complete``, whatever the outcome; a failover dispatches it again."""
    p = policy(guard_signal="outstanding")
    fleet = [ReplicaSnapshot(f"r{i}", capacity_mu_per_min=60.0) for i in range(3)]
    lc: Lifecycle[object] = Lifecycle(p, PROFILE, snapshots=lambda: fleet)
    loads = {s.name: ReplicaLoad() for s in fleet}
    rng = random.Random(3)
    reqs = [req(i, 2.0) for i in range(6)]
    picked = []
    for i, r in enumerate(reqs):
        d = lc.route(r, float(i), rng)
        lc.dispatch(r, d.replica, loads[d.replica], float(i))
        picked.append(d.replica)
    assert p.loads.held_total > 0.0
    usage = Usage(prompt_tokens=512, completion_tokens=16)
    lc.complete(reqs[0], picked[0], loads[picked[0]], 10.0, usage)  # the simulator's end
    lc.finish(reqs[1], picked[1], loads[picked[1]], 10.0, usage, True)  # the gateway's, with usage
    lc.finish(reqs[2], picked[2], loads[picked[2]], 10.0, None, False)  # failed, no usage
    other = next(n for n in loads if n != picked[3])  # failover: dispatched again, then both attempts end
    lc.dispatch(reqs[3], other, loads[other], 11.0)
    lc.finish(reqs[3], other, loads[other], 12.0, usage, True)
    lc.finish(reqs[3], picked[3], loads[picked[3]], 12.0, None, False)
    for i in (4, 5):
        lc.finish(reqs[i], picked[i], loads[picked[i]], 13.0, None, True)  # the client left: neutral
    assert p.loads.held_total == 0.0 and all(st[2] == 0.0 for st in p.loads.reps.values())
    assert all(load.inflight_requests == 0 for load in loads.values())
