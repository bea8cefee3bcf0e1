"""What the tests of several ``fleetgate serve`` gateways on one engine Deployment share (tests/kubernetes and
tests/netfaults): each gateway's kubeconfig and serve config, who leads, who scaled, and the watch of a
leadership hand-over. Test code; the API server is k8s_apiserver.py's."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from k8s_apiserver import FakeCluster

from fleetgate.providers.local import free_port
from integration_tools import integration_tools


def serve_files(
    tmp: Path,
    api_url: str,
    *,
    token: str,
    deployment: dict[str, Any],
    gateway: dict[str, Any] | None = None,
    top: dict[str, Any] | None = None,
    name: str = "serve",
) -> tuple[Path, dict[str, str]]:
    """A ``fleetgate serve`` config for model ``m`` on the Deployment ``engine`` (its Service ``engine``,
    port ``http``) plus ``deployment``'s keys, and the environment with a kubeconfig whose bearer token is
    ``token`` (so the API server can tell who made each call). ``gateway``: default a free 127.0.0.1 port."""
    kubeconfig = tmp / f"kubeconfig-{name}"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "c", "cluster": {"server": api_url}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "t", "context": {"cluster": "c", "user": "u", "namespace": "llm"}}],
    }))  # fmt: skip
    dep = {
        "model": "m",
        "provider": {"kind": "kubernetes", "deployment": "engine", "service": "engine", "port": "http"},
        **deployment,
    }
    config = tmp / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "gateway": gateway if gateway is not None else {"port": free_port()}, "deployments": [dep],
        "ops": {"access_log": False}, **(top or {}),
    }))  # fmt: skip
    return config, {"KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": ""}


def start_serve(config: Path, env: dict[str, str], name: str = "fleetgate-serve") -> Any:
    """``fleetgate serve --config config`` as an integration ``ServerProcess`` (not waited for)."""
    tools = integration_tools()
    return tools.ServerProcess(
        [tools.PY, "-m", "fleetgate.cli", "serve", "--config", str(config)], name=name, env=env
    )


def gateway_files(
    tmp: Path, i: int, api_url: str, gateway: dict[str, Any] | None, extra: dict[str, Any]
) -> tuple[Path, dict[str, str]]:
    """Gateway ``i`` of several: token ``gw<i>``, a static autoscaler that wants 2 replicas (whoever leads
    patches the scale back to 2 when it drifts). ``gateway``: as ``serve_files``'s; ``extra``: ``deployment``
    and ``top`` keys to add."""
    deployment = {"autoscaler": {"policy": "static", "replicas": 2}, **extra.get("deployment", {})}
    return serve_files(
        tmp, api_url, token=f"gw{i}", deployment=deployment, gateway=gateway, top=extra.get("top"),
        name=f"serve-{i}",
    )  # fmt: skip


async def leading(session: aiohttp.ClientSession, url: str) -> bool:
    """The gateway at ``url`` says (``fleetgate_leader``) that it leads deployment ``m``."""
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    match = re.search(r'^fleetgate_leader\{deployment="m"\} (\S+)$', text, re.M)
    return match is not None and float(match.group(1)) == 1.0


def scalers(cluster: FakeCluster, since: float = 0.0) -> set[str]:
    """Tokens of the gateways that PATCHed the Deployment's scale after ``since``."""
    return {tok for t, tok, m, p in cluster.calls if t >= since and m == "PATCH" and p.endswith("/scale")}


async def watch_takeover(
    session: aiohttp.ClientSession,
    old_url: str,
    new_url: str,
    *,
    limit_s: float = 15.0,
    on_step_down: Callable[[], None] | None = None,
) -> tuple[float | None, float]:
    """Poll both gateways every 50 ms until ``new_url`` leads, asserting that they never both lead; returns
    (when ``old_url`` stopped leading, when ``new_url`` led) in seconds from the call. ``on_step_down`` runs
    once, when the old leader is first seen not leading."""
    start = time.monotonic()
    stepped_down: float | None = None
    while True:
        now = time.monotonic() - start
        assert now < limit_s, "no takeover after the partition"
        old, new = await leading(session, old_url), await leading(session, new_url)
        assert not (old and new), f"two leaders at {now:.2f} s"
        if not old and stepped_down is None:
            stepped_down = now
            if on_step_down is not None:
                on_step_down()
        if new:
            return stepped_down, now
        await asyncio.sleep(0.05)
