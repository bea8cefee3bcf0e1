"""Kubernetes discovery end to end: the provider's EndpointSlice watcher against the test API server.

The API server is tests/kubernetes/k8s_apiserver.py (test code on 127.0.0.1: no real cluster can run here);
its pods are real ``fleetgate engine sim`` processes, and readiness in the slices is their real /health.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import aiohttp
import pytest
from k8s_apiserver import DELETION_COST, ApiServer, FakeCluster

from fleetgate.providers.base import ReplicaInfo, ReplicaStatus
from fleetgate.providers.kubernetes import KubernetesProvider
from fleetgate.providers.kubernetes_config import from_kubeconfig
from fleetgate.providers.kubernetes_watch import EndpointSliceWatcher, WatchSettings

pytestmark = pytest.mark.timeout(120)

FAST = WatchSettings(timeout_s=30, idle_timeout_s=5.0, retry_initial_s=0.1, retry_max_s=0.5)


class Recorder:
    """The watcher's ChangeListener: keeps every list it was told."""

    def __init__(self) -> None:
        self.lists: list[list[ReplicaInfo]] = []

    def __call__(self, infos: Sequence[ReplicaInfo]) -> None:
        self.lists.append(list(infos))

    def ever(self, name: str, status: ReplicaStatus) -> bool:
        return any(i.name == name and i.status == status for lst in self.lists for i in lst)


def running(watcher: EndpointSliceWatcher) -> list[str]:
    return sorted(i.url for i in watcher.infos() if i.status == ReplicaStatus.RUNNING)


async def wait_until(cond: Callable[[], bool], limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def answers(url: str) -> bool:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        async with s.post(url + "/v1/chat/completions", json=body) as resp:
            return resp.status == 200 and bool((await resp.json())["choices"])


async def test_watch_follows_scale_up_scale_down_and_pod_deletion(
    k8s: tuple[FakeCluster, ApiServer, KubernetesProvider],
) -> None:
    cluster, _server, provider = k8s
    rec = Recorder()
    watcher = EndpointSliceWatcher(provider, rec, FAST)
    watcher.start()
    try:
        await wait_until(lambda: len(running(watcher)) == 2)
        assert running(watcher) == cluster.ready_urls()
        assert all([await answers(u) for u in running(watcher)])

        # scale-up through the scale subresource: new pods appear, routable only once they answer
        assert (await provider.scale_to(4)).spec_replicas == 4
        await wait_until(lambda: len(running(watcher)) == 4)
        assert running(watcher) == cluster.ready_urls()
        assert (await provider.counts()).ready == 4

        # scale-down: the drained pod (lowest deletion cost) is the one the controller removes
        victim = sorted(cluster.pods)[1]
        await provider.drain(victim)
        assert cluster.get("pods", victim)["metadata"]["annotations"][DELETION_COST] == "-1000"
        await provider.scale_to(3)
        await wait_until(lambda: victim not in {i.name for i in watcher.infos()})
        assert cluster.deleted_pods == [victim]
        assert rec.ever(victim, ReplicaStatus.DRAINING), "terminating but serving -> draining"
        assert len(running(watcher)) == 3
        # a removed replica is never told as routable again after it started draining
        seen = [i.status for lst in rec.lists for i in lst if i.name == victim]
        after = seen[seen.index(ReplicaStatus.DRAINING) :]
        assert ReplicaStatus.RUNNING not in after

        # pod deletion (remediation): the pod goes, the controller replaces it, the watcher follows
        doomed = sorted(i.name for i in watcher.infos())[0]
        await provider.restart(doomed)
        await wait_until(lambda: doomed not in {i.name for i in watcher.infos()})
        await wait_until(lambda: len(running(watcher)) == 3)
        assert running(watcher) == cluster.ready_urls()
        assert all([await answers(u) for u in running(watcher)])
        assert watcher.relists == 1, "one list, then only watch events"
    finally:
        await watcher.stop()


@pytest.mark.parametrize("as_http", [False, True], ids=["error-event", "http-410"])
async def test_stale_resource_version_relists(
    k8s: tuple[FakeCluster, ApiServer, KubernetesProvider], as_http: bool
) -> None:
    cluster, server, provider = k8s
    cluster.expired_as_http = as_http
    watcher = EndpointSliceWatcher(provider, Recorder(), FAST)
    watcher.start()
    try:
        await wait_until(lambda: len(running(watcher)) == 2)
        # bookmarks carry the version forward with no slice change (a lease write bumps the global counter)
        async with aiohttp.ClientSession() as s:
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "x"}}
            leases = server.url + "/apis/coordination.k8s.io/v1/namespaces/llm/leases"
            async with s.post(leases, json=lease) as r:
                assert r.status == 201
        await wait_until(lambda: watcher.cache.resource_version == str(cluster.rv), 5.0)

        await server.stop_http()
        cluster.scale(3)
        await cluster.wait_for(lambda: len(cluster.ready_urls()) == 3)
        cluster.compact()  # every version the watcher holds is now too old: the next watch gets a 410
        await server.start_http()
        await wait_until(lambda: len(running(watcher)) == 3)
        assert running(watcher) == cluster.ready_urls()
        assert watcher.relists == 2
    finally:
        await watcher.stop()


