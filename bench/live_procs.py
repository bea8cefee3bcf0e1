"""Child processes for the live benchmarks (``router_compare.py``): each in its own process group with its
output in a log file, killed on exit; readiness by a "ready on URL" line or an HTTP 200."""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetgate.providers.local import free_port

__all__ = ["Proc", "free_port", "spawn", "stop_all", "wait_http", "wait_ready_line"]

READY = re.compile(r"ready on (http://127\.0\.0\.1:\d+)")


@dataclass
class Proc:
    """A child process in its own process group, with its output in a log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    url: str | None = None

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, grace: float = 3.0) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)


_LIVE: list[Proc] = []


def _cleanup() -> None:
    for p in list(_LIVE):
        p.stop(grace=1.0)
    _LIVE.clear()


atexit.register(_cleanup)


def _pin(cpus: set[int] | None) -> Any:
    if not cpus:
        return None

    def pre() -> None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)

    return pre


def spawn(
    name: str, args: Sequence[str], logdir: Path, cpus: set[int] | None, env: dict[str, str] | None = None
) -> Proc:
    log = logdir / f"{name}.log"
    fh = open(log, "wb")  # noqa: SIM115 - the child owns it
    popen = subprocess.Popen(
        list(args),
        stdin=subprocess.DEVNULL,
        stdout=fh,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_pin(cpus),
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    fh.close()
    proc = Proc(name, popen, log)
    _LIVE.append(proc)
    return proc


def wait_ready_line(procs: Sequence[Proc], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    pending = [p for p in procs if p.url is None]
    while pending:
        for p in list(pending):
            m = READY.search(p.output())
            if m:
                p.url = m.group(1)
                pending.remove(p)
            elif p.popen.poll() is not None:
                raise RuntimeError(f"{p.name} exited:\n{p.output()[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready: {[p.name for p in pending]}")
        time.sleep(0.05)


def wait_http(url: str, proc: Proc, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited:\n{proc.output()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name}: {url} not ready:\n{proc.output()[-2000:]}")


def stop_all(procs: Sequence[Proc]) -> None:
    for p in procs:
        p.stop()
        if p in _LIVE:
            _LIVE.remove(p)
