"""A process pool for image work that survives its workers dying.

``concurrent.futures.ProcessPoolExecutor`` marks the whole pool broken when one worker dies, failing every
request in flight. Here each worker is its own process with its own pipe: a worker that dies (a decoder
crash, the OOM killer, a task over its time limit) fails only the request it was serving, with a clear
error, and is replaced. The event loop never blocks: the parent's end of each pipe is non-blocking and
driven by the loop itself (``add_reader``/``add_writer``), in ``multiprocessing.Connection``'s framing so
the worker keeps a plain ``Connection``. No thread sits between the loop and the workers: a helper thread
per round trip (``run_in_executor``) meant two extra wake-ups and GIL hand-offs per image, and on a busy
CPU a helper thread preempted while holding the GIL stalls the loop with it. Threads remain only for
starting and replacing workers (seconds of blocking work, rare).

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
import pickle
import signal
import socket
import struct
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


class _Channel:
    """The parent's end of a worker's pipe, driven by the event loop. Frames are those of
    ``multiprocessing.connection.Connection``: a 4-byte big-endian signed length (or -1 and an 8-byte
    length), then the pickle."""

    __slots__ = ("_buf", "_waiter", "closed", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = bytearray()
        self.closed = False
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    def close(self) -> None:
        """Mark closed (any thread) before the fd is closed, and wake a pending wait so it sees it."""
        self.closed = True
        waiter = self._waiter
        if waiter is not None:
            loop, fut = waiter
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(_wake, fut)

    async def send(self, data: bytes) -> None:
        n = len(data)
        header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
        if n <= 16384:
            await self._write_all(memoryview(header + data))
        else:  # no copy of a large payload just to prepend 4 bytes
            await self._write_all(memoryview(header))
            await self._write_all(memoryview(data))

    async def recv(self) -> bytes:
        """One whole message; ``EOFError`` when the worker's end is closed (it died)."""
        while True:
            msg = self._take()
            if msg is not None:
                return msg
            if self.closed:
                raise EOFError("channel closed")
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                await self._wait(readable=True)
                continue
            if not chunk:
                raise EOFError("the worker closed its end")
            self._buf += chunk

    def _take(self) -> bytes | None:
        buf = self._buf
        if len(buf) < 4:
            return None
        (size,) = struct.unpack_from("!i", buf, 0)
        start = 4
        if size == -1:
            if len(buf) < 12:
                return None
            (size,) = struct.unpack_from("!Q", buf, 4)
            start = 12
        end = start + size
        if len(buf) < end:
            return None
        msg = bytes(buf[start:end])
        del buf[:end]
        return msg

    async def _write_all(self, view: memoryview) -> None:
        while view:
            if self.closed:
                raise EOFError("channel closed")
            try:
                n = os.write(self.fd, view)
            except BlockingIOError:
                await self._wait(readable=False)
                continue
            view = view[n:]

    async def _wait(self, *, readable: bool) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if self.closed:
            raise EOFError("channel closed")
        if readable:
            loop.add_reader(self.fd, _wake, fut)
        else:
            loop.add_writer(self.fd, _wake, fut)
        self._waiter = (loop, fut)
        try:
            await fut
        finally:
            self._waiter = None
            with contextlib.suppress(Exception):  # the fd may be gone if the pool closed meanwhile
                if readable:
                    loop.remove_reader(self.fd)
                else:
                    loop.remove_writer(self.fd)


#: Socket send buffer asked for on the parent's end (the kernel caps it at ``net.core.wmem_max``): a
#: multi-MB image payload then goes out in one or two ``write`` calls instead of one per ~200 KB (each a
#: copy, a wake-up of the worker and a loop callback; measured ~13 writes per 600 KB with the default).
SEND_BUFFER_BYTES = 4 * 1024 * 1024


