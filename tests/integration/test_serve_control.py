"""The control plane under ``fleetgate serve --config``, from the per-deployment keys a user writes:
``provider: {kind: local}`` starts real simulated-engine processes, ``autoscaler:`` scales them on the
gateway's own demand, ``remediation`` (default for local: restart) restarts a hung one.

The same scenarios as ``test_autoscale_live.py`` and ``test_health_faults.py`` (which drive the provider,
the loop and the prober directly), here through the shipped path: one ``fleetgate serve`` process, observed
only from outside (its ``/metrics``, its child processes, the replies).
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from fleetgate.profiles import load_profile
from fleetgate.providers.local import free_port
from step_load import Load

pytestmark = pytest.mark.timeout(300)

MODEL = "fleetgate-sim"
MAX_REPLICAS = 4
BODY = {"model": MODEL, "prompt": "hello there", "max_tokens": 64}


def _serve(tools: Any, tmp_path: Path, deployment: dict[str, Any]) -> Any:
    config = tmp_path / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {"gateway": {"port": free_port()}, "deployments": [deployment], "ops": {"access_log": False}}
        )
    )
    return tools.ServerProcess(
        [tools.PY, "-m", "fleetgate.cli", "serve", "--config", str(config)], name="fleetgate-serve"
    )


def _sample(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if match and ",".join(sorted(match.group(1).split(","))) == want:
            return float(match.group(2))
    return None


async def test_serve_local_provider_steps_up_then_down_losing_nothing(tools: Any, tmp_path: Path) -> None:
    """Step 10 % -> 90 % -> 10 % of four replicas' capacity: scale-up on the step, scale-down only after the
    delay, every request answered (scale-down drains first)."""
    profile = load_profile("fleetgate-sim")  # one replica serves its capacity_mu_per_min
    mu = profile.estimate(2, 64)  # what one request settles
    params = {
        "policy": "fleetgate",
        # a replica "full" at two requests per second, so that a few requests per second need four (and
        # the 90 % step gathers its evidence, > 50 requests on up to four replicas, in a few seconds)
        "target_utilisation": 120.0 * mu / profile.capacity_mu_per_min,
        "max_replicas": MAX_REPLICAS,
        "stable_window_s": 4.0,
        "panic_window_s": 1.0,
        "scale_down_delay_s": 6.0,
        "scale_up_cooldown_s": 4.0,
        "scale_down_interval_s": 1.0,
        "idle_to_min_s": 600.0,
    }
    gw = _serve(
        tools,
        tmp_path,
        {
            "model": MODEL,
            "demand_window_s": 5.0,  # as test_autoscale_live.py's meter: the test takes about half a minute
            "provider": {"kind": "local", "engine_args": ["--time-scale", "0.05"], "replicas": 1},
            "autoscaler": params,
        },
    )
    history: list[tuple[float, float]] = []  # (t, desired replicas) from the gateway's own gauge

    async def watch(session: aiohttp.ClientSession) -> None:
        while True:
            async with session.get(url + "/metrics") as r:
                desired = _sample(await r.text(), "fleetgate_autoscaler_desired_replicas", deployment=MODEL)
            if desired is not None:
                history.append((time.monotonic(), desired))
            await asyncio.sleep(0.25)

    try:
        url = gw.wait_ready(60)
        assert len(tools.children_of(gw.pid)) == 1
        load = Load(url, BODY)
        full_rps = 2.0 * MAX_REPLICAS
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            watcher = asyncio.create_task(watch(session))
            try:
                await load.drive(session, 0.1 * full_rps, 6.0)
                assert max(n for _, n in history) == 1
                t_step = time.monotonic()

                def at_max() -> bool:
                    return any(t >= t_step and n >= MAX_REPLICAS for t, n in history)

                # 90 % until the fleet is at its maximum, then 5 s more on all four (at most 14 s)
                await load.drive(session, 0.9 * full_rps, 14.0, until=at_max, then_s=5.0)
                ups = [n for t, n in history if t >= t_step]
                assert ups and max(ups) >= 3, f"no scale-up on the step to 90 %: {history[-10:]}"
                t_drop = time.monotonic()

                def scaled_down() -> bool:
                    return any(t >= t_drop and n < max(ups) for t, n in history)

                # 10 % until the first scale-down, then 3 s more while the drained one stops (at most 20 s)
                await load.drive(session, 0.1 * full_rps, 20.0, until=scaled_down, then_s=3.0)
            finally:
                watcher.cancel()
        downs = [(t, n) for t, n in history if t >= t_drop and n < max(ups)]
        assert downs, f"no scale-down after the drop: {history[-10:]}"
        assert downs[0][0] - t_drop >= params["scale_down_delay_s"] - 1.0, "scaled down before the delay"
        # Zero lost: every request sent got a complete answer, through every scale-up and drained scale-down.
        assert load.failed == [], load.failed[:5]
        assert load.ok == load.sent > 50
        print(
            f"step: up to {max(ups):.0f} replicas, "
            f"first scale-down {downs[0][0] - t_drop:.1f} s after the drop"
        )
    finally:
        gw.kill()


async def test_serve_local_provider_restarts_a_hung_replica(tools: Any, tmp_path: Path) -> None:
    """A replica that hangs (health 200, no progress) is taken out of routing and restarted on the same
    address by the local provider within 30 s with the real health defaults; the other one is never touched,
    and requests through the gateway keep succeeding."""
    gw = _serve(
        tools,
        tmp_path,
        {
            "model": MODEL,
            "provider": {"kind": "local", "engine_args": ["--time-scale", "0.05"], "replicas": 2},
        },
    )
    try:
        url = gw.wait_ready(60)
        replicas = dict(ln.split()[1:3] for ln in gw.lines if ln.startswith("replica "))
        assert sorted(replicas) == ["sim-0", "sim-1"]
        victim, other = "sim-0", "sim-1"
        before = set(tools.children_of(gw.pid))
        load = Load(url, BODY)

        async def metrics(session: aiohttp.ClientSession) -> str:
            async with session.get(url + "/metrics") as r:
                return await r.text()

        def state(text: str, replica: str, name: str) -> float | None:
            return _sample(text, "fleetgate_health_state", deployment=MODEL, replica=replica, state=name)

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            async with session.post(replicas[victim] + "/admin/fault", json={"kind": "hang"}) as r:
                assert r.status == 200
            t0 = time.monotonic()
            serving_again = asyncio.Event()
            # 2 requests/s through the hang until 3 s after the victim serves again (at most 30 s)
            traffic = asyncio.create_task(
                load.drive(session, 2.0, 30.0, until=serving_again.is_set, then_s=3.0)
            )
            restarted = None
            while time.monotonic() - t0 < 35.0:
                text = await metrics(session)
                done = _sample(
                    text,
                    "fleetgate_health_remediations_total",
                    deployment=MODEL,
                    replica=victim,
                    action="restart",
                    reason="probe_timeout_no_progress",
                    result="ok",
                )
                if done == 1.0 and state(text, victim, "healthy") == 1.0:
                    restarted = time.monotonic() - t0
                    serving_again.set()
                    break
                await asyncio.sleep(0.25)
            await traffic
            assert restarted is not None and restarted <= 30.0, f"not serving again within 30 s:\n{text}"
            text = await metrics(session)
            assert state(text, other, "healthy") == 1.0
            assert (
                _sample(
                    text,
                    "fleetgate_health_remediations_total",
                    deployment=MODEL,
                    replica=other,
                    action="restart",
                    reason="probe_timeout_no_progress",
                    result="ok",
                )
                is None
            ), "the healthy replica was restarted"
            # Restarted on the same address by a new process, which serves real requests.
            async with session.post(replicas[victim] + "/v1/completions", json=BODY) as r:
                assert r.status == 200
        after = set(tools.children_of(gw.pid))
        assert len(after) == 2 and len(after - before) == 1, (before, after)
        # Requests that hit the hung replica before it left routing are retried elsewhere (nothing sent yet),
        # so none is lost.
        assert load.failed == [], load.failed[:5]
        assert load.ok == load.sent
        print(f"hang under serve: serving again after {restarted:.1f} s")
    finally:
        gw.kill()


def test_serve_local_provider_that_cannot_start_is_one_line(tools: Any, tmp_path: Path) -> None:
    """A replica command that exits at once: `serve` stops with one line naming the provider, exit 2, and
    leaves no process behind."""
    gw = _serve(
        tools,
        tmp_path,
        {
            "model": MODEL,
            "provider": {
                "kind": "local",
                "command": [tools.PY, "-c", "raise SystemExit(3)", "{port}"],
                "replicas": 1,
            },
        },
    )
    try:
        assert gw.wait(60) == 2
        line = gw.wait_line(r"fleetgate: cannot start:")
        assert "deployments.0.provider:" in line and "Traceback" not in gw.output, gw.output[-2000:]
    finally:
        gw.kill()
