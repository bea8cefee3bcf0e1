"""Real processes for integration tests: simulated engines and gateways on 127.0.0.1, free ports only.

Every process runs in its own process group and is killed as a group at teardown, so a failing test leaves
nothing behind. Output is collected by a reader thread (test harness only) so a test can wait for a line.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import httpx
import pytest
import yaml

READY = re.compile(r"ready on (http://127\.0\.0\.1:\d+)")


class ServerProcess:
    """A child process that prints ``... ready on http://127.0.0.1:PORT`` once it serves (``ready``: the
    pattern of that line, its first group the URL; a trailing ``/`` is dropped)."""

    def __init__(
        self,
        args: Sequence[str],
        name: str,
        env: dict[str, str] | None = None,
        *,
        ready: re.Pattern[str] = READY,
    ) -> None:
        self.name = name
        self.args = list(args)
        self.ready = ready
        self.lines: list[str] = []
        self.url: str | None = None
        self._ready = threading.Event()
        self.proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self._reader = threading.Thread(target=self._read, name=f"out-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            match = self.ready.search(line)
            if match and self.url is None:
                self.url = match.group(1).rstrip("/")
                self._ready.set()
        self._ready.set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout: float = 30.0) -> str:
        if not self._ready.wait(timeout) or self.url is None:
            self.kill()
            raise RuntimeError(f"{self.name} did not become ready:\n{self.output[-3000:]}")
        return self.url

    def wait_line(self, pattern: str, timeout: float = 10.0) -> str:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if regex.search(line):
                    return line
            time.sleep(0.02)
        raise AssertionError(f"{self.name}: no line matching {pattern!r} in:\n{self.output[-3000:]}")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """Kill the whole process group and reap the child."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    out: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(") ", 1)[1].split()
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


PY = sys.executable
#: Real seconds per model second for engines in tests: 20x faster than real time.
TIME_SCALE = "0.05"


@pytest.fixture(scope="session")
def tools() -> ModuleType:
    """This module's helpers (``ServerProcess``, ``engine_stats`` ...) for test modules: conftest files
    cannot be imported by name reliably, fixtures can always be requested."""
    # Not sys.modules[__name__]: every conftest.py is imported as "conftest", so that name is ambiguous.
    return SimpleNamespace(**globals())  # type: ignore[return-value]


EngineFactory = Callable[..., ServerProcess]
GatewayFactory = Callable[..., ServerProcess]


@pytest.fixture
def start_engine() -> Iterator[EngineFactory]:
    """Start simulated engines (``fleetgate engine sim --port 0``); all are killed at teardown."""
    procs: list[ServerProcess] = []

    def start(
        model: str = "sim-model", *extra: str, time_scale: str = TIME_SCALE, wait: bool = True
    ) -> ServerProcess:
        """Start one engine; ``wait=False`` returns at once (start several, then ``wait_ready`` each)."""
        args = [PY, "-m", "fleetgate.cli", "engine", "sim", "--port", "0", "--model", model]
        args += ["--time-scale", time_scale, *extra]
        proc = ServerProcess(args, name=f"engine-{len(procs)}")
        procs.append(proc)
        if wait:
            proc.wait_ready()
        return proc

    yield start
    for proc in procs:
        proc.kill()


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[GatewayFactory]:
    """Start ``fleetgate serve`` on a free port in front of the given replicas; killed at teardown."""
    procs: list[ServerProcess] = []

    def start(
        deployments: dict[str, Sequence[ServerProcess]],
        policy: str = "round_robin",
        routing_params: dict[str, Any] | None = None,
        deployment: dict[str, Any] | None = None,
        **gateway: Any,
    ) -> ServerProcess:
        """``deployment``: extra keys of every deployment (e.g. ``failover``); the rest: gateway keys."""
        routing: dict[str, Any] = {"policy": policy}
        if routing_params:
            routing["params"] = routing_params
        cfg = {
            "gateway": {"host": "127.0.0.1", "port": 0, "scrape_interval_s": 0.5, **gateway},
            "deployments": [
                {
                    "model": model,
                    "routing": routing,
                    "replicas": [{"name": f"r{i}", "url": e.url} for i, e in enumerate(engines)],
                    **(deployment or {}),
                }
                for model, engines in deployments.items()
            ],
        }
        path = tmp_path / f"gateway-{len(procs)}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        proc = ServerProcess([PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], name="gateway")
        procs.append(proc)
        proc.wait_ready()
        return proc

    yield start
    for proc in procs:
        proc.kill()


def engine_stats(engine: ServerProcess) -> dict[str, Any]:
    """The simulated engine's own counters (``GET /admin/stats``)."""
    assert engine.url is not None
    result: dict[str, Any] = httpx.get(engine.url + "/admin/stats", timeout=5).json()
    return result


def set_fault(engine: ServerProcess, kind: str, value: float | None = None) -> None:
    assert engine.url is not None
    body: dict[str, Any] = {"kind": kind}
    if value is not None:
        body["value"] = value
    httpx.post(engine.url + "/admin/fault", json=body, timeout=5).raise_for_status()
