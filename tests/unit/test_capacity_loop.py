"""The pool loop's shell (``capacity_loop.PoolLoop``) over in-memory providers: a reclaim drains first and
the GPU goes to the taker only once the drain finished; the pool is never exceeded; reservations read at
each decision move the floors; metrics and the ledger report follow.

The providers here are fakes of ``providers.base.ReplicaProvider`` (statuses and a drain that waits until
the test lets it finish); the live test with real engine processes is tests/integration/test_pool_live.py.
"""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from fleetgate.autoscaler.loop import provider_counts
from fleetgate.capacity_loop import LentReplicas, PoolMemberPlan, PoolPlan, pool_loops
from fleetgate.config import parse_config
from fleetgate.control import pool_plans
from fleetgate.core.capacity import AllocatorParams
from fleetgate.providers.base import ReplicaInfo, ReplicaList, ReplicaStatus


class FakeProvider:
    """Replicas by status; shrinking marks the victims draining and waits for ``drained`` to be set."""

    def __init__(self, name: str, running: int) -> None:
        self.name = name
        self.replicas = [ReplicaInfo(f"{name}-{i}", f"http://{name}-{i}") for i in range(running)]
        self.calls: list[int] = []
        self.drained = asyncio.Event()

    async def list(self) -> ReplicaList:
        return list(self.replicas)

    async def scale_to(self, replicas: int) -> ReplicaList:
        self.calls.append(replicas)
        live = [r for r in self.replicas if r.status != ReplicaStatus.DRAINING]
        if replicas > len(live):
            n = len(self.replicas)
            self.replicas += [ReplicaInfo(f"{self.name}-{n + i}", "u") for i in range(replicas - len(live))]
        elif replicas < len(live):
            victims = {r.name for r in live[replicas:]}
            self.replicas = [
                ReplicaInfo(r.name, r.url, ReplicaStatus.DRAINING) if r.name in victims else r
                for r in self.replicas
            ]
            await self.drained.wait()  # requests in flight finish
            self.replicas = [r for r in self.replicas if r.name not in victims]
        return list(self.replicas)

    async def restart(self, name: str) -> ReplicaInfo:
        raise NotImplementedError

    async def drain(self, name: str) -> None:
        return None


def _gpus(*providers: FakeProvider) -> int:
    return sum(len(p.replicas) for p in providers)  # 1 GPU per replica, draining ones included


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_reclaim_drains_first_and_hands_the_gpu_over_once_drained() -> None:
    member = {"gpus_per_replica": 1, "capacity_mu_per_min": 100.0, "target_utilisation": 0.7}
    plan = PoolPlan(
        name="gpus",
        gpus=4,
        members=(
            PoolMemberPlan(model="a", replicas=1, **member),  # type: ignore[arg-type]
            PoolMemberPlan(model="b", replicas=3, **member),  # type: ignore[arg-type]
        ),
        params=AllocatorParams(reclaim_after_s=5.0),
    )
    a, b = FakeProvider("a", 1), FakeProvider("b", 3)
    desired = {"a": 1, "b": 3}
    sold = {"a": 70.0, "b": 70.0}  # one replica each
    now = [0.0]
    registry = CollectorRegistry()
    (loop,) = pool_loops(
        [plan],
        {"a": a, "b": b},
        {m: (lambda m=m: desired[m]) for m in desired},
        lambda m: sold[m],
        registry=registry,
        interval_s=1.0,
        clock=lambda: now[0],
        used=lambda m: 10.0,
    ).values()

    await loop.step()
    assert (a.calls, b.calls) == ([], [])  # 1 + 3 = 4 GPUs: nothing to do

    desired["a"] = 3  # A's burst: the fair share is now 2 + 2
    await loop.step()
    assert (a.calls, b.calls) == ([], [])  # B keeps its replicas for reclaim_after_s (hysteresis)
    now[0] = 5.0
    await loop.step()
    await _settle()
    assert b.calls == [2] and a.calls == []  # B drains one first ...
    assert [r.status for r in b.replicas].count(ReplicaStatus.DRAINING) == 1
    for _ in range(3):  # ... and A gets nothing while B's replica still holds its GPU
        now[0] += 1.0
        await loop.step()
        assert a.calls == [] and _gpus(a, b) <= 4
    b.drained.set()
    await _settle()
    now[0] += 1.0
    await loop.step()
    await _settle()
    assert a.calls == [2] and _gpus(a, b) == 4
    assert (
        registry.get_sample_value(
            "fleetgate_pool_reclaimed_replicas_total", {"pool": "gpus", "deployment": "b"}
        )
        == 1.0
    )
    assert loop.last is not None
    report = loop.last.report({"b": {"rb": 4.0}})
    deps = {d["deployment"]: d for d in report["deployments"]}  # type: ignore[attr-defined]
    # the view of that decision: A's new replica not yet started, B's GPU free for it
    assert (report["gpus_used"], report["floor_gpus"], report["reclaimed_replicas"]) == (3, 2, 1)
    assert deps["b"]["reclaimed_replicas"] == 1 and deps["b"]["tenants"] == [
        {"tenant": "rb", "used_mu_per_min": 4.0}
    ]
    assert deps["a"]["headroom_mu_per_min"] == deps["a"]["capacity_mu_per_min"] - 10.0

    # a reservation raised at run time moves B's floor at the next decision: floors never wait
    sold["b"] = 210.0  # 3 replicas
    desired["a"] = 3
    now[0] += 1.0
    await loop.step()
    await _settle()
    assert a.calls[-1] == 1  # A drains down to its fair share above the floors ...
    assert (
        registry.get_sample_value("fleetgate_pool_floor_replicas", {"pool": "gpus", "deployment": "b"}) == 3.0
    )
    assert (
        registry.get_sample_value(
            "fleetgate_pool_guaranteed_mu_per_minute", {"pool": "gpus", "deployment": "b"}
        )
        == 210.0
    )  # ... the pool allocates B its 3 floor replicas at once: all it sold is guaranteed
    a.drained.set()
    await _settle()
    now[0] += 1.0
    await loop.step()
    await _settle()
    assert b.calls[-1] == 3 and _gpus(a, b) == 4
    await loop.stop()


