"""A process pool for image work that survives its workers dying.

``concurrent.futures.ProcessPoolExecutor`` marks the whole pool broken when one worker dies, failing every
request in flight. Here each worker is its own process with its own pipe: a worker that dies (a decoder
crash, the OOM killer, a task over its time limit) fails only the request it was serving, with a clear
error, and is replaced. The event loop never blocks: the send/wait/receive round trip of a task runs on a
small thread pool via ``loop.run_in_executor`` (one thread per worker; the threads only wait on pipes).

Workers are fresh interpreters (``python -c``, no fork of a threaded event-loop process and, unlike
multiprocessing's ``spawn``, no re-import of the parent's ``__main__``); the pipe's fd is inherited. They
get their native thread caps from the CPU budget in their environment before any image library loads, cap
their address space, and ignore SIGINT (the parent decides when they stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fleetgate.multimodal.cpu import apply_thread_limits, worker_env
from fleetgate.multimodal.image import ImageError, ImageResult, ImageSpec

log = logging.getLogger("fleetgate.multimodal")


#: Longest a fresh worker may take to import its libraries and report ready.
STARTUP_TIMEOUT_S = 60.0


class WorkerCrashedError(Exception):
    """The worker serving a task died or overran its time limit (it has been replaced)."""


@dataclass(slots=True)
class PoolStats:
    """Counters for metrics and tests."""

    tasks: int = 0
    image_errors: int = 0
    crashes: int = 0
    timeouts: int = 0
    restarts: int = 0


def _worker_entry(fd: int, threads: int, memory_mb: int | None, nice: int = 0) -> None:
    """``python -c`` entry point of a worker: wrap the inherited pipe end and serve."""
    _worker_main(multiprocessing.connection.Connection(fd), threads, memory_mb, nice)


def _worker_main(
    conn: multiprocessing.connection.Connection, threads: int, memory_mb: int | None, nice: int = 0
) -> None:
    """Worker loop: receive ``(kind, payload, spec)``, answer ``("ok", result)`` or ``("error", message)``.

    ``nice`` lowers the worker's CPU priority so that, on a saturated CPU budget, the gateway's event loop
    (health probes, text requests, streaming) is scheduled first and image work takes what is left.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)
        with contextlib.suppress(OSError, AttributeError):  # CPU-bound batch work: no wake-up preemption
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    apply_thread_limits(threads)  # before any native library is imported
    if memory_mb is not None:
        try:
            import resource

            limit = memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass
    from fleetgate.multimodal import image as image_mod

    apply_thread_limits(threads)
    try:
        conn.send(("ready", os.getpid()))  # the parent times tasks only from here on
    except (EOFError, OSError):
        return
    handlers: dict[str, Callable[[bytes | str, ImageSpec], ImageResult]] = {
        "image": image_mod.process_image,
        "naive": image_mod.process_naive,
    }
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return  # the parent went away
        if task is None:
            return
        kind, payload, spec = task
        try:
            if kind == "_crash":  # test hook: die the way a decoder segfault would
                os._exit(int(payload))
            if kind == "_sleep":  # test hook: a task that overruns its time limit
                import time

                time.sleep(float(payload))
                reply: tuple[str, Any] = ("ok", None)
            else:
                reply = ("ok", handlers[kind](payload, spec))
        except ImageError as exc:
            reply = ("error", str(exc))
        except MemoryError:
            reply = ("error", "image needs more memory to decode than a worker may use")
        except Exception as exc:  # never let one bad input end the loop
            reply = ("error", f"image processing failed: {exc.__class__.__name__}: {exc}")
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return


#: Socket send buffer asked for on the parent's end of each pipe (the kernel caps it at
#: ``net.core.wmem_max``). With the default (~208 KB) a 600 KB base64 payload took ~13 ``write`` calls, each
#: a kernel copy, a wake-up of the worker and, in the pool thread, a GIL re-acquisition that can make the
#: event loop wait; with 4 MB it goes out in one (measured: 86 writes for 43 images, headers included).
SEND_BUFFER_BYTES = 4 * 1024 * 1024


def _grow_send_buffer(fd: int) -> None:
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        finally:
            sock.close()


