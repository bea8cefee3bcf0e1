"""High #2 of issue 22, the last step of the cascade: a replica whose restart failed was dropped for good.

A restart that cannot start the process (here: its command is gone; in the attack, EMFILE) left the
replica out of the provider's next report, so the gateway and its prober forgot it. Now the replica stays
known under its name and address (unhealthy, so not routed to), and the next restart brings it back.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetgate.providers.base import ProviderError
from fleetgate.providers.local import LocalProcessProvider


async def test_failed_restart_keeps_the_replica(tmp_path: Path) -> None:
    script = tmp_path / "engine.sh"
    text = (
        f'#!/bin/sh\nexec {sys.executable} -m fleetgate.cli engine sim --port "$1" --model m --time-scale 0\n'
    )
    script.write_text(text)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    reports: list[set[str]] = []

    def on_change(infos: Any) -> None:
        reports.append({info.name for info in infos if info.url})

    provider = LocalProcessProvider(
        model="m",
        command=[str(script), "{port}"],
        url_from_output=False,
        ready_timeout_s=30,
        on_change=on_change,
    )
    try:
        (first,) = await provider.scale_to(1)
        script.unlink()  # the next start of this command fails at once, as a spawn under EMFILE does
        with pytest.raises((ProviderError, OSError)):  # (it is a ProviderError now)
            await provider.restart(first.name)
        script.write_text(text)
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        await provider.scale_to(2)  # any later report must still name the replica whose restart failed
        assert first.name in reports[-1], reports
        again = await provider.restart(first.name)  # the prober's next attempt brings it back
        assert again.status == "running" and again.url == first.url
        assert reports[-1] >= {first.name}
    finally:
        await provider.stop_all()
