"""A timing guard on a gateway's event loop: a thread that keeps asking ``GET /healthz`` over one keep-alive
connection while a test attacks, and records how long each answer took.

``/healthz`` does no work, so its latency is the time the gateway's loop was busy elsewhere: a request that
blocks the loop (parsing, hashing, decoding on the loop thread) shows up here as a slow probe.
"""

from __future__ import annotations

import http.client
import threading
import time
from types import TracebackType


class LoopProbe:
    """``with LoopProbe(url) as probe: ...attack...``; then ``probe.worst_s`` and ``probe.latencies``."""

    def __init__(self, url: str, *, period_s: float = 0.01) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.host = host
        self.port = int(port)
        self.period_s = period_s
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loop-probe", daemon=True)

    def __enter__(self) -> LoopProbe:
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
        return max(self.latencies, default=0.0)

    def _run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            while not self._stop.is_set():
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
                self.latencies.append(time.perf_counter() - t0)
                if resp.status != 200:
                    self.errors.append(f"HTTP {resp.status}")
                self._stop.wait(self.period_s)
        finally:
            conn.close()
