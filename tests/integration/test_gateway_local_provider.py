"""Local process provider on real simulated engines: scale, restart in place, drain, no orphans."""

from __future__ import annotations

import sys
from typing import Any

import httpx
import pytest

from fleetgate.providers.base import ProviderError, ReplicaStatus
from fleetgate.providers.local import LocalProcessProvider, sim_engine_command


async def test_scale_restart_drain_and_stop(tools: Any) -> None:
    drained: list[str] = []
    changes: list[list[str]] = []

    async def drain_hook(name: str, timeout_s: float) -> None:
        drained.append(name)

    provider = LocalProcessProvider(
        model="m",
        command=sim_engine_command(["--time-scale", "0"]),
        on_change=lambda infos: changes.append([i.name for i in infos]),
        drain_hook=drain_hook,
        ready_timeout_s=30,
    )
    try:
        infos = await provider.scale_to(2)
        assert [i.name for i in infos] == ["sim-0", "sim-1"]
        assert all(i.status == ReplicaStatus.RUNNING and i.pid for i in infos)
        async with httpx.AsyncClient() as http:
            for info in infos:
                assert (await http.get(info.url + "/health")).status_code == 200
            old = infos[0]
            new = await provider.restart(old.name)
            assert new.url == old.url and new.pid != old.pid  # same address, new process
            assert old.pid is not None and not tools.pid_alive(old.pid)
            assert (await http.get(new.url + "/health")).status_code == 200

        infos = await provider.scale_to(1)
        assert [i.name for i in infos] == ["sim-0"]
        assert drained == ["sim-1"]  # drained before it was stopped
        assert changes[-1] == ["sim-0"]
        pids = provider.pids()
    finally:
        await provider.stop_all()
    assert not any(tools.pid_alive(pid) for pid in pids)
    assert await provider.list() == []


async def test_start_failure_is_reported_with_output(tools: Any) -> None:
    provider = LocalProcessProvider(
        model="m",
        command=[sys.executable, "-c", "import sys; print('boom {port}'); sys.exit(3)"],
        url_from_output=True,
        ready_timeout_s=10,
    )
    try:
        with pytest.raises(ProviderError, match=r"(?s)did not become ready.*boom"):
            await provider.scale_to(1)
    finally:
        await provider.stop_all()
    assert provider.pids() == ()
