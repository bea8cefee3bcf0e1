"""core/leader.py: the election decision (acquire, renew, wait, take over, step down), no I/O.

A tiny compare-and-swap store stands in for the Lease/Redis key here (``version`` bumps on every write and a
write at a stale version is refused), so several candidates can be interleaved deterministically.
"""

from __future__ import annotations

import pytest

from fleetgate.core.leader import ElectionTiming, LeaderElection, LeaseRecord

T = ElectionTiming(lease_duration_s=10.0, renew_deadline_s=7.0, retry_period_s=2.0)


class Store:
    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0

    def step(self, cand: LeaderElection, now: float, wall: float | None = None) -> bool:
        """One candidate's read-decide-write round; True when its write landed."""
        seen, version = self.record, self.version
        cand.observe(seen, now)
        want = cand.attempt(now, 1e9 + now if wall is None else wall)
        if want is None:
            return False
        if version != self.version:  # someone wrote in between: compare-and-swap fails
            cand.lost()
            return False
        self.record, self.version = want, self.version + 1
        cand.written(want, now)
        return True


def test_first_candidate_creates_the_lease_and_leads() -> None:
    store, a = Store(), LeaderElection("a", T)
    assert not a.leading(0.0)
    assert store.step(a, 0.0)
    assert a.leading(0.0)
    assert store.record == LeaseRecord("a", 10.0, 1e9, 1e9, 0)


def test_holder_renews_keeping_acquire_time_and_transitions() -> None:
    store, a = Store(), LeaderElection("a", T)
    store.step(a, 0.0)
    assert store.step(a, 2.0)
    assert store.record is not None
    assert (store.record.acquired_at, store.record.renewed_at, store.record.transitions) == (1e9, 1e9 + 2, 0)
    assert a.leading(8.9) and not a.leading(9.0)  # renew deadline counts from the last renewal sent


def test_follower_waits_for_a_live_lease_then_takes_over_after_its_duration() -> None:
    store, a, b = Store(), LeaderElection("a", T), LeaderElection("b", T)
    for t in (0.0, 2.0, 4.0):  # a renews every 2 s, b reads half a second later
        assert store.step(a, t)
        assert not store.step(b, t + 0.5)
        assert not b.leading(t + 0.5)
    # a dies after its renewal at 4.0; b last saw the record change at 4.5
    assert not store.step(b, 14.4)
    assert store.step(b, 14.5)
    assert b.leading(14.5)
    assert store.record is not None and store.record.holder == "b" and store.record.transitions == 1
    assert not a.leading(14.5)  # and the old leader had stopped acting long before: 4.0 + 7 s


def test_expiry_uses_the_followers_clock_not_the_records_wall_time() -> None:
    """A holder whose wall clock is far behind still holds its lease while it keeps renewing."""
    store, a, b = Store(), LeaderElection("a", T), LeaderElection("b", T)
    for t in range(0, 30, 2):
        store.step(a, float(t), wall=0.0 + t * 1e-6)  # the record's renewTime looks ancient
        assert not store.step(b, t + 1.0)
    assert a.leading(29.0)


def test_an_unchanged_record_is_not_a_renewal() -> None:
    """Reading the same record again does not restart the follower's expiry clock."""
    b = LeaderElection("b", T)
    rec = LeaseRecord("a", 10.0, 5.0, 5.0, 3)
    b.observe(rec, 0.0)
    b.observe(LeaseRecord("a", 10.0, 5.0, 5.0, 3), 6.0)
    assert b.attempt(9.9, 100.0) is None
    taken = b.attempt(10.0, 100.0)
    assert taken == LeaseRecord("b", 10.0, 100.0, 100.0, 4)


def test_two_candidates_racing_for_an_expired_lease_one_wins() -> None:
    store, b, c = Store(), LeaderElection("b", T), LeaderElection("c", T)
    store.record, store.version = LeaseRecord("a", 10.0, 0.0, 0.0, 0), 1
    b.observe(store.record, 0.0)
    c.observe(store.record, 0.0)
    want_b, want_c = b.attempt(10.0, 10.0), c.attempt(10.0, 10.0)
    assert want_b is not None and want_c is not None
    # both read version 1; b writes first, c's compare-and-swap at version 1 then fails
    store.record, store.version = want_b, 2
    b.written(want_b, 10.0)
    c.lost()
    assert b.leading(10.0) and not c.leading(10.0)
    assert not store.step(c, 10.5)  # c now sees b's fresh lease


def test_leader_that_cannot_renew_steps_down_before_anyone_can_take_over() -> None:
    a = LeaderElection("a", T)
    rec = a.attempt(0.0, 0.0)
    assert rec is not None
    a.written(rec, 0.0)
    b = LeaderElection("b", T)
    b.observe(rec, 0.0)
    for t in (2.0, 4.0, 6.0):  # renewals fail (store unreachable): nothing written
        assert a.leading(t)
    assert not a.leading(7.0)
    assert b.attempt(9.9, 9.9) is None  # the old leader stopped 3 s before b may take over
    assert b.attempt(10.0, 10.0) is not None


def test_release_hands_the_lease_back_for_an_immediate_takeover() -> None:
    store, a, b = Store(), LeaderElection("a", T), LeaderElection("b", T)
    store.step(a, 0.0)
    store.step(b, 0.5)
    released = a.release(1e9 + 1)
    assert released is not None and released.holder == "" and not a.leading(1.0)
    store.record, store.version = released, store.version + 1
    assert store.step(b, 1.5)
    assert b.leading(1.5) and store.record is not None and store.record.transitions == 1
    assert LeaderElection("c", T).release(0.0) is None  # not the holder: nothing to hand back


