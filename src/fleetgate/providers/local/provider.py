"""Engine replicas as local child processes (the embedded default, tests, single-machine fleets).

Processes are started and stopped through ``process.py`` (own process group, ``PR_SET_PDEATHSIG``), all with
asyncio: nothing here blocks the event loop. A replica is ready when it prints ``... ready on
http://HOST:PORT`` (the simulated engine's line) or, for other commands with a known port, when
``GET {url}{health_path}`` answers 200 (the engine dialect's health path). Restarts reuse the replica's port,
so its address stays the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

from fleetgate.providers.base import (
    ChangeListener,
    DrainHook,
    ProviderError,
    ReplicaInfo,
    ReplicaList,
    ReplicaStatus,
)
from fleetgate.providers.local.process import die_with_parent, free_port, signal_group
from fleetgate.tasks import cancel_and_wait

log = logging.getLogger("fleetgate.providers.local")

READY_LINE = re.compile(r"ready on (https?://[^\s]+)")


def sim_engine_command(extra_args: Sequence[str] = ()) -> list[str]:
    """Command template of one simulated-engine replica (``{port}``, ``{model}``, ``{name}`` filled in)."""
    return [
        sys.executable,
        "-m",
        "fleetgate.cli",
        "engine",
        "sim",
        "--port",
        "{port}",
        "--model",
        "{model}",
        *extra_args,
    ]


@dataclass(slots=True)
class _Proc:
    name: str
    port: int
    url: str = ""
    status: ReplicaStatus = ReplicaStatus.STARTING
    process: asyncio.subprocess.Process | None = None
    reader: asyncio.Task[None] | None = None
    ready: asyncio.Future[str] | None = None
    log_tail: list[str] = field(default_factory=list)

    def info(self) -> ReplicaInfo:
        pid = self.process.pid if self.process is not None else None
        return ReplicaInfo(self.name, self.url, self.status, pid)


class LocalProcessProvider:
    """Starts, stops, restarts and drains replica processes of one model on this machine."""

    def __init__(
        self,
        *,
        model: str,
        command: Sequence[str] | None = None,
        host: str = "127.0.0.1",
        name_prefix: str = "sim",
        ready_timeout_s: float = 60.0,
        stop_timeout_s: float = 5.0,
        drain_timeout_s: float = 30.0,
        health_path: str = "/health",
        url_from_output: bool | None = None,
        env: Mapping[str, str] | None = None,
        on_change: ChangeListener | None = None,
        drain_hook: DrainHook | None = None,
    ) -> None:
        self.model = model
        self.command = list(command) if command is not None else sim_engine_command()
        self.host = host
        self.name_prefix = name_prefix
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.health_path = health_path
        # the simulated engine binds port 0 and prints its URL; other commands get a port chosen here
        self.url_from_output = command is None if url_from_output is None else url_from_output
        self.env = dict(env) if env is not None else None
        self.on_change = on_change
        self.drain_hook = drain_hook
        self._procs: dict[str, _Proc] = {}
        self._next = 0
        self._lock = asyncio.Lock()

    # -- protocol ------------------------------------------------------------------------------------------

    async def list(self) -> ReplicaList:
        return [p.info() for p in self._procs.values() if p.status != ReplicaStatus.STOPPED]

    async def scale_to(self, replicas: int) -> ReplicaList:
        if replicas < 0:
            raise ProviderError("replicas must be >= 0")
        async with self._lock:
            live = [p for p in self._procs.values() if p.status != ReplicaStatus.STOPPED]
            if len(live) < replicas:
                names = [self._new_name() for _ in range(replicas - len(live))]
                results = await asyncio.gather(*(self._start(n, 0) for n in names), return_exceptions=True)
                errors = [r for r in results if isinstance(r, BaseException)]
                if errors:
                    self._notify()
                    raise ProviderError(f"{len(errors)} replica(s) failed to start: {errors[0]}")
            elif len(live) > replicas:
                victims = live[replicas:][::-1]
                await asyncio.gather(*(self._drain_and_stop(p) for p in victims))
                for p in victims:
                    self._procs.pop(p.name, None)
        self._notify()
        return await self.list()

    async def restart(self, name: str) -> ReplicaInfo:
        proc = self._procs.get(name)
        if proc is None:
            raise ProviderError(f"unknown replica {name!r}")
        log.info("restarting replica %s on port %d", name, proc.port)
        await self._kill(proc)
        try:
            await self._start(name, proc.port)
        except Exception as exc:
            # Keep it known under its name and address (not routable: the prober has it unhealthy and
            # retries the restart with backoff); forgetting it would lose the replica for good.
            failed = self._procs.get(name)
            if failed is not None:
                failed.url = failed.url or proc.url
                failed.status = ReplicaStatus.STARTING
            self._notify()
            if isinstance(exc, ProviderError):
                raise
            raise ProviderError(f"replica {name} could not be restarted: {exc}") from exc
        self._notify()
        return self._procs[name].info()

    async def drain(self, name: str) -> None:
        proc = self._procs.get(name)
        if proc is None:
            raise ProviderError(f"unknown replica {name!r}")
        proc.status = ReplicaStatus.DRAINING
        if self.drain_hook is not None:
            await self.drain_hook(name, self.drain_timeout_s)

    # -- extras --------------------------------------------------------------------------------------------

    async def stop(self, name: str) -> None:
        """Drain then stop one replica and forget it."""
        proc = self._procs.get(name)
        if proc is None:
            raise ProviderError(f"unknown replica {name!r}")
        await self._drain_and_stop(proc)
        self._procs.pop(name, None)
        self._notify()

    async def stop_all(self) -> None:
        """Kill every replica (no drain: the gateway in front has already drained). Leaves no process."""
        procs = list(self._procs.values())
        await asyncio.gather(*(self._kill(p) for p in procs), return_exceptions=True)
        self._procs.clear()

    def pids(self) -> tuple[int, ...]:
        return tuple(p.process.pid for p in self._procs.values() if p.process is not None)

    # -- internals -----------------------------------------------------------------------------------------

    def _new_name(self) -> str:
        while True:
            name = f"{self.name_prefix}-{self._next}"
            self._next += 1
            if name not in self._procs:
                return name

    def _notify(self) -> None:
        """Tell the gateway which replicas exist: running ones, and ones whose restart failed (kept, under
        their address, so the prober keeps retrying them)."""
        if self.on_change is not None:
            self.on_change(
                [
                    p.info()
                    for p in self._procs.values()
                    if p.status == ReplicaStatus.RUNNING or (p.status == ReplicaStatus.STARTING and p.url)
                ]
            )

    async def _drain_and_stop(self, proc: _Proc) -> None:
        proc.status = ReplicaStatus.DRAINING
        if self.drain_hook is not None:
            try:
                await self.drain_hook(proc.name, self.drain_timeout_s)
            except Exception:  # draining is best effort; stopping must still happen
                log.exception("draining %s", proc.name)
        await self._kill(proc)

    async def _start(self, name: str, port: int) -> _Proc:
        if "{port}" not in " ".join(self.command):
            raise ProviderError("the replica command template must contain {port}")
        wanted = port
        if wanted == 0 and not self._reports_url():
            wanted = free_port(self.host)
        args = [a.format(port=wanted, model=self.model, name=name, host=self.host) for a in self.command]
        proc = _Proc(name=name, port=wanted)
        self._procs[name] = proc
        loop = asyncio.get_running_loop()
        proc.ready = loop.create_future()
        proc.process = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})},
        )
        proc.reader = asyncio.create_task(self._read_output(proc), name=f"replica-output-{name}")
        try:
            async with asyncio.timeout(self.ready_timeout_s):
                if self._reports_url():
                    url = await proc.ready
                else:
                    url = f"http://{self.host}:{wanted}"
                    await self._wait_healthy(proc, url)
        except (TimeoutError, ProviderError) as exc:
            tail = "\n".join(proc.log_tail[-20:])
            await self._kill(proc)
            raise ProviderError(f"replica {name} did not become ready: {exc or 'timeout'}\n{tail}") from exc
        proc.url = url.rstrip("/")
        proc.port = int(url.rsplit(":", 1)[1].split("/")[0])
        proc.status = ReplicaStatus.RUNNING
        log.info("replica %s ready at %s (pid %d)", name, proc.url, proc.process.pid)
        return proc

    def _reports_url(self) -> bool:
        return self.url_from_output

    async def _read_output(self, proc: _Proc) -> None:
        assert proc.process is not None and proc.process.stdout is not None
        stream = proc.process.stdout
        while True:
            line_b = await stream.readline()
            if not line_b:
                break
            line = line_b.decode("utf-8", "replace").rstrip()
            proc.log_tail.append(line)
            del proc.log_tail[:-50]
            log.debug("[%s] %s", proc.name, line)
            if proc.ready is not None and not proc.ready.done():
                match = READY_LINE.search(line)
                if match:
                    proc.ready.set_result(match.group(1))
        if proc.ready is not None and not proc.ready.done():
            proc.ready.set_exception(ProviderError(f"process exited with code {await proc.process.wait()}"))

    async def _wait_healthy(self, proc: _Proc, url: str) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                if proc.process is not None and proc.process.returncode is not None:
                    raise ProviderError(f"process exited with code {proc.process.returncode}")
                with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                    async with session.get(
                        url + self.health_path, timeout=aiohttp.ClientTimeout(total=1)
                    ) as r:
                        if r.status == 200:
                            return
                await asyncio.sleep(0.1)

    async def _kill(self, proc: _Proc) -> None:
        """SIGTERM the replica's process group, SIGKILL it after ``stop_timeout_s``, reap it."""
        process = proc.process
        proc.status = ReplicaStatus.STOPPED
        if process is not None and process.returncode is None:
            signal_group(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), self.stop_timeout_s)
            except TimeoutError:
                signal_group(process.pid, signal.SIGKILL)
                await process.wait()
        if process is not None:
            signal_group(process.pid, signal.SIGKILL)  # stragglers the engine forked, if any
        await cancel_and_wait(proc.reader)
        proc.process = None