class _Worker:
    """One worker process and the parent's end of its pipe."""

    __slots__ = ("conn", "index", "proc")

    def __init__(self, index: int, threads: int, memory_mb: int | None, nice: int = 0) -> None:
        parent, child = multiprocessing.Pipe(duplex=True)
        fd = child.fileno()
        code = (
            "from fleetgate.multimodal.pool import _worker_entry; "
            f"_worker_entry({fd}, {int(threads)}, {memory_mb!r}, {int(nice)})"
        )
        env = {**os.environ, **worker_env(threads)}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code],
                pass_fds=(fd,),
                env=env,
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        finally:
            child.close()
        self.index = index
        self.conn: multiprocessing.connection.Connection = parent

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Block until the worker imported its libraries (so task time limits exclude start-up)."""
        try:
            if self.conn.poll(timeout_s):
                status, _ = self.conn.recv()
                if status == "ready":
                    _grow_send_buffer(self.conn.fileno())
                    return
        except (EOFError, OSError):
            pass
        self.kill()
        raise RuntimeError(f"image worker {self.index} did not start (exit code {self.exitcode})")

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def exitcode(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5.0)

    def stop(self, timeout_s: float = 2.0) -> None:
        with contextlib.suppress(Exception):
            self.conn.send(None)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout_s)
        self.kill()


class WorkerPool:
    """``workers`` single-purpose processes; ``await run(kind, payload, spec)`` on any idle one."""

    def __init__(
        self,
        workers: int,
        *,
        threads_per_worker: int = 1,
        task_timeout_s: float = 10.0,
        memory_mb: int | None = None,
        nice: int = 0,
    ) -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self.size = workers
        self.threads_per_worker = threads_per_worker
        self.task_timeout_s = task_timeout_s
        self.memory_mb = memory_mb
        self.nice = nice
        self.stats = PoolStats()
        self._threads = ThreadPoolExecutor(max_workers=workers + 1, thread_name_prefix="image-pipe")
        self._workers: list[_Worker] = []
        self._idle: asyncio.Queue[_Worker] | None = None
        self._starting: asyncio.Future[None] | None = None
        self._closed = False
        self._lock = threading.Lock()  # guards _workers against concurrent replacement threads

    # -- lifecycle ----------------------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._idle is not None

    def pids(self) -> list[int]:
        with self._lock:
            return [w.pid for w in self._workers]

    async def start(self) -> None:
        """Start every worker (idempotent; concurrent callers wait for the same start)."""
        if self._closed:
            raise RuntimeError("the image worker pool is closed")
        if self._idle is not None:
            return
        loop = asyncio.get_running_loop()
        if self._starting is None:
            self._starting = loop.create_future()
            try:
                workers = await loop.run_in_executor(self._threads, self._spawn_all)
            except BaseException as exc:
                self._starting.set_exception(exc)
                self._starting = None
                raise
            idle: asyncio.Queue[_Worker] = asyncio.Queue()
            for worker in workers:
                idle.put_nowait(worker)
            self._idle = idle
            self._starting.set_result(None)
        else:
            await asyncio.shield(self._starting)

    def _spawn_all(self) -> list[_Worker]:
        workers = [_Worker(i, self.threads_per_worker, self.memory_mb, self.nice) for i in range(self.size)]
        try:
            for worker in workers:
                worker.wait_ready()
        except RuntimeError:
            for worker in workers:
                worker.kill()
            raise
        with self._lock:
            self._workers = list(workers)
        return workers

    async def close(self) -> None:
        """Stop every worker; tasks waiting for a worker fail."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        with self._lock:
            workers = list(self._workers)
            self._workers = []
        await loop.run_in_executor(self._threads, _stop_all, workers)
        self._threads.shutdown(wait=False, cancel_futures=True)

    # -- work ---------------------------------------------------------------------------------------------

    async def run(self, kind: str, payload: bytes | str | float, spec: ImageSpec | None) -> Any:
        """Run one task on an idle worker; raises ``ImageError`` (bad image) or ``WorkerCrashedError``."""
        await self.start()
        assert self._idle is not None
        idle = self._idle
        worker = await idle.get()
        if self._closed:
            raise WorkerCrashedError("the image worker pool is shutting down")
        loop = asyncio.get_running_loop()
        self.stats.tasks += 1
        future = loop.run_in_executor(self._threads, self._roundtrip, worker, (kind, payload, spec))
        # Whatever happens to the awaiting request (even cancellation), the worker goes back only once
        # its round trip is over: a worker is never handed two tasks at once.
        future.add_done_callback(lambda f: self._return_worker(idle, f))
        status, value, _ = await asyncio.shield(future)
        if status == "ok":
            return value
        if status == "error":
            self.stats.image_errors += 1
            raise ImageError(value)
        raise WorkerCrashedError(value)

    def _return_worker(self, idle: asyncio.Queue[_Worker], future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            return  # _roundtrip never raises; a cancelled executor future means we are closing
        _, _, worker = future.result()
        if not self._closed:
            idle.put_nowait(worker)

    def _roundtrip(self, worker: _Worker, task: tuple[str, Any, Any]) -> tuple[str, Any, _Worker]:
        """In a pool thread: send, wait (bounded), receive. A dead or stuck worker is replaced here."""
        if worker.exitcode is not None:  # died while idle: replace it before it costs a request
            log.warning("image worker %s (pid %s) died while idle (exit %s)", worker.index, worker.pid,
                        worker.exitcode)  # fmt: skip
            self.stats.crashes += 1
            worker = self._replace(worker)
        try:
            worker.conn.send(task)
            if worker.conn.poll(self.task_timeout_s):
                status, value = worker.conn.recv()
                return status, value, worker
            self.stats.timeouts += 1
            reason = (
                f"image processing took longer than {self.task_timeout_s:g} s; "
                "the worker was stopped and replaced"
            )
        except (EOFError, OSError, BrokenPipeError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(1.0)
            self.stats.crashes += 1
            code = worker.exitcode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            reason = f"the image worker died ({how}) while processing this image; it was replaced"
        log.warning("image worker %s (pid %s): %s", worker.index, worker.pid, reason)
        return "crashed", reason, self._replace(worker)

    def _replace(self, dead: _Worker) -> _Worker:
        dead.kill()
        fresh = _Worker(dead.index, self.threads_per_worker, self.memory_mb, self.nice)
        try:
            fresh.wait_ready()
        except RuntimeError:  # keep the slot: the next task on it fails fast and retries the start
            log.exception("image worker %s failed to restart", dead.index)
        self.stats.restarts += 1
        with self._lock:
            self._workers = [fresh if w is dead else w for w in self._workers]
            if self._closed:
                fresh.kill()
        return fresh


def _stop_all(workers: list[_Worker]) -> None:
    for worker in workers:
        with contextlib.suppress(Exception):
            worker.conn.send(None)
    for worker in workers:
        worker.stop(timeout_s=1.0)