async def test_api_server_outage_keeps_last_known_replicas_then_resyncs(
    k8s: tuple[FakeCluster, ApiServer, KubernetesProvider],
) -> None:
    cluster, server, provider = k8s
    rec = Recorder()
    watcher = EndpointSliceWatcher(provider, rec, FAST)
    watcher.start()
    try:
        await wait_until(lambda: len(running(watcher)) == 2)
        before = running(watcher)
        told = len(rec.lists)
        await server.stop_http()
        cluster.scale(3)
        await cluster.wait_for(lambda: len(cluster.ready_urls()) == 3)
        await asyncio.sleep(1.5)  # a few seconds unreachable (the 60 s, kept short for CI)
        assert watcher.errors > 0
        assert running(watcher) == before, "the last known replicas are kept while the API is unreachable"
        assert len(rec.lists) == told
        assert all([await answers(u) for u in before])
        await server.start_http()
        await wait_until(lambda: len(running(watcher)) == 3)
        assert running(watcher) == cluster.ready_urls()
        assert watcher.relists == 1, "resumed the watch from the kept version (no relist needed)"
    finally:
        await watcher.stop()


async def test_throttled_api_server_retry_after_obeyed(
    k8s: tuple[FakeCluster, ApiServer, KubernetesProvider],
) -> None:
    cluster, _server, provider = k8s
    cluster.throttle(2, retry_after_s=1)
    watcher = EndpointSliceWatcher(provider, Recorder(), FAST)
    watcher.start()
    try:
        await wait_until(lambda: len(running(watcher)) == 2)
        slice_calls = [(t, st) for t, _m, path, st in cluster.requests if "endpointslices" in path]
        assert [st for _t, st in slice_calls[:3]] == [429, 429, 200]
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(slice_calls[:3])]
        assert all(g >= 0.95 for g in gaps), gaps
    finally:
        await watcher.stop()


async def test_kubeconfig_outside_the_cluster(
    k8s: tuple[FakeCluster, ApiServer, KubernetesProvider], tmp_path: Path
) -> None:
    """A kubeconfig (read by kubernetes_asyncio's loader) gives the server, the token and the namespace."""
    cluster, server, _provider = k8s
    cluster.token = "kc-token"
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server.url}}],
        "users": [{"name": "gw", "user": {"token": "kc-token"}}],
        "contexts": [{"name": "t", "context": {"cluster": "test", "user": "gw", "namespace": "llm"}}],
        "current-context": "t",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(kubeconfig))
    provider = await from_kubeconfig(
        deployment="engine", service="engine", port_name="http", config_file=path
    )
    assert provider.namespace == "llm"
    watcher = EndpointSliceWatcher(provider, Recorder(), FAST)
    watcher.start()
    try:
        await wait_until(lambda: len(running(watcher)) == 2)
        assert (await provider.get_scale()).spec_replicas == 2
        assert all(st != 401 for _t, _m, _p, st in cluster.requests)
    finally:
        await watcher.stop()
        await provider.close()


async def test_watch_resumes_after_the_server_ends_it(
    k8s: tuple[FakeCluster, ApiServer, KubernetesProvider],
) -> None:
    """``timeoutSeconds`` ends each watch; the next one starts from the kept version (no relist, no gap)."""
    cluster, _server, provider = k8s
    short = WatchSettings(timeout_s=1, idle_timeout_s=5.0, retry_initial_s=0.1, retry_max_s=0.5)
    watcher = EndpointSliceWatcher(provider, Recorder(), short)
    watcher.start()
    try:
        await wait_until(lambda: len(running(watcher)) == 2)
        await asyncio.sleep(2.2)
        cluster.scale(3)
        await wait_until(lambda: len(running(watcher)) == 3)
        watches = [p for _t, _m, p, _s in cluster.requests if "endpointslices" in p and "watch=1" in p]
        assert len(watches) >= 3
        assert watcher.relists == 1 and watcher.errors == 0
    finally:
        await watcher.stop()
