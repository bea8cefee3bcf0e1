"""Local engine processes: the one place fleetgate starts, signals, waits for and stops a child process.

Every child gets its own session (process group) so stopping it takes down any helpers it forked and a
terminal's Ctrl-C does not reach it directly, and on Linux asks the kernel to SIGTERM it if fleetgate dies
(``PR_SET_PDEATHSIG``): no orphans even after ``kill -9`` of the parent. ``EngineProcess`` (a replica on a
fixed host:port: tests, benches, the real-engine launchers) has blocking methods for scripts and ``*_async``
ones that never block the event loop; ``LocalProcessProvider`` (``provider.py``) is asyncio throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (for commands that cannot bind port 0 and report it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group led by ``pid`` (gone already: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def clean_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    """The environment for an engine: ours without ``LLAMA_ARG_*`` (llama-server reads those as flags, so the
    argv alone decides), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    if extra:
        env.update(extra)
    return env


async def _wait_exit(proc: subprocess.Popen[bytes], timeout_s: float, interval: float = 0.02) -> bool:
    """Wait for ``proc`` to exit without blocking the loop; False when it is still running after the time."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)
    return True


def descendant_pids(root: int, comm: str | None = None) -> list[int]:
    """PIDs below ``root`` in the process tree (Linux /proc), optionally only those whose command name is
    ``comm`` (e.g. ``"llama-server"``: how a hang drill finds the replicas ``fleetgate up`` started)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    out: list[int] = []
    todo = [root]
    while todo:
        for kid in parents.get(todo.pop(), []):
            todo.append(kid)
            if comm is None:
                out.append(kid)
                continue
            try:
                if (Path("/proc") / str(kid) / "comm").read_text().strip() == comm:
                    out.append(kid)
            except OSError:
                pass
    return out


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to SIGTERM the engine if its parent dies, so a killed test run leaves no orphan servers."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _http_status(url: str, timeout: float) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, TimeoutError):
        return None


class EngineProcess:
    """One engine replica as a child process on a fixed host:port.

    ``start``/``stop``/``restart`` keep the address, so a supervisor can restart a hung replica in place.
    The child gets its own session (process group) so a terminal's Ctrl-C does not reach it directly and
    ``stop`` can take down any helpers it forked.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        host: str,
        port: int,
        health_path: str = "/health",
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        name: str = "engine",
    ) -> None:
        self.command = list(command)
        self.host = host
        self.port = port
        self.health_path = health_path
        self.env = clean_env(env)
        self.log_path = log_path
        self.name = name
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def start(self) -> None:
        """Spawn the process (returns at once; use ``wait_ready`` or ``await wait_ready_async``)."""
        if self.running():
            raise RuntimeError(f"{self.name} already running (pid {self.pid})")
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        out = self._log if self._log is not None else subprocess.DEVNULL
        self._proc = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
            # PR_SET_PDEATHSIG fires when the *thread* that forked exits: call start() from a long-lived
            # thread (the main or event-loop thread), not from a short-lived worker thread.
            preexec_fn=die_with_parent,
        )
        self.starts += 1

    def _check_alive(self) -> None:
        if not self.running():
            raise RuntimeError(
                f"{self.name} exited with code {self.returncode()} before it was ready"
                + (f"; log: {self.log_path}" if self.log_path else "")
            )

    def wait_ready(self, timeout: float = 60.0, interval: float = 0.1) -> float:
        """Block until ``GET health_path`` answers 200; returns the seconds waited. Raises on exit/timeout."""
        t0 = time.monotonic()
        while True:
            self._check_alive()
            if _http_status(self.url + self.health_path, timeout=2.0) == 200:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{self.name} not healthy at {self.url} after {timeout:.0f} s")
            time.sleep(interval)

    async def wait_ready_async(self, limit_s: float = 60.0, interval: float = 0.1) -> float:
        """``wait_ready`` for event-loop callers (the blocking probe runs in a worker thread)."""
        t0 = time.monotonic()
        while True:
            self._check_alive()
            status = await asyncio.to_thread(_http_status, self.url + self.health_path, 2.0)
            if status == 200:
                return time.monotonic() - t0
            if time.monotonic() - t0 > limit_s:
                raise TimeoutError(f"{self.name} not healthy at {self.url} after {limit_s:.0f} s")
            await asyncio.sleep(interval)

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._proc is not None:
            signal_group(self._proc.pid, sig)

    def freeze(self) -> None:
        """SIGSTOP the replica: it keeps its port (connections queue in the backlog) but makes no progress."""
        self._signal_group(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT a frozen replica."""
        self._signal_group(signal.SIGCONT)

    def descendant_pids(self) -> list[int]:
        """PIDs of the replica's child processes, recursively (Linux /proc), e.g. vLLM's engine core."""
        return descendant_pids(self._proc.pid) if self._proc is not None else []

    def freeze_children(self) -> list[int]:
        """SIGSTOP only the child processes: the front process (e.g. vLLM's API server) keeps answering
        /health while the engine makes no progress, which is how real engine hangs look."""
        pids = self.descendant_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        return pids

    def thaw_children(self) -> None:
        """SIGCONT every child process (undoes ``freeze_children``)."""
        for pid in self.descendant_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; works on a frozen process too. Returns the exit
        code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            self._signal_group(signal.SIGCONT)  # a stopped process only acts on SIGTERM once continued
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL at once (what a supervisor does to a hung replica)."""
        if self._proc is not None and self._proc.poll() is None:
            self._signal_group(signal.SIGKILL)
            self._proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self, timeout: float = 60.0) -> float:
        """Kill and start again on the same address; returns seconds until healthy."""
        self.kill()
        t0 = time.monotonic()
        self.start()
        self.wait_ready(timeout=timeout)
        return time.monotonic() - t0

    async def kill_async(self) -> None:
        """``kill`` for event-loop callers: the wait for the exit does not block the loop."""
        if self._proc is not None and self._proc.poll() is None:
            self._signal_group(signal.SIGKILL)
            if not await _wait_exit(self._proc, 10.0):
                raise RuntimeError(f"{self.name} (pid {self._proc.pid}) did not exit after SIGKILL")
        if self._log is not None:
            self._log.close()
            self._log = None

    async def stop_async(self, grace: float = 5.0) -> int | None:
        """``stop`` for event-loop callers."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            self._signal_group(signal.SIGCONT)
            if not await _wait_exit(proc, grace):
                await self.kill_async()
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode

    async def restart_async(self, limit_s: float = 60.0) -> float:
        """``restart`` for event-loop callers (nothing in it blocks the loop)."""
        await self.kill_async()
        t0 = time.monotonic()
        self.start()
        await self.wait_ready_async(limit_s=limit_s)
        return time.monotonic() - t0

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
