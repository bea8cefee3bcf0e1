"""KubernetesReplicaProvider (the ReplicaProvider protocol on Kubernetes) against the test API server.

Pods are real ``fleetgate engine sim`` processes (tests/kubernetes/k8s_apiserver.py, test code, 127.0.0.1).
"""

from __future__ import annotations

import time

import pytest
from k8s_apiserver import DELETION_COST, ApiServer, FakeCluster

from fleetgate.providers.base import ProviderError, ReplicaInfo, ReplicaStatus
from fleetgate.providers.kubernetes import KubernetesProvider
from fleetgate.providers.kubernetes_replicas import KubernetesReplicaProvider
from fleetgate.providers.kubernetes_watch import WatchSettings

pytestmark = pytest.mark.timeout(120)


def running(infos: list[ReplicaInfo]) -> list[str]:
    return sorted(i.name for i in infos if i.status == ReplicaStatus.RUNNING)


async def test_scale_down_drains_the_chosen_replica_and_only_its_pod_goes(
    k8s: tuple[FakeCluster, ApiServer, KubernetesProvider],
) -> None:
    cluster, _server, api = k8s
    drained: list[tuple[str, float, bool]] = []  # name, when, pod still there

    async def drain_hook(name: str, _timeout_s: float) -> None:
        drained.append((name, time.monotonic(), name in cluster.pods and not cluster.pods[name].terminating))

    told: list[list[ReplicaInfo]] = []
    prov = KubernetesReplicaProvider(
        api, on_change=lambda infos: told.append(list(infos)), drain_hook=drain_hook,
        watch=WatchSettings(timeout_s=30, retry_initial_s=0.1, retry_max_s=0.5),
    )  # fmt: skip
    await prov.start()
    try:
        await cluster.wait_for(lambda: len(running(prov.watcher.infos())) == 2)
        await prov.scale_to(3)
        await cluster.wait_for(lambda: len(running(prov.watcher.infos())) == 3)
        counts = await prov.counts()
        assert (counts.current, counts.ready, counts.starting) == (3, 3, 0)
        assert told and running(told[-1]) == running(await prov.list())

        before = running(await prov.list())
        await prov.scale_to(2)
        victim = max(before)  # the newest ready pod
        assert [d[0] for d in drained] == [victim]
        assert drained[0][2], "drained while its pod still ran, before the count went down"
        seen = [i.status for lst in told for i in lst if i.name == victim]
        assert ReplicaStatus.RUNNING not in seen[seen.index(ReplicaStatus.DRAINING) :], "never routable again"
        assert cluster.get("pods", victim)["metadata"]["annotations"][DELETION_COST] == "-1000"
        await cluster.wait_for(lambda: victim not in {i.name for i in prov.watcher.infos()})
        assert cluster.deleted_pods == [victim], "no other (busy) pod removed"
        assert running(await prov.list()) == sorted(set(before) - {victim})

        # remediation: delete the pod; its replacement becomes routable
        doomed = min(running(await prov.list()))
        info = await prov.restart(doomed)
        assert info.status == ReplicaStatus.DRAINING
        await cluster.wait_for(lambda: doomed not in {i.name for i in prov.watcher.infos()})
        await cluster.wait_for(lambda: len(running(prov.watcher.infos())) == 2)
        assert cluster.deleted_pods == [victim, doomed]
        with pytest.raises(ProviderError):
            await prov.restart("no-such-pod")
        with pytest.raises(ProviderError):
            await prov.scale_to(-1)
    finally:
        await prov.stop()
