"""Health on real llama.cpp replicas: stalled generation, crash, slow replica, and no false kills under load.

Replicas are ``llama-server`` processes (tiny model) started by the local process provider, the one the
runtime uses; the ``HealthMonitor`` judges them on evidence (probes, scraped ``llamacpp:`` token counters,
finished requests) and restarts them through the provider. The faults are real:

* **stalled generation**: the engine's inference thread (the main thread; HTTP runs on others) is stopped
  with ``ptrace`` (``PTRACE_SEIZE`` + ``PTRACE_INTERRUPT``): ``/health`` keeps answering 200, no request
  makes progress, and ``/metrics`` (served by the inference loop) hangs: the silent hang of the
  vLLM issues, reproduced on llama.cpp;
* **crash**: ``SIGKILL`` of the engine process;
* **slow replica**: the process is stopped and continued in a 60/40 duty cycle (``SIGSTOP``/``SIGCONT``), so
  it answers every probe, slowly: it must become ``suspect``, never be killed.

The SIGSTOP hang is ``tests/integration/test_health_sigstop.py``. The overload soak runs 20 s here (twice the
policy's ``progress_grace_s``, longer than its detection bound; ``FLEETGATE_SOAK_S=600`` for the 10-minute run
in docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import statistics
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from engine_http import MODEL
from health_tools import FAST, closed_loop_client, wait_until
from prometheus_client import CollectorRegistry

from fleetgate.core.health import HealthPolicy
from fleetgate.core.types import HealthState
from fleetgate.engines.dialects import dialect
from fleetgate.engines.llama import llama_command_template
from fleetgate.health import HealthMonitor
from fleetgate.providers.local import LocalProcessProvider
from real_engines import need_llama

SOAK_S = float(os.environ.get("FLEETGATE_SOAK_S", "20"))
pytestmark = pytest.mark.timeout(int(SOAK_S) + 150)

LLAMACPP = dialect("llamacpp")

_PTRACE_SEIZE, _PTRACE_INTERRUPT, _PTRACE_DETACH = 0x4206, 0x4207, 17


class StalledThread:
    """Stop one thread of another process with ptrace (the others run on); ``release`` continues it.

    Every call must come from the same OS thread (the tracer): here, the test's event-loop thread."""

    def __init__(self, tid: int) -> None:
        self.tid = tid
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        for request in (_PTRACE_SEIZE, _PTRACE_INTERRUPT):
            if self._libc.ptrace(request, tid, None, None) != 0:
                raise OSError(ctypes.get_errno(), f"ptrace({request:#x}, {tid}) failed")

    def release(self) -> None:
        """Detach (the thread runs again); a thread already gone (the replica was killed) is fine."""
        try:
            os.waitpid(self.tid, os.WNOHANG | 0x40000000)  # __WALL: collect the stop notification
        except ChildProcessError:
            pass
        self._libc.ptrace(_PTRACE_DETACH, self.tid, None, None)


@pytest.fixture
async def provider() -> AsyncIterator[LocalProcessProvider]:
    need_llama()
    prov = LocalProcessProvider(
        model=MODEL,
        command=llama_command_template(parallel=4, ctx_size=8192),
        url_from_output=False,
        health_path=LLAMACPP.health_path,
        stop_timeout_s=1.0,
    )
    try:
        yield prov
    finally:
        await prov.stop_all()


def _monitor(prov: LocalProcessProvider, reg: CollectorRegistry, policy: HealthPolicy) -> HealthMonitor:
    return HealthMonitor(
        model=MODEL,
        policy=policy,
        registry=reg,
        remediator=prov,
        scrape_interval_s=1.0,
        dialect=LLAMACPP,
        initial_state=HealthState.STARTING,
    )


async def _complete(url: str, max_tokens: int = 4, timeout_s: float = 10.0) -> int:
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": max_tokens}
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r,
    ):
        await r.read()
        return r.status


