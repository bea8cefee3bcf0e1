"""The pool loop's shell (``capacity_loop.PoolLoop``) over in-memory providers: a reclaim drains first and
the GPU goes to the taker only once the drain finished; the pool is never exceeded; reservations read at
each decision move the floors; metrics and the ledger report follow.

The providers here are fakes of ``providers.base.ReplicaProvider`` (statuses and a drain that waits until
the test lets it finish); the live test with real engine processes is tests/integration/test_pool_live.py.
"""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from fleetgate.capacity_loop import PoolMemberPlan, PoolPlan, pool_loops
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
