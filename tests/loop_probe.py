"""A timing guard on a gateway's event loop: a thread that keeps asking ``GET /healthz`` over one keep-alive
connection while a test attacks, and records how long each answer took.

``/healthz`` does no work, so its latency is the time the gateway's loop was busy elsewhere: a request that
blocks the loop (parsing, hashing, decoding on the loop thread) shows up here as a slow probe.

On a loaded machine a probe also waits while the OS runs other processes instead of the gateway (CI at load
10-16: a 188 ms wait in the shape fuzz test, whose bound is 100 ms; quiet runs pass). So, given the
gateway's ``pid``, each probe also records the CPU time the gateway process (all its threads: a thread
holding the interpreter lock blocks the loop too) used while that probe waited; ``worst_blocked_s`` is the
largest ``min(wait, that CPU time)``. A loop blocked by the gateway's own work for X seconds makes that at
least X however busy the machine is; a gateway the OS has descheduled uses no CPU meanwhile.
"""

from __future__ import annotations

import http.client
import threading
import time
from pathlib import Path
from types import TracebackType

from fleetgate.engines.calibration_probe import process_tree_cpu_seconds


def thread_cpu_s(pid: int) -> float:
    """CPU seconds used so far by the live threads of process ``pid`` (ns resolution, from each thread's
    ``/proc/PID/task/TID/schedstat``; a thread that exited in between drops out of the sum)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


class CpuTimer:
    """``with CpuTimer(pid) as t: ...``; then ``t.cpu_s``, the CPU seconds used meanwhile by ``pid`` and
    its child processes (e.g. the gateway's parse worker), and ``t.wall_s``. CPU time, unlike wall time,
    does not grow when other processes share the machine; a request whose work blows up still uses it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.cpu_s = self.wall_s = 0.0
        self._cpu0 = self._t0 = 0.0

    def __enter__(self) -> CpuTimer:
        self._cpu0 = process_tree_cpu_seconds(self.pid)
        self._t0 = time.perf_counter()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.wall_s = time.perf_counter() - self._t0
        self.cpu_s = process_tree_cpu_seconds(self.pid) - self._cpu0


class LoopProbe:
    """``with LoopProbe(url, pid=gateway.pid) as probe: ...attack...``; then ``probe.worst_blocked_s``,
    ``probe.worst_s`` (wall) and ``probe.latencies``."""

    def __init__(self, url: str, *, pid: int | None = None, period_s: float = 0.01) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.host = host
        self.port = int(port)
        self.pid = pid
        self.period_s = period_s
        self.latencies: list[float] = []
        self.cpu: list[float] = []  #: the gateway's CPU seconds during each probe (with ``pid``)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loop-probe", daemon=True)

    def __enter__(self) -> LoopProbe:
        if self.pid is not None:
            thread_cpu_s(self.pid)  # fails here, not in the thread, when the process cannot be read
        self._thread.start()
        deadline = time.monotonic() + 5
        while not self.latencies and time.monotonic() < deadline:  # the connection is up and warm
            time.sleep(0.005)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(10)

    @property
    def worst_s(self) -> float:
        """The longest wait, wall clock (includes time the OS gave the CPU to other processes)."""
        return max(self.latencies, default=0.0)

    @property
    def worst_blocked_s(self) -> float:
        """The longest wait the gateway's own CPU work accounts for: max of ``min(wait, CPU meanwhile)``."""
        assert self.pid is not None, "LoopProbe(pid=...) measures the gateway's CPU time"
        return max((min(w, c) for w, c in zip(self.latencies, self.cpu, strict=True)), default=0.0)

    def check(self, bound_s: float, what: str) -> None:
        """No probe errors; no ``/healthz`` waited ``bound_s`` behind the gateway's own CPU work
        (``worst_blocked_s``: the OS running other processes does not count), nor 1 s of wall time for
        any reason (a stall that uses no CPU)."""
        assert not self.errors, self.errors
        blocked, wall = self.worst_blocked_s, self.worst_s
        print(f"/healthz {what}: worst {blocked * 1000:.1f} ms on gateway CPU, {wall * 1000:.1f} ms wall")
        assert blocked < bound_s, f"/healthz waited {blocked * 1000:.0f} ms on the gateway's CPU work {what}"
        assert wall < 1.0, f"/healthz waited {wall * 1000:.0f} ms {what}"

    def _cpu(self) -> float:
        return thread_cpu_s(self.pid) if self.pid is not None else 0.0

    def _run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            while not self._stop.is_set():
                c0 = self._cpu()
                t0 = time.perf_counter()
                try:
                    conn.request("GET", "/healthz")
                    resp = conn.getresponse()
                    resp.read()
                except (OSError, http.client.HTTPException) as exc:
                    self.errors.append(f"{exc.__class__.__name__}: {exc}")
                    conn.close()
                    conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
                    continue
                took = time.perf_counter() - t0
                self.cpu.append(self._cpu() - c0)
                self.latencies.append(took)
                if resp.status != 200:
                    self.errors.append(f"HTTP {resp.status}")
                self._stop.wait(self.period_s)
        finally:
            conn.close()