def test_next_try_is_sooner_when_the_observed_lease_runs_out() -> None:
    b = LeaderElection("b", T)
    b.observe(LeaseRecord("a", 10.0, 0.0, 0.0), 0.0)
    assert b.next_try_in(1.0) == 2.0
    assert b.next_try_in(9.0) == pytest.approx(1.01)
    a = LeaderElection("a", T)
    assert a.next_try_in(0.0) == 2.0


def test_timing_must_leave_the_old_leader_time_to_stop() -> None:
    with pytest.raises(ValueError):
        ElectionTiming(lease_duration_s=5.0, renew_deadline_s=5.0, retry_period_s=1.0)
    with pytest.raises(ValueError):
        LeaderElection("", T)


def test_config_election_needs_its_store() -> None:
    from fleetgate.config import ConfigError, parse_config

    k8s = {"kind": "kubernetes", "deployment": "engine", "service": "engine"}
    with pytest.raises(ConfigError) as err:
        parse_config({
            "deployments": [
                {"model": "a", "provider": {"kind": "local"}, "leader_election": {"kind": "lease"}},
                {"model": "b", "provider": k8s, "leader_election": {"kind": "redis"}},
                {"model": "c", "provider": k8s},  # auto: the Lease
            ]
        })  # fmt: skip
    assert str(err.value).splitlines() == [
        "deployments.0.leader_election: kind lease needs `provider: {kind: kubernetes}`",
        "deployments.1.leader_election: kind redis needs `admission.store: {kind: redis, url: ...}`",
    ]
    with pytest.raises(ConfigError, match="retry_period_s < renew_deadline_s < lease_duration_s"):
        parse_config({"deployments": [{"model": "a", "leader_election": {"renew_deadline_s": 20}}]})


async def test_autoscaler_loop_steps_only_while_leading_and_drops_its_gauges_after() -> None:
    import asyncio

    from prometheus_client import CollectorRegistry

    from fleetgate.autoscaler import AutoscalerLoop, ReplicaCounts
    from fleetgate.core.autoscale import DemandMeter, build_autoscaler

    leading = [False]
    scaled: list[int] = []

    class Target:
        async def scale_to(self, n: int) -> list[object]:
            scaled.append(n)
            return []

    reg = CollectorRegistry()
    loop = AutoscalerLoop(
        deployment="m", autoscaler=build_autoscaler("static", {"replicas": 3}), meter=DemandMeter(),
        counts=lambda: ReplicaCounts(current=1, ready=1, starting=0), target=Target(),
        capacity_mu_per_min=100.0, registry=reg, interval_s=0.02, leading=lambda: leading[0],
    )  # fmt: skip
    gauge = "fleetgate_autoscaler_desired_replicas"
    await loop.start()
    try:
        await asyncio.sleep(0.1)
        assert scaled == [] and reg.get_sample_value(gauge, {"deployment": "m"}) is None  # a follower
        leading[0] = True
        await asyncio.sleep(0.1)
        assert scaled and set(scaled) == {3}
        assert reg.get_sample_value(gauge, {"deployment": "m"}) == 3
        leading[0] = False
        await asyncio.sleep(0.1)
        assert reg.get_sample_value(gauge, {"deployment": "m"}) is None and loop.desired is None
    finally:
        await loop.stop()


async def test_pool_loop_allocates_only_on_the_pool_leader() -> None:
    import asyncio

    from fleetgate.capacity_loop import PoolLoop, PoolMemberPlan, PoolPlan
    from fleetgate.providers.base import ReplicaInfo, ReplicaStatus

    scaled: list[int] = []

    class Provider:
        async def list(self) -> list[ReplicaInfo]:
            return [ReplicaInfo("r0", "http://127.0.0.1:1", ReplicaStatus.RUNNING)]

        async def scale_to(self, n: int) -> list[ReplicaInfo]:
            scaled.append(n)
            return await self.list()

    plan = PoolPlan("p", 4, (PoolMemberPlan("m", 1, 100.0, 0.7, replicas=3),))
    leading = [False]
    loop = PoolLoop(plan, {"m": Provider()}, {}, lambda _m: 0.0, interval_s=0.02, leading=lambda: leading[0])
    await loop.start()
    try:
        await asyncio.sleep(0.1)
        assert scaled == [] and loop.last is None  # a follower allocates nothing
        leading[0] = True
        await asyncio.sleep(0.2)
        await loop.wait_applied()
        assert scaled and scaled[-1] == 3
    finally:
        await loop.stop()


def test_two_elected_deployments_in_one_gateway_share_the_leader_gauge() -> None:
    from prometheus_client import generate_latest

    from fleetgate.config import parse_config
    from fleetgate.control import control_plane
    from fleetgate.runtime import build_gateway

    def k8s(name: str) -> dict[str, str]:
        return {"kind": "kubernetes", "deployment": name, "service": name}

    cfg = parse_config(
        {"deployments": [{"model": "a", "provider": k8s("a")}, {"model": "b", "provider": k8s("b")}]}
    )
    plane = control_plane(cfg)
    assert set(plane.elections) == {"a", "b"}
    gw = build_gateway(cfg, providers=plane.providers, elections=plane.elections)
    text = generate_latest(gw.proxy.metrics.registry).decode()
    assert 'fleetgate_leader{deployment="a"} 0.0' in text and 'fleetgate_leader{deployment="b"} 0.0' in text