async def _health(url: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(url + "/health") as r:
        return r.status


async def test_stalled_generation_with_health_200_is_detected_and_restarted(
    provider: LocalProcessProvider,
) -> None:
    reps = {r.name: r for r in await provider.scale_to(1)}
    ((name, rep),) = reps.items()
    assert rep.pid is not None
    mon = _monitor(provider, CollectorRegistry(), FAST)
    mon.set_replicas({name: rep.url})
    await mon.start()
    stalled: StalledThread | None = None
    try:
        await wait_until(lambda: mon.state(name) == HealthState.HEALTHY, 30)
        stalled = StalledThread(rep.pid)  # the main thread runs llama-server's inference loop
        t0 = time.monotonic()
        assert await _health(rep.url) == 200  # the engine still says it is fine
        with pytest.raises(TimeoutError):
            await _complete(rep.url, timeout_s=1.5)  # ... while nothing makes progress
        out = await wait_until(lambda: not mon.routable(name), 20)
        await wait_until(lambda: mon.state(name) == HealthState.HEALTHY, 30)
        back = time.monotonic() - t0
        new = (await provider.list())[0]
        assert new.url == rep.url and new.pid != rep.pid
        assert await _complete(rep.url) == 200
        reasons = [t.reason for t in mon.events if t.new == HealthState.UNHEALTHY]
        assert reasons and all("probe" in r for r in reasons), reasons
        print(f"llama-server stalled generation: out of routing after {out:.1f} s, back after {back:.1f} s")
    finally:
        if stalled is not None:
            stalled.release()
        await mon.stop()


async def test_crash_is_restarted(provider: LocalProcessProvider) -> None:
    reps = {r.name: r for r in await provider.scale_to(1)}
    ((name, rep),) = reps.items()
    assert rep.pid is not None
    mon = _monitor(provider, CollectorRegistry(), FAST)
    mon.set_replicas({name: rep.url})
    await mon.start()
    try:
        await wait_until(lambda: mon.state(name) == HealthState.HEALTHY, 30)
        os.killpg(rep.pid, signal.SIGKILL)
        t0 = time.monotonic()
        out = await wait_until(lambda: not mon.routable(name), 15)
        await wait_until(lambda: mon.state(name) == HealthState.HEALTHY, 30)
        back = time.monotonic() - t0
        assert await _complete(rep.url) == 200
        reasons = [t.reason for t in mon.events if t.new == HealthState.UNHEALTHY]
        assert any("refused" in r for r in reasons), reasons
        print(f"llama-server SIGKILL: out of routing after {out:.1f} s, serving again after {back:.1f} s")
    finally:
        await mon.stop()


async def _duty_cycle(pid: int, stop: asyncio.Event, stopped_s: float, running_s: float) -> None:
    """Slow the whole process down: stopped ``stopped_s``, running ``running_s``, until ``stop``."""
    try:
        while not stop.is_set():
            os.killpg(pid, signal.SIGSTOP)
            await asyncio.sleep(stopped_s)
            os.killpg(pid, signal.SIGCONT)
            await asyncio.sleep(running_s)
    finally:
        os.killpg(pid, signal.SIGCONT)


async def test_slow_replica_is_suspect_not_killed(provider: LocalProcessProvider) -> None:
    reps = {r.name: r for r in await provider.scale_to(1)}
    ((name, rep),) = reps.items()
    assert rep.pid is not None
    policy = HealthPolicy(
        probe_idle_s=0.5, probe_timeout_s=5.0, slow_probe_s=0.1, suspect_probe_interval_s=0.3,
        starting_probe_interval_s=0.2,
    )  # fmt: skip
    mon = _monitor(provider, CollectorRegistry(), policy)
    mon.set_replicas({name: rep.url})
    await mon.start()
    stop = asyncio.Event()
    slow: asyncio.Task[None] | None = None
    try:
        await wait_until(lambda: mon.state(name) == HealthState.HEALTHY, 30)
        slow = asyncio.create_task(_duty_cycle(rep.pid, stop, stopped_s=0.3, running_s=0.2))
        await wait_until(lambda: mon.state(name) == HealthState.SUSPECT, 15)
        await asyncio.sleep(4.0)
        assert mon.routable(name)
        assert not [t for t in mon.events if t.new in (HealthState.UNHEALTHY, HealthState.RESTARTING)]
        stop.set()
        await slow
        await wait_until(lambda: mon.state(name) == HealthState.HEALTHY, 15)
        assert (await provider.list())[0].pid == rep.pid  # never restarted
    finally:
        stop.set()
        if slow is not None:
            await slow
        await mon.stop()


SLOTS = 4
PER_REPLICA = 5  # 125 % of the slots: a waiting queue at all times (llama.cpp defers the excess)


BODY = {"model": MODEL, "prompt": "word " * 600, "max_tokens": 96}


async def test_overload_soak_has_no_false_kills(provider: LocalProcessProvider) -> None:
    """Two llama-server replicas (4 slots each) under a closed loop of 5 requests per replica, real default
    health settings: probes wait behind the load (llama.cpp has no request priority) and none may kill."""
    reps = {r.name: r.url for r in await provider.scale_to(2)}
    reg = CollectorRegistry()
    mon = _monitor(provider, reg, HealthPolicy())
    mon.set_replicas(reps)
    stop = asyncio.Event()
    latencies: list[float] = []
    failed = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await mon.start()
        await wait_until(lambda: all(mon.state(n) == HealthState.HEALTHY for n in reps), 30)
        clients = [
            asyncio.create_task(closed_loop_client(session, mon, name, url, stop, BODY))
            for name, url in reps.items()
            for _ in range(PER_REPLICA)
        ]
        end = time.monotonic() + SOAK_S
        while time.monotonic() < end:
            for res in await asyncio.gather(*(mon.probe(n) for n in reps)):
                if res.ok:
                    latencies.append(res.latency_s)
                else:
                    failed += 1
            await asyncio.sleep(1.0)
        stop.set()
        completed = sum(await asyncio.gather(*clients))
    await mon.stop()
    bad = [t for t in mon.events if t.new in (HealthState.UNHEALTHY, HealthState.RESTARTING)]
    assert not bad, bad
    assert completed > 0 and latencies
    p50 = statistics.median(latencies)
    p99 = sorted(latencies)[max(0, int(len(latencies) * 0.99) - 1)]
    print(
        f"llama-server soak {SOAK_S:.0f} s at {PER_REPLICA}/{SLOTS} of the slots: {completed} requests, "
        f"{len(latencies)} probes ok, {failed} failed, probe latency p50 {p50 * 1000:.0f} ms "
        f"p99 {p99 * 1000:.0f} ms, remediations 0"
    )
