"""A step load through ``fleetgate serve`` with ``provider: {kind: kubernetes}`` and ``autoscaler:``.

The local-provider scenario of tests/integration/test_serve_control.py, on the test API server
(k8s_apiserver.py, 127.0.0.1; its pods are real ``fleetgate engine sim`` processes): the step up patches the
Deployment's ``scale`` up and the new pods serve once ready; the drop scales down only after the delay, the
pod taken out drained first (its ``pod-deletion-cost`` set before the lowering PATCH); every request sent
comes back complete. Observed from outside: the API server's object history, the pods' own
``/admin/stats``, the gateway's ``/metrics`` and the client's replies.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from k8s_apiserver import DELETION_COST, ApiServer, FakeCluster
from k8s_gateways import serve_files, start_serve

from fleetgate.profiles import load_profile
from step_load import Load

pytestmark = pytest.mark.timeout(150)

MAX_REPLICAS = 3
BODY = {"model": "m", "prompt": "hello there", "max_tokens": 64}


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[FakeCluster, ApiServer]]:
    engine = [sys.executable, "-m", "fleetgate.cli", "engine", "sim", "--port", "0", "--model", "m"]
    c = FakeCluster(
        replicas=1,
        engine_command=[*engine, "--time-scale", "0.05"],
        bookmark_interval_s=0.3,
        termination_grace_s=0.5,
    )
    server = ApiServer(c)
    await c.start()
    await server.start_http()
    try:
        yield c, server
    finally:
        await server.stop_http()
        await c.close()


def _start_serve(server: ApiServer, tmp_path: Path, autoscaler: dict[str, Any]) -> Any:
    deployment = {"cost_profile": "fleetgate-sim", "demand_window_s": 5.0, "autoscaler": autoscaler}
    config, env = serve_files(tmp_path, server.url, token="serve-token", deployment=deployment)
    return start_serve(config, env)


def _scale_history(c: FakeCluster) -> list[tuple[int, int]]:
    """(resourceVersion, spec.replicas) of every Deployment write, in order."""
    return [(rv, int(o["spec"]["replicas"])) for rv, res, _ns, _t, o in c.history if res == "deployments"]


def _first_rv(c: FakeCluster, pod: str, cond: Callable[[dict[str, Any]], bool]) -> int | None:
    """resourceVersion of the first write of ``pod`` whose metadata meets ``cond``."""
    for rv, res, _ns, _t, o in c.history:
        if res == "pods" and o["metadata"]["name"] == pod and cond(o["metadata"]):
            return rv
    return None


def _trace(c: FakeCluster) -> list[tuple[Any, ...]]:
    """Deployment and pod writes, for a failure message: (rv, replicas) or (rv, pod, cost, deleting)."""
    out: list[tuple[Any, ...]] = []
    for rv, res, _ns, _t, o in c.history:
        m = o["metadata"]
        if res == "deployments":
            out.append((rv, o["spec"]["replicas"]))
        elif res == "pods":
            out.append(
                (rv, m["name"], (m.get("annotations") or {}).get(DELETION_COST), "deletionTimestamp" in m)
            )
    return out


async def test_serve_kubernetes_steps_up_then_down_losing_nothing(
    cluster: tuple[FakeCluster, ApiServer], tmp_path: Path
) -> None:
    """Step 10 % -> 90 % -> 10 % of three replicas' capacity through ``serve``: the Deployment is scaled up
    on the step, the new pods serve, the drop scales down only after the delay, draining first, and every
    request is answered."""
    c, server = cluster
    c.token = "serve-token"
    await c.wait_for(lambda: len(c.ready_urls()) == 1)
    profile = load_profile("fleetgate-sim")
    mu = profile.estimate(2, 64)
    params = {
        "policy": "fleetgate",
        "min_replicas": 1,
        "max_replicas": MAX_REPLICAS,
        # a replica "full" at two requests per second (as in the local-provider test)
        "target_utilisation": 120.0 * mu / profile.capacity_mu_per_min,
        "stable_window_s": 4.0,
        "panic_window_s": 1.0,
        "scale_down_delay_s": 5.0,
        "scale_up_cooldown_s": 4.0,
        "scale_down_interval_s": 1.0,
        "idle_to_min_s": 600.0,
    }
    first = set(c.pods)
    received: dict[str, int] = {}  # pod -> requests it received (its own /admin/stats)
    gw = _start_serve(server, tmp_path, params)
    try:
        url = await asyncio.to_thread(gw.wait_ready, 60.0)
        load = Load(url, BODY)
        full_rps = 2.0 * MAX_REPLICAS
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

            async def poll_pods() -> None:
                while True:
                    for name, pod in list(c.pods.items()):
                        if pod.port is None:
                            continue
                        try:
                            async with session.get(f"http://127.0.0.1:{pod.port}/admin/stats") as r:
                                stats = await r.json()
                            received[name] = int(stats["server"]["requests_received"])
                        except (aiohttp.ClientError, TimeoutError):
                            pass  # terminating: its last count stays
                    await asyncio.sleep(0.25)

            poller = asyncio.create_task(poll_pods())
            try:
                await load.drive(session, 0.1 * full_rps, 3.0)
                assert c.desired == 1 and set(c.pods) == first, "scaled before the step"
                rv_step = c.rv

                def new_pods_serving() -> bool:
                    new = set(c.pods) - first
                    return len(new) >= MAX_REPLICAS - 1 and all(received.get(p, 0) > 0 for p in new)

                # 90 % until every new pod has served requests, then 3 s more (at most 25 s)
                await load.drive(session, 0.9 * full_rps, 25.0, until=new_pods_serving, then_s=3.0)
                ups = [n for rv, n in _scale_history(c) if rv > rv_step]
                assert ups and max(ups) == MAX_REPLICAS, (
                    f"no scale-up PATCH to the maximum on the step: {ups}"
                )
                patches = [p for _t, b, m, p in c.calls if m == "PATCH" and b == "serve-token"]
                assert "/apis/apps/v1/namespaces/llm/deployments/engine/scale" in patches, patches
                assert c.deleted_pods == [], "a pod was deleted on the step up"
                new = set(c.pods) - first
                assert len(new) == MAX_REPLICAS - 1 and all(received.get(p, 0) > 0 for p in new), (
                    new,
                    received,
                    gw.output[-2000:],
                )
                peak = c.desired
                t_drop = time.monotonic()
                t_down: list[float] = []

                def scaled_down() -> bool:
                    if not t_down and c.desired < peak:
                        t_down.append(time.monotonic())
                    return bool(t_down) and bool(c.deleted_pods)

                # 10 % until the first scale-down, then 3 s more while the drained pod stops (at most 25 s)
                await load.drive(session, 0.1 * full_rps, 25.0, until=scaled_down, then_s=3.0)
            finally:
                poller.cancel()
        assert t_down, f"no scale-down after the drop: {_scale_history(c)[-5:]}"
        assert t_down[0] - t_drop >= params["scale_down_delay_s"] - 1.0, "scaled down before the delay"
        # Drained first: each pod a scale-down removed carried its deletion cost before the PATCH that
        # lowered the count (the last Deployment write before the pod's deletion), so the ReplicaSet took it.
        assert c.deleted_pods, "the scale-down removed no pod"
        for pod in c.deleted_pods:
            deleted = _first_rv(c, pod, lambda m: bool(m.get("deletionTimestamp")))
            assert deleted is not None
            lowered = max(rv for rv, _n in _scale_history(c) if rv < deleted)
            marked = _first_rv(c, pod, lambda m: DELETION_COST in (m.get("annotations") or {}))
            assert marked is not None and marked < lowered, (pod, marked, lowered, _trace(c))
        # Zero lost: every request sent got a complete answer, through the scale-up and the drained
        # scale-down.
        assert load.failed == [], load.failed[:5]
        assert load.ok == load.sent > 40
        print(
            f"k8s step: up to {max(ups)} pods ({sorted(received.items())}), first scale-down "
            f"{t_down[0] - t_drop:.1f} s after the drop, removed {c.deleted_pods}, "
            f"{load.ok} requests all answered"
        )
    finally:
        gw.kill()