async def test_idle_gpus_are_lent_up_to_max_replicas_and_taken_back_drained_first() -> None:
    """A pool of 4 GPUs, two 1-GPU deployments wanting one replica each, with ``max_replicas`` (what
    ``control.pool_plans`` takes from their autoscalers): the 2 idle GPUs run one lent replica each; their
    autoscalers do not see the lent ones; when A's demand grows to 3, its lent replica becomes demand-backed
    in place and B's lent one is drained (before A starts into its GPU), never a demand-backed one."""
    member = {"gpus_per_replica": 1, "capacity_mu_per_min": 100.0, "target_utilisation": 0.7}
    plan = PoolPlan(
        name="gpus",
        gpus=4,
        members=(
            PoolMemberPlan(model="a", replicas=1, max_replicas=4, **member),  # type: ignore[arg-type]
            PoolMemberPlan(model="b", replicas=1, max_replicas=4, **member),  # type: ignore[arg-type]
        ),
        params=AllocatorParams(reclaim_after_s=30.0),
    )
    a, b = FakeProvider("a", 1), FakeProvider("b", 1)
    desired = {"a": 1, "b": 1}
    now = [0.0]
    registry = CollectorRegistry()
    lent = LentReplicas()
    (loop,) = pool_loops(
        [plan],
        {"a": a, "b": b},
        {m: (lambda m=m: desired[m]) for m in desired},
        lambda m: 0.0,
        registry=registry,
        interval_s=1.0,
        clock=lambda: now[0],
        lent=lent,
    ).values()

    await loop.step()
    await _settle()
    assert (a.calls, b.calls) == ([2], [2]) and _gpus(a, b) == 4  # one lent replica each
    assert registry.get_sample_value("fleetgate_pool_lent_replicas", {"pool": "gpus", "deployment": "a"}) == 1
    assert loop.last is not None and loop.last.report()["lent_replicas"] == 2
    # what the autoscalers read: the replicas that back their demand, not the warm headroom
    counted = await lent.counts("a", provider_counts(a))()  # type: ignore[misc]
    assert (counted.current, counted.ready) == (1, 1)
    await loop.step()
    await _settle()
    assert (a.calls, b.calls) == ([2], [2])  # no flapping under constant inputs

    desired["a"] = 3  # A's burst: its lent replica backs demand now, B's lent one is taken back at once
    now[0] += 1.0
    await loop.step()
    await _settle()
    assert b.calls == [2, 1]
    assert [r.status for r in b.replicas].count(ReplicaStatus.DRAINING) == 1  # drained, not killed
    assert a.calls == [2]  # nothing started into a GPU still draining
    counted = await lent.counts("a", provider_counts(a))()  # type: ignore[misc]
    assert counted.current == 2  # the formerly lent replica counts as A's own: no restart
    now[0] += 1.0
    await loop.step()
    await _settle()
    assert a.calls == [2] and _gpus(a, b) == 4
    b.drained.set()
    await _settle()
    now[0] += 1.0
    await loop.step()
    await _settle()
    assert a.calls == [2, 3] and len(b.replicas) == 1 and _gpus(a, b) == 4
    assert registry.get_sample_value("fleetgate_pool_lent_replicas", {"pool": "gpus", "deployment": "b"}) == 0
    await loop.stop()


def test_pool_plans_lend_up_to_the_autoscaler_bounds() -> None:
    """``serve``'s plans: a deployment with a scaling autoscaler may be lent up to its ``max_replicas``; a
    fixed count (``static``) or none is lent nothing; ``lend_idle_gpus: false`` turns lending off."""
    engine = {"kind": "local", "replicas": 1}
    doc = {
        "pools": [{"name": "gpus", "gpus": 4}],
        "deployments": [
            {
                "model": "a",
                "pool": "gpus",
                "provider": engine,
                "autoscaler": {"policy": "fleetgate", "max_replicas": 3},
            },
            {
                "model": "b",
                "pool": "gpus",
                "provider": engine,
                "autoscaler": {"policy": "kpa", "max_replicas": 2},
            },
            {
                "model": "c",
                "pool": "gpus",
                "provider": engine,
                "autoscaler": {"policy": "static", "replicas": 1},
            },
            {"model": "d", "pool": "gpus", "provider": engine},
        ],
    }
    (plan,) = pool_plans(parse_config(doc))
    assert [m.max_replicas for m in plan.members] == [3, 2, None, None]
    assert plan.params.lend_idle_gpus
    doc["pools"] = [{"name": "gpus", "gpus": 4, "lend_idle_gpus": False}]
    (plan,) = pool_plans(parse_config(doc))
    assert not plan.params.lend_idle_gpus