def _grow_send_buffer(fd: int) -> None:
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        finally:
            sock.close()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _Worker:
    """One worker process and the parent's end of its pipe."""

    __slots__ = ("channel", "conn", "index", "proc")

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
        self.channel = _Channel(parent.fileno())

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Block until the worker imported its libraries (so task time limits exclude start-up); then the
        parent's end turns non-blocking for the event loop."""
        try:
            if self.conn.poll(timeout_s):
                status, _ = self.conn.recv()
                if status == "ready":
                    os.set_blocking(self.conn.fileno(), False)
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
        self.channel.close()  # before the fd number can be reused by another file
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
        # only for starting and replacing workers (blocking, rare); tasks never go through a thread
        self._threads = ThreadPoolExecutor(max_workers=workers + 1, thread_name_prefix="image-pool")
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
        self.stats.tasks += 1
        roundtrip = asyncio.ensure_future(self._roundtrip(worker, (kind, payload, spec)))
        # Whatever happens to the awaiting request (even cancellation), the worker goes back only once
        # its round trip is over: a worker is never handed two tasks at once.
        roundtrip.add_done_callback(lambda f: self._return_worker(idle, f))
        status, value, _ = await asyncio.shield(roundtrip)
        if status == "ok":
            return value
        if status == "error":
            self.stats.image_errors += 1
            raise ImageError(value)
        raise WorkerCrashedError(value)

    def _return_worker(self, idle: asyncio.Queue[_Worker], future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            return  # _roundtrip never raises; cancelled means the loop is shutting down
        _, _, worker = future.result()
        if not self._closed:
            idle.put_nowait(worker)

    async def _roundtrip(self, worker: _Worker, task: tuple[str, Any, Any]) -> tuple[str, Any, _Worker]:
        """Send, wait (bounded), receive, all on the event loop. A dead or stuck worker is replaced (the
        blocking start of its replacement runs on a thread)."""
        loop = asyncio.get_running_loop()
        if worker.exitcode is not None:  # died while idle: replace it before it costs a request
            log.warning("image worker %s (pid %s) died while idle (exit %s)", worker.index, worker.pid,
                        worker.exitcode)  # fmt: skip
            self.stats.crashes += 1
            worker = await self._replace_async(worker)
        try:
            data = pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL)
            async with asyncio.timeout(self.task_timeout_s):
                await worker.channel.send(data)
                reply = await worker.channel.recv()
            status, value = pickle.loads(reply)
            return status, value, worker
        except TimeoutError:
            if self._closed:
                return "crashed", "the image worker pool is shutting down", worker
            self.stats.timeouts += 1
            reason = (
                f"image processing took longer than {self.task_timeout_s:g} s; "
                "the worker was stopped and replaced"
            )
        except (EOFError, OSError):
            if self._closed:
                return "crashed", "the image worker pool is shutting down", worker
            code = await loop.run_in_executor(self._threads, _exit_code, worker)
            self.stats.crashes += 1
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            reason = f"the image worker died ({how}) while processing this image; it was replaced"
        except Exception as exc:  # a reply that does not unpickle: treat the worker as broken
            self.stats.crashes += 1
            reason = f"the image worker sent a broken reply ({exc.__class__.__name__}); it was replaced"
        log.warning("image worker %s (pid %s): %s", worker.index, worker.pid, reason)
        return "crashed", reason, await self._replace_async(worker)

    async def _replace_async(self, dead: _Worker) -> _Worker:
        """``_replace`` on a thread (starting a worker blocks for a while); nothing to do once closed."""
        if self._closed:
            return dead
        try:
            return await asyncio.get_running_loop().run_in_executor(self._threads, self._replace, dead)
        except RuntimeError:  # the executor shut down: the pool closed meanwhile
            return dead

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


def _exit_code(worker: _Worker) -> int | None:
    """The exit code of a worker whose pipe broke (waits up to 1 s for it to be reaped)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        worker.proc.wait(1.0)
    return worker.exitcode


def _stop_all(workers: list[_Worker]) -> None:
    for worker in workers:
        with contextlib.suppress(Exception):
            worker.conn.send(None)
    for worker in workers:
        worker.stop(timeout_s=1.0)
