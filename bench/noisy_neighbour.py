"""Noisy neighbour, live: a reserved tenant's TTFT alone vs next to a best-effort tenant at 10x capacity.

One run, two phases, real processes on 127.0.0.1 (simulated engines + one ``fleetgate serve`` gateway):

* phase A: ``gold`` (reserved, interactive) alone, paced open loop at ``--gold-share`` of its reservation;
* phase B: the same ``gold`` load plus ``free`` (best-effort) sending ``--free-factor`` x the fleet's capacity
  (Poisson open loop, in MU).

It reports gold's TTFT p50/p95 per phase (and the ratio B/A), the share of gold's requests admitted, free's
outcomes (200 / 429 / 503 / other), and checks that every request sent has an explicit outcome.

Engine and cost model (chosen so the 2-core machine, not the fleet, is never the bottleneck):

* each engine: ``max_num_seqs`` 64, ``step_overhead_s`` 0.01, ``decode_s_per_seq`` 1e-5, no KV-token
  term, ``prefill_s_per_token`` 5e-5, prefix cache off, time scale 1 (real time). A decode step is almost flat
  in the batch size (a memory-bound decode), so more sequences in the batch barely slow anyone down;
* the cost profile is derived from those parameters (``capacity_mu_per_min`` 100 per replica, i.e. MU =
  replica-seconds x 100/60): ``alpha`` = prefill seconds per prompt token, ``beta`` = a full step divided by
  ``max_num_seqs`` (the decode time per token at saturation); so the admission's idea of "fleet capacity"
  is the engine's real saturation throughput;
* gold's requests are prompt-heavy and short (``--gold-prompt-tokens`` 2000, 4 output tokens, streamed):
  TTFT is measured at the client, to the first content chunk; free's are decode-heavy (a short prompt,
  ``--free-max-tokens`` 1536 output tokens, not streamed) so 10x the capacity in MU is only ~80 req/s and
  the load generator and gateway stay cheap (the price: free's requests take ~30 s, which the run awaits).

Clients: gold's requests are sent and timed by this process; free's flood comes from a child process
(``FloodProcess``), as a real neighbour's traffic comes from another client, so that building, sending and
reading ~80 requests/s never delays the event loop that timestamps gold's first chunk
(``--same-process-flood``: the old single-loop design). The deployment has ``engine_priority: true`` (the
tenant's class goes to the engine's ``priority`` field, as with vLLM ``--scheduling-policy priority``;
``--no-engine-priority`` turns it off).

The bench also samples each engine's running/waiting requests (``/admin/stats``), the CPU used by the
gateway and engines per phase, and every 100 ms this process's event-loop lag, the gateway's ``/healthz``
latency, the host's CPU pressure (``/proc/pressure/cpu``) and the run-queue wait (``/proc/PID/schedstat``:
time runnable but not running) of the gateway, the engines and the load generator; it lists gold's slowest
requests with what those samples showed during each one, to tell queueing in the engine or the gateway from
a host short of CPU.

Run: ``.venv/bin/python bench/noisy_neighbour.py --out bench/results/noisy_neighbour.json``
(``--phase-s 30`` per phase; about 100 s in all; exit status 0 only when every target is met).
``tests/integration/test_noisy_neighbour.py`` runs a shorter version with looser TTFT bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from fleetgate.core.tokenize import count_tokens, render_chat_prompt
from fleetgate.core.units import CostProfile
from fleetgate.engines.calibration_probe import process_cpu_seconds
from fleetgate.profiles import load_profile

MODEL = "fleetgate-sim"
GOLD_KEY = "sk-gold-bench"
FREE_KEY = "sk-free-bench"
ADMIN_KEY = "sk-admin-bench"
READY = re.compile(r"ready on (http://127\.0\.0\.1:\d+)")
HOST_STALL_MS = 30.0  # a 100 ms sample in which the load generator waited this long for a CPU
WORDS = ("alpha", "bravo", "delta", "echo", "golf", "hotel", "india", "kilo", "lima", "mike", "oscar", "papa")


@dataclass(frozen=True)
class BenchParams:
    engines: int = 2
    phase_s: float = 30.0
    warmup_s: float = 3.0
    gold_share: float = 0.9  # of gold's reservation
    reserved_share: float = 0.5  # gold's reservation, share of the fleet's capacity
    free_factor: float = 10.0  # free offers this many times the fleet's capacity (MU)
    gold_prompt_tokens: int = 2000
    gold_max_tokens: int = 4
    free_max_tokens: int = 1536
    capacity_mu_per_min: float = 100.0  # per replica
    max_num_seqs: int = 64
    step_overhead_s: float = 0.01
    decode_s_per_seq: float = 1e-5
    prefill_s_per_token: float = 5e-5
    time_scale: float = 1.0
    best_effort_max_utilization: float | None = None  # None: the config default
    drain_timeout_s: float = 60.0
    seed: int = 1
    flood_process: bool = True  # free's client in its own process (False: one client loop for both)
    engine_priority: bool | None = True  # deployments' engine_priority (None: the config's default)
    #: a fleetgate config whose gateway starts its own engines (e.g. examples/tenants.yaml): the gateway runs
    #: it as written (port 0, warnings only); gold and free use its tenants' keys below
    config: str | None = None
    gold_key: str = GOLD_KEY
    admin_key: str = ADMIN_KEY
    free_key: str = FREE_KEY
    gold_rate_per_s: float | None = None  # None: gold_share of its reservation at its estimated cost
    flood_concurrency: int = 0  # > 0: free is this many closed-loop clients instead of an open loop
    free_stream: bool = False  # free's requests streamed (every token through the gateway)
    gold_idle_phase_s: float = 0.0  # > 0: phase C, free alone after gold went idle (its throughput)
    latency_headroom: bool | None = None  # admission.latency_headroom.enabled (None: the default, on)


@dataclass
class Outcome:
    tenant: str
    phase: str
    status: int  # HTTP status, or 0 for a client-side error (timeout, reset)
    ttft_s: float | None = None
    otps: float | None = None  # content chunks after the first / seconds after the first (streams >= 2)
    error: str = ""
    tier: str = ""
    sent_s: float = 0.0  # perf_counter at send


@dataclass
class Run:
    params: BenchParams
    outcomes: list[Outcome] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------- processes
class Proc:
    """A child process in its own process group that prints ``... ready on http://127.0.0.1:PORT``."""

    def __init__(self, args: Sequence[str], name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self.url: str | None = None
        self._ready = threading.Event()
        self.proc = subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if len(self.lines) < 2000:
                self.lines.append(line.rstrip("\n"))
            m = READY.search(line)
            if m and self.url is None:
                self.url = m.group(1)
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float = 60.0) -> str:
        if not self._ready.wait(timeout) or self.url is None:
            self.kill()
            tail = "\n".join(self.lines[-40:])
            raise RuntimeError(f"{self.name} did not become ready:\n{tail}")
        return self.url

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


# ------------------------------------------------------------------------------------------- model
def engine_profile(p: BenchParams) -> dict[str, Any]:
    return {
        "perf": {
            "max_num_seqs": p.max_num_seqs,
            "step_overhead_s": p.step_overhead_s,
            "decode_s_per_seq": p.decode_s_per_seq,
            "decode_s_per_kv_token": 0.0,
            "prefill_s_per_token": p.prefill_s_per_token,
            "prefix_cache_blocks": 0,
        }
    }


def cost_profile(p: BenchParams) -> CostProfile:
    """MU = replica-seconds x capacity/60, with the replica-seconds of these engine parameters (scaled to
    real time by ``time_scale``): prefill per prompt token, a full step / max_num_seqs per output token."""
    mu_per_s = p.capacity_mu_per_min / 60.0
    full_step = p.step_overhead_s + p.decode_s_per_seq * p.max_num_seqs
    base = load_profile(MODEL)
    return replace(
        base,
        name="noisy-neighbour-bench",
        alpha=mu_per_s * p.prefill_s_per_token * p.time_scale,
        beta=mu_per_s * full_step / p.max_num_seqs * p.time_scale,
        gamma=0.0,
        delta=0.0,
        epsilon=0.0,
        capacity_mu_per_min=p.capacity_mu_per_min,
        perf={},
        fit={},
    )


def gold_messages(i: int, tokens: int) -> list[dict[str, str]]:
    words = [WORDS[(i * 7 + k) % len(WORDS)] for k in range(tokens)]
    return [{"role": "user", "content": f"q{i} " + " ".join(words)}]


def free_messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"batch job {i}: summarise"}]


def prompt_tokens(messages: list[dict[str, str]]) -> int:
    return count_tokens(render_chat_prompt(messages))


# ------------------------------------------------------------------------------------------- load
async def gold_request(
    session: aiohttp.ClientSession, url: str, i: int, p: BenchParams, phase: str, run: Run
) -> None:
    body = {
        "model": MODEL,
        "messages": gold_messages(i, p.gold_prompt_tokens),
        "max_tokens": p.gold_max_tokens,
        "stream": True,
    }
    start = time.perf_counter()
    out = Outcome("gold", phase, 0, sent_s=start)
    try:
        async with session.post(
            url + "/v1/chat/completions",
            data=orjson.dumps(body),
            headers={"Authorization": f"Bearer {p.gold_key}"},
        ) as resp:
            out.status = resp.status
            out.tier = resp.headers.get("x-fleetgate-tier", "")
            if resp.status != 200:
                out.error = (await resp.text())[:200]
            else:
                chunks, last = 0, 0.0
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        chunk = orjson.loads(line[6:])
                        choices = chunk.get("choices") or []
                        if choices and (choices[0].get("delta") or {}).get("content"):
                            last = time.perf_counter() - start
                            chunks += 1
                            if out.ttft_s is None:
                                out.ttft_s = last
                if out.ttft_s is not None and chunks >= 2 and last > out.ttft_s:
                    out.otps = (chunks - 1) / (last - out.ttft_s)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        out.status = 0
        out.error = type(exc).__name__
    run.outcomes.append(out)


async def free_request(
    session: aiohttp.ClientSession, url: str, i: int, p: BenchParams, phase: str, run: Run
) -> float:
    """One request of free's; returns the Retry-After it got (0 when none)."""
    body = {"model": MODEL, "messages": free_messages(i), "max_tokens": p.free_max_tokens}
    if p.free_stream:
        body["stream"] = True
    out = Outcome("free", phase, 0)
    retry = 0.0
    try:
        async with session.post(
            url + "/v1/chat/completions",
            data=orjson.dumps(body),
            headers={"Authorization": f"Bearer {p.free_key}"},
        ) as resp:
            out.status = resp.status
            out.tier = resp.headers.get("x-fleetgate-tier", "")
            with contextlib.suppress(ValueError):
                retry = float(resp.headers.get("Retry-After", "0"))
            await resp.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        out.status = 0
        out.error = type(exc).__name__
    run.outcomes.append(out)
    return retry


async def closed_loop(launch: Any, workers: int, duration_s: float, counter: list[int]) -> None:
    """``workers`` clients, each sending its next request when the last answered (after a refusal, it
    waits the Retry-After, at most 1 s, as a polite client does), until ``duration_s`` is over."""
    loop = asyncio.get_running_loop()
    end = loop.time() + duration_s

    async def worker() -> None:
        while loop.time() < end:
            i = counter[0]
            counter[0] += 1
            retry = await launch(i)
            if retry > 0:
                await asyncio.sleep(min(retry, 1.0, max(0.0, end - loop.time())))

    await asyncio.gather(*(worker() for _ in range(workers)))


async def open_loop(
    launch: Any,
    rate_per_s: float,
    duration_s: float,
    tasks: set[asyncio.Task[None]],
    *,
    poisson: bool,
    rng: random.Random,
    counter: list[int],
) -> None:
    """Start ``launch(i)`` at planned instants (never waits for responses): paced, or Poisson arrivals."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    t_next = t0
    end = t0 + duration_s
    while True:
        t_next += rng.expovariate(rate_per_s) if poisson else 1.0 / rate_per_s
        if t_next >= end:
            break
        delay = t_next - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        i = counter[0]
        counter[0] += 1
        task = asyncio.ensure_future(launch(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


def sched_wait_s(pid: int) -> float:
    """Seconds the process's threads have waited on a run queue (runnable, not running): Linux
    ``/proc/PID/task/*/schedstat`` field 2; 0 elsewhere. Its growth is CPU contention, not work."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
    return total / 1e9


def psi_cpu_some_s() -> float:
    """Host CPU pressure: seconds in which some runnable task waited for a CPU (/proc/pressure/cpu)."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return int(line.rsplit("total=", 1)[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return 0.0


async def sample_system(
    session: aiohttp.ClientSession, url: str, pids: dict[str, Any], phase: list[str], run: Run
) -> None:
    """Every 100 ms: this process's event-loop lag, the gateway's ``/healthz`` latency, host CPU pressure
    and the run-queue wait of the gateway, the engines and this load generator. One row per sample in
    ``run.extra["samples"]``: (t, phase, loop_lag_ms, healthz_ms, psi_share, gateway_wait_ms,
    engines_wait_ms, loadgen_wait_ms), the waits and the pressure over the previous interval."""
    rows: list[tuple[Any, ...]] = []
    run.extra["samples"] = rows
    loop = asyncio.get_running_loop()
    me = os.getpid()

    def waits() -> tuple[float, float, float, float]:
        return (
            psi_cpu_some_s(),
            sched_wait_s(pids["gateway"]),
            sum(sched_wait_s(e) for e in pids["engines"]),
            sched_wait_s(me),
        )

    prev, prev_t = waits(), loop.time()
    interval = 0.1
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        now = loop.time()
        lag_ms = max(0.0, now - due) * 1000
        t = time.perf_counter()
        try:
            async with session.get(url + "/healthz") as resp:
                await resp.read()
            healthz_ms: float | None = (time.perf_counter() - t) * 1000
        except (aiohttp.ClientError, TimeoutError, OSError):
            healthz_ms = None
        cur, cur_t = waits(), loop.time()
        dt = max(cur_t - prev_t, 1e-6)
        rows.append(
            (
                round(time.perf_counter(), 4),
                phase[0],
                round(lag_ms, 2),
                None if healthz_ms is None else round(healthz_ms, 2),
                round((cur[0] - prev[0]) / dt, 3),
                round((cur[1] - prev[1]) * 1000, 2),
                round((cur[2] - prev[2]) * 1000, 2),
                round((cur[3] - prev[3]) * 1000, 2),
            )
        )
        prev, prev_t = cur, cur_t


def _system_summary(rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    """Per phase: loop lag and /healthz p50/p99/max, mean CPU pressure, run-queue wait per second."""
    out: dict[str, Any] = {}
    for phase in ("A", "B"):
        sel = [r for r in rows if r[1] == phase]
        if not sel:
            continue
        lag = [r[2] for r in sel]
        hz = [r[3] for r in sel if r[3] is not None]
        span = max(sel[-1][0] - sel[0][0], 1e-6)
        out[phase] = {
            "samples": len(sel),
            "loadgen_loop_lag_ms_p50_p99_max": [quantile(lag, 0.5), quantile(lag, 0.99), max(lag)],
            "gateway_healthz_ms_p50_p99_max": [quantile(hz, 0.5), quantile(hz, 0.99), max(hz, default=None)],
            "host_cpu_pressure_mean": round(sum(r[4] for r in sel) / len(sel), 3),
            "runqueue_wait_ms_per_s": {
                "gateway": round(sum(r[5] for r in sel) / span, 1),
                "engines": round(sum(r[6] for r in sel) / span, 1),
                "loadgen": round(sum(r[7] for r in sel) / span, 1),
            },
        }
    return out


def _around(rows: list[tuple[Any, ...]], start: float, end: float) -> dict[str, Any]:
    """What the system samples say about one request's lifetime [start, end] (perf_counter seconds)."""
    sel = [r for r in rows if start <= r[0] <= end + 0.1]
    if not sel:
        return {}
    hz = [r[3] for r in sel if r[3] is not None]
    return {
        "loop_lag_max_ms": max(r[2] for r in sel),
        "healthz_max_ms": max(hz, default=None),
        "cpu_pressure_max": max(r[4] for r in sel),
        "runqueue_wait_ms": {
            "gateway": round(sum(r[5] for r in sel), 1),
            "engines": round(sum(r[6] for r in sel), 1),
            "loadgen": round(sum(r[7] for r in sel), 1),
        },
    }


async def watch_engines(
    session: aiohttp.ClientSession, urls: Sequence[str], phase: list[str], run: Run
) -> None:
    """Every 0.25 s: each engine's running / waiting requests (the engine's own queue), per phase."""
    peaks: dict[str, dict[str, int]] = {}
    run.extra["engine_peaks"] = peaks
    while True:
        for u in urls:
            try:
                async with session.get(u + "/admin/stats") as resp:
                    eng = (await resp.json())["engine"]
            except (aiohttp.ClientError, TimeoutError, OSError, KeyError):
                continue
            peak = peaks.setdefault(phase[0], {"max_running": 0, "max_waiting": 0, "samples_waiting": 0})
            peak["max_running"] = max(peak["max_running"], int(eng["num_running"]))
            peak["max_waiting"] = max(peak["max_waiting"], int(eng["num_waiting"]))
            peak["samples_waiting"] += int(eng["num_waiting"] > 0)
        await asyncio.sleep(0.25)


# ------------------------------------------------------------------------------------------- run
def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    k = max(0, min(len(xs) - 1, math.ceil(q * len(xs)) - 1))  # nearest rank
    return xs[k]


def summarize(run: Run) -> dict[str, Any]:
    p = run.params
    prof = cost_profile(p)
    fleet_mu_per_min = p.capacity_mu_per_min * p.engines
    res: dict[str, Any] = {"params": asdict(p)}
    phases: dict[str, Any] = {}
    for phase in ("A", "B"):
        gold = [o for o in run.outcomes if o.tenant == "gold" and o.phase == phase]
        ttfts = [o.ttft_s for o in gold if o.status == 200 and o.ttft_s is not None]
        admitted = sum(1 for o in gold if o.status == 200)
        phases[phase] = {
            "gold_sent": run.sent.get(f"gold-{phase}", 0),
            "gold_outcomes": len(gold),
            "gold_admitted": admitted,
            "gold_admitted_share": admitted / len(gold) if gold else None,
            "gold_statuses": _counts(gold),
            "gold_ttft_p50_s": quantile(ttfts, 0.5),
            "gold_ttft_p95_s": quantile(ttfts, 0.95),
            "gold_ttft_p99_s": quantile(ttfts, 0.99),
            "gold_ttft_n": len(ttfts),
            "gold_otps_p10": quantile([o.otps for o in gold if o.otps is not None], 0.10),
        }
        # Diagnostic only (the acceptance figure is the raw p95 above): gold's p95 without the requests
        # that lived through a host-wide CPU stall, i.e. a 100 ms sample in which the load generator, whose
        # own work is the same light load in both phases, waited >= HOST_STALL_MS for a CPU.
        rows_all = run.extra.get("samples") or []
        stalls = [r[0] for r in rows_all if r[7] >= HOST_STALL_MS]
        calm = [
            o.ttft_s
            for o in gold
            if o.status == 200
            and o.ttft_s is not None
            and not any(o.sent_s <= t <= o.sent_s + o.ttft_s + 0.1 for t in stalls)
        ]
        phases[phase]["host_stall_samples"] = sum(
            1 for r in rows_all if r[1] == phase and r[7] >= HOST_STALL_MS
        )
        phases[phase]["gold_ttft_p95_outside_host_stalls_s"] = quantile(calm, 0.95)
        phases[phase]["gold_ttft_n_outside_host_stalls"] = len(calm)
        t0 = min((o.sent_s for o in gold), default=0.0)
        slowest = sorted((o for o in gold if o.ttft_s is not None), key=lambda o: -(o.ttft_s or 0.0))[:5]
        rows = run.extra.get("samples") or []
        phases[phase]["gold_slowest"] = [
            {
                "at_s": round(o.sent_s - t0, 2),
                "ttft_ms": round((o.ttft_s or 0.0) * 1000, 1),
                **_around(rows, o.sent_s, o.sent_s + (o.ttft_s or 0.0)),
            }
            for o in slowest
        ]
    free = [o for o in run.outcomes if o.tenant == "free" and o.phase == "B"]
    phases["B"]["free_sent"] = run.sent.get("free-B", 0)
    phases["B"]["free_statuses"] = _counts(free)
    phases["B"]["free_served_per_s"] = sum(1 for o in free if o.status == 200) / p.phase_s
    if p.gold_idle_phase_s > 0:  # free alone with gold idle: best-effort is not starved by the gate
        free_c = [o for o in run.outcomes if o.tenant == "free" and o.phase == "C"]
        phases["C"] = {
            "free_sent": run.sent.get("free-C", 0),
            "free_statuses": _counts(free_c),
            "free_served_per_s": sum(1 for o in free_c if o.status == 200) / p.gold_idle_phase_s,
        }
    free_cost = prof.cost(prompt_tokens(free_messages(0)), p.free_max_tokens)
    phases["B"]["free_admitted_mu_per_min"] = (
        sum(1 for o in free if o.status == 200) * free_cost * 60.0 / p.phase_s
    )
    a, b = phases["A"], phases["B"]
    res["phases"] = phases
    res["fleet_capacity_mu_per_min"] = fleet_mu_per_min
    res["gold_reserved_mu_per_min"] = fleet_mu_per_min * p.reserved_share
    res["gold_cost_mu"] = prof.cost(prompt_tokens(gold_messages(0, p.gold_prompt_tokens)), p.gold_max_tokens)
    res["free_cost_mu"] = free_cost
    res["ttft_p95_ratio"] = (
        b["gold_ttft_p95_s"] / a["gold_ttft_p95_s"] if a["gold_ttft_p95_s"] and b["gold_ttft_p95_s"] else None
    )
    res["ttft_p50_ratio"] = (
        b["gold_ttft_p50_s"] / a["gold_ttft_p50_s"] if a["gold_ttft_p50_s"] and b["gold_ttft_p50_s"] else None
    )
    res["otps_p10_ratio"] = (
        b["gold_otps_p10"] / a["gold_otps_p10"] if a["gold_otps_p10"] and b["gold_otps_p10"] else None
    )
    res["gold_admitted_share_B"] = b["gold_admitted_share"]
    sent_total = sum(run.sent.values())
    res["requests_sent"] = sent_total
    res["requests_with_outcome"] = len(run.outcomes)
    res["client_errors"] = sum(1 for o in run.outcomes if o.status == 0)
    res["nothing_lost"] = sent_total == len(run.outcomes) and res["client_errors"] == 0
    pa, pb = a["gold_ttft_p95_outside_host_stalls_s"], b["gold_ttft_p95_outside_host_stalls_s"]
    res["ttft_p95_ratio_outside_host_stalls"] = pb / pa if pa and pb else None
    res.update({k: v for k, v in run.extra.items() if k != "samples"})
    res["system_samples"] = {
        "columns": [
            "t", "phase", "loadgen_loop_lag_ms", "gateway_healthz_ms", "host_cpu_pressure",
            "gateway_runqueue_wait_ms", "engines_runqueue_wait_ms", "loadgen_runqueue_wait_ms",
        ],
        "rows": run.extra.get("samples") or [],
    }  # fmt: skip
    res["system"] = _system_summary(run.extra.get("samples") or [])
    return res


def _counts(outcomes: list[Outcome]) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in outcomes:
        key = str(o.status) if o.status else f"client_error:{o.error}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


async def run_benchmark(p: BenchParams, workdir: Path) -> dict[str, Any]:
    """Start the fleet and the gateway, run phases A and B, stop everything; returns the summary."""
    py = sys.executable
    prof_path = workdir / "engine-profile.yaml"
    prof_path.write_text(yaml.safe_dump(engine_profile(p)))
    cost_path = workdir / "cost-profile.json"
    cost_path.write_text(json.dumps(cost_profile(p).to_dict()))
    procs: list[Proc] = []
    if p.config is not None:
        return await _run_config(p, workdir)
    try:
        for i in range(p.engines):
            args = [py, "-m", "fleetgate.cli", "engine", "sim", "--port", "0", "--model", MODEL]
            args += ["--time-scale", str(p.time_scale), "--profile", str(prof_path)]
            procs.append(Proc(args, f"engine-{i}"))
        urls = [proc.wait_ready() for proc in procs]
        fleet = p.capacity_mu_per_min * p.engines
        admission: dict[str, Any] = {"queue_max": 1000, "deadline_s": 10, "admin_api_keys": [ADMIN_KEY]}
        if p.best_effort_max_utilization is not None:
            admission["best_effort_max_utilization"] = p.best_effort_max_utilization
        if p.latency_headroom is not None:
            admission["latency_headroom"] = {"enabled": p.latency_headroom}
        cfg = {
            "gateway": {"host": "127.0.0.1", "port": 0, "first_byte_timeout_s": 120, "health_checks": False},
            "ops": {"log_level": "WARNING"},
            "deployments": [
                {
                    "model": MODEL,
                    "capacity_mu_per_min": p.capacity_mu_per_min,
                    "cost_profile": str(cost_path),
                    "routing": {"policy": "least_requests"},
                    **({} if p.engine_priority is None else {"engine_priority": p.engine_priority}),
                    "replicas": [{"name": f"r{i}", "url": u} for i, u in enumerate(urls)],
                }
            ],
            "tenants": [
                {
                    "name": "gold",
                    "api_keys": [GOLD_KEY],
                    "priority": "interactive",
                    "reserved_mu_per_min": {MODEL: fleet * p.reserved_share},
                    "best_effort_mu_per_min": 0,
                },
                {
                    "name": "free",
                    "api_keys": [FREE_KEY],
                    "priority": "best_effort",
                    "best_effort_mu_per_min": None,
                },
            ],
            "admission": admission,
        }
        cfg_path = workdir / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        gw = Proc([py, "-m", "fleetgate.cli", "serve", "--config", str(cfg_path)], "gateway")
        procs.append(gw)
        url = gw.wait_ready()
        return await _drive(
            p, url, urls, {"gateway": gw.proc.pid, "engines": [e.proc.pid for e in procs[:-1]]}
        )
    finally:
        for proc in procs:
            proc.kill()


def _config_file(p: BenchParams, workdir: Path) -> Path:
    """``p.config`` with the bench's overrides, written to ``workdir``."""
    cfg = yaml.safe_load(Path(p.config or "").read_text())
    cfg.setdefault("gateway", {}).update(host="127.0.0.1", port=0)
    cfg.setdefault("ops", {})["log_level"] = "WARNING"
    if p.engine_priority is not None:
        for d in cfg["deployments"]:
            d["engine_priority"] = p.engine_priority
    if p.latency_headroom is not None:
        cfg.setdefault("admission", {})["latency_headroom"] = {"enabled": p.latency_headroom}
    cfg_path = workdir / "gateway.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    return cfg_path


async def _run_config(p: BenchParams, workdir: Path) -> dict[str, Any]:
    """The gateway of ``p.config`` as written (its own engines: a local provider), on a free port, with
    only ``engine_priority`` / ``latency_headroom`` overridden when the params say so."""
    cfg_path = _config_file(p, workdir)
    gw = Proc([sys.executable, "-m", "fleetgate.cli", "serve", "--config", str(cfg_path)], "gateway")
    try:
        url = gw.wait_ready(120)
        engines = _children(gw.proc.pid)
        return await _drive(p, url, (), {"gateway": gw.proc.pid, "engines": engines})
    finally:
        gw.kill()


def _children(pid: int) -> list[int]:
    """The direct children of a process (Linux; empty elsewhere): the engines a local provider started."""
    out: list[int] = []
    with contextlib.suppress(OSError, ValueError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (0 when it is gone)."""
    return process_cpu_seconds(pid, missing=0.0)


async def _drive(
    p: BenchParams, url: str, engine_urls: Sequence[str] = (), pids: dict[str, Any] | None = None
) -> dict[str, Any]:
    run = Run(p)
    prof = cost_profile(p)
    fleet_mu_per_s = p.capacity_mu_per_min * p.engines / 60.0
    gold_cost = prof.cost(prompt_tokens(gold_messages(0, p.gold_prompt_tokens)), p.gold_max_tokens)
    free_cost = prof.cost(prompt_tokens(free_messages(0)), p.free_max_tokens)
    gold_rate = p.gold_rate_per_s or fleet_mu_per_s * p.reserved_share * p.gold_share / gold_cost
    free_rate = fleet_mu_per_s * p.free_factor / free_cost
    run.extra.update(gold_rate_per_s=gold_rate, free_rate_per_s=free_rate)
    rng = random.Random(p.seed)
    counter = [0]
    tasks: set[asyncio.Task[None]] = set()
    timeout = aiohttp.ClientTimeout(total=p.drain_timeout_s + 120)
    cpu0 = os.times()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        # warm-up (not counted): connections, the gateway's per-tenant output history
        warm = Run(p)
        await open_loop(
            lambda i: gold_request(session, url, i, p, "warm", warm), gold_rate, p.warmup_s, tasks,
            poisson=False, rng=rng, counter=counter,
        )  # fmt: skip
        await asyncio.gather(*list(tasks))

        def gold(phase: str) -> Any:
            def launch(i: int) -> Any:
                run.sent[f"gold-{phase}"] = run.sent.get(f"gold-{phase}", 0) + 1
                return gold_request(session, url, i, p, phase, run)

            return launch

        def free(i: int) -> Any:
            run.sent["free-B"] = run.sent.get("free-B", 0) + 1
            return free_request(session, url, i, p, "B", run)

        flood: FloodProcess | None = None
        if p.flood_process:  # free's client in its own process, ready before phase A starts
            flood = FloodProcess(url, p, free_rate)
            await flood.wait_ready()

        phase = ["A"]
        pids = pids or {"gateway": 0, "engines": []}

        def cpu() -> tuple[float, float]:
            return cpu_s(pids["gateway"]), sum(cpu_s(e) for e in pids["engines"])

        cpu_a, t_a = cpu(), time.perf_counter()
        watcher = asyncio.ensure_future(watch_engines(session, engine_urls, phase, run))
        sampler = asyncio.ensure_future(sample_system(session, url, pids, phase, run))
        await open_loop(gold("A"), gold_rate, p.phase_s, tasks, poisson=False, rng=rng, counter=counter)
        await asyncio.gather(*list(tasks))  # phase A's stragglers finish before B starts
        cpu_b, t_b = cpu(), time.perf_counter()
        phase[0] = "B"
        if flood is not None:
            flood.go()
            await open_loop(gold("B"), gold_rate, p.phase_s, tasks, poisson=False, rng=rng, counter=counter)
        else:
            await asyncio.gather(
                open_loop(gold("B"), gold_rate, p.phase_s, tasks, poisson=False, rng=rng, counter=counter),
                open_loop(free, free_rate, p.phase_s, tasks, poisson=True, rng=rng, counter=counter),
            )
        cpu_e, t_e = cpu(), time.perf_counter()
        run.extra["process_cpu_share"] = {
            "A": {
                "gateway": round((cpu_b[0] - cpu_a[0]) / (t_b - t_a), 3),
                "engines": round((cpu_b[1] - cpu_a[1]) / (t_b - t_a), 3),
            },
            "B": {
                "gateway": round((cpu_e[0] - cpu_b[0]) / (t_e - t_b), 3),
                "engines": round((cpu_e[1] - cpu_b[1]) / (t_e - t_b), 3),
            },
        }
        run.extra["latency_end_of_B"] = await _latency_ledger(session, url, p.admin_key)
        phase[0] = "drain"
        pending = list(tasks)
        if pending:
            await asyncio.wait(pending, timeout=p.drain_timeout_s)
        for task in list(tasks):  # never expected: count it as a lost request rather than hang
            task.cancel()
        watcher.cancel()
        sampler.cancel()
        if flood is not None:
            result = await flood.result(p.drain_timeout_s + 30)
            run.sent["free-B"] = result["sent"]
            run.outcomes += [
                Outcome("free", "B", st, error=err, tier=tier) for st, err, tier in result["outcomes"]
            ]
            run.extra["flood_process_cpu_s"] = result["cpu_s"]
            if p.gold_idle_phase_s > 0:  # phase C: free alone, once gold has been idle for longer than
                await asyncio.sleep(6.0)  # admission.latency_headroom.active_s (5 s by default)
                flood.go("C")
                result = await flood.result(p.gold_idle_phase_s + p.drain_timeout_s + 30)
                run.sent["free-C"] = result["sent"]
                run.outcomes += [
                    Outcome("free", "C", st, error=err, tier=tier) for st, err, tier in result["outcomes"]
                ]
            flood.close()
    cpu1 = os.times()
    run.extra["loadgen_cpu_s"] = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return summarize(run)


async def _latency_ledger(session: aiohttp.ClientSession, url: str, key: str) -> Any:
    """``/admin/capacity``'s latency figures of each deployment (what the gateway measured)."""
    try:
        async with session.get(url + "/admin/capacity", headers={"Authorization": f"Bearer {key}"}) as r:
            body = await r.json()
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        return {"error": type(exc).__name__}
    return {d["deployment"]: d.get("latency") for d in body.get("deployments") or []}


class FloodProcess:
    """free's load generator in a child process (``--flood-child``): a separate client, like a real
    neighbour's, so that the flood's client-side work never delays gold's TTFT measurement. Protocol on
    the child's stdin/stdout: it prints ``ready`` once connected, starts on ``go``, and prints one JSON
    line with every outcome when all its requests have answered."""

    def __init__(self, url: str, p: BenchParams, rate_per_s: float) -> None:
        spec = json.dumps({"url": url, "params": asdict(p), "rate": rate_per_s})
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--flood-child", spec],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    async def _line(self, timeout_s: float) -> str:
        assert self.proc.stdout is not None
        loop = asyncio.get_running_loop()
        line = await asyncio.wait_for(loop.run_in_executor(None, self.proc.stdout.readline), timeout_s)
        if not line:
            raise RuntimeError(f"the flood process exited early (status {self.proc.poll()})")
        return line

    async def wait_ready(self) -> None:
        if (await self._line(60)).strip() != "ready":
            raise RuntimeError("the flood process did not start")

    def go(self, phase: str = "B") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"go {phase}\n")
        self.proc.stdin.flush()

    async def result(self, timeout_s: float) -> dict[str, Any]:
        try:
            res: dict[str, Any] = json.loads(await self._line(timeout_s))
            return res
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(5)


async def flood_child(spec: dict[str, Any]) -> None:
    """The child side of ``FloodProcess``: on each ``go PHASE`` line, free's load for one phase (a Poisson
    open loop, or ``flood_concurrency`` closed-loop clients), all responses awaited, then one JSON line."""
    p = BenchParams(**spec["params"])
    url = spec["url"]
    rng = random.Random(p.seed)
    counter = [0]
    timeout = aiohttp.ClientTimeout(total=p.drain_timeout_s + 120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        async with session.get(url + "/healthz") as resp:  # one warm connection
            await resp.read()
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        while line := (await loop.run_in_executor(None, sys.stdin.readline)).split():
            phase = line[1] if len(line) > 1 else "B"  # an empty line: the parent went away
            run = Run(p)
            tasks: set[asyncio.Task[None]] = set()
            cpu0 = os.times()

            def free(i: int, run: Run = run, phase: str = phase) -> Any:
                run.sent["free"] = run.sent.get("free", 0) + 1
                return free_request(session, url, i, p, phase, run)

            duration = p.gold_idle_phase_s if phase == "C" else p.phase_s
            if p.flood_concurrency > 0:
                await closed_loop(free, p.flood_concurrency, duration, counter)
            else:
                await open_loop(free, spec["rate"], duration, tasks, poisson=True, rng=rng, counter=counter)
            if tasks:
                await asyncio.wait(list(tasks), timeout=p.drain_timeout_s)
            for task in list(tasks):
                task.cancel()
            cpu1 = os.times()
            out = {
                "sent": run.sent.get("free", 0),
                "outcomes": [(o.status, o.error, o.tier) for o in run.outcomes],
                "cpu_s": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
            }
            print(json.dumps(out), flush=True)


def report(res: dict[str, Any]) -> str:
    a, b = res["phases"]["A"], res["phases"]["B"]
    nan = float("nan")

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1000:.0f} ms"

    lines = [
        f"fleet {res['fleet_capacity_mu_per_min']:.0f} MU/min;"
        f" gold reserves {res['gold_reserved_mu_per_min']:.0f}"
        f" and sends {res['gold_rate_per_s']:.1f} req/s ({res['gold_cost_mu']:.3f} MU each);"
        f" free offers {res['free_rate_per_s']:.0f} req/s ({res['free_cost_mu']:.3f} MU each)",
        f"gold TTFT  A (alone): p50 {ms(a['gold_ttft_p50_s'])}  p95 {ms(a['gold_ttft_p95_s'])}"
        f"  n={a['gold_ttft_n']}",
        f"gold TTFT  B (+free): p50 {ms(b['gold_ttft_p50_s'])}  p95 {ms(b['gold_ttft_p95_s'])}"
        f"  n={b['gold_ttft_n']}",
        f"ratio B/A: p50 {res['ttft_p50_ratio']:.3f}  p95 {res['ttft_p95_ratio']:.3f}   (target p95 <= 1.10)",
        f"gold OTPS p10: A {a['gold_otps_p10'] or nan:.0f}  B {b['gold_otps_p10'] or nan:.0f}"
        f" tokens/s, ratio B/A {res['otps_p10_ratio'] or nan:.3f}",
        f"diagnostic: p95 ratio without requests that lived through a host-wide CPU stall"
        f" {res['ttft_p95_ratio_outside_host_stalls'] or float('nan'):.3f}"
        f" (stall samples A {a['host_stall_samples']}, B {b['host_stall_samples']};"
        f" n A {a['gold_ttft_n_outside_host_stalls']}, B {b['gold_ttft_n_outside_host_stalls']})",
        f"gold admitted: A {a['gold_admitted']}/{a['gold_outcomes']}"
        f"  B {b['gold_admitted']}/{b['gold_outcomes']}"
        f" = {100 * (b['gold_admitted_share'] or 0):.2f}%   (target >= 99%)",
        f"free outcomes: {b['free_statuses']} of {b['free_sent']} sent;"
        f" admitted ~{b['free_admitted_mu_per_min']:.0f} MU/min; served {b['free_served_per_s']:.2f}/s",
        *(
            [
                f"free alone (gold idle, C): {c['free_statuses']} of {c['free_sent']} sent;"
                f" served {c['free_served_per_s']:.2f}/s"
            ]
            if (c := res["phases"].get("C"))
            else []
        ),
        f"every request has an outcome: {res['nothing_lost']}"
        f" ({res['requests_with_outcome']}/{res['requests_sent']}, client errors {res['client_errors']});"
        f" load generator CPU {res['loadgen_cpu_s']:.1f} s",
        f"engine queues (max running / max waiting / samples with waiting > 0): {res.get('engine_peaks')}",
        f"CPU used (cores) by phase: {res.get('process_cpu_share')}",
    ]
    for phase, sysinfo in (res.get("system") or {}).items():
        lines.append(f"system {phase}: {sysinfo}")
    for phase in ("A", "B"):
        for slow in res["phases"][phase].get("gold_slowest", []):
            lines.append(f"slowest gold {phase}: {slow}")
    return "\n".join(lines)


def _run_loop(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--phase-s", type=float, default=30.0)
    ap.add_argument("--free-factor", type=float, default=10.0)
    ap.add_argument("--gold-share", type=float, default=0.9)
    ap.add_argument("--best-effort-max-utilization", type=float, default=None)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--max-num-seqs", type=int, default=BenchParams.max_num_seqs)
    ap.add_argument("--step-overhead-s", type=float, default=BenchParams.step_overhead_s)
    ap.add_argument("--decode-s-per-seq", type=float, default=BenchParams.decode_s_per_seq)
    ap.add_argument("--gold-prompt-tokens", type=int, default=BenchParams.gold_prompt_tokens)
    ap.add_argument("--free-max-tokens", type=int, default=BenchParams.free_max_tokens)
    ap.add_argument("--seed", type=int, default=BenchParams.seed)
    ap.add_argument("--out", type=Path, default=None, help="write the JSON summary here")
    ap.add_argument(
        "--same-process-flood",
        action="store_true",
        help="send free's flood from the same client event loop that times gold (the old design)",
    )
    ap.add_argument(
        "--no-engine-priority", action="store_true", help="do not forward gold's class to the engines"
    )
    ap.add_argument("--config", default=None, help="a fleetgate config whose gateway starts its engines")
    ap.add_argument("--gold-key", default=GOLD_KEY)
    ap.add_argument("--free-key", default=FREE_KEY)
    ap.add_argument("--admin-key", default=ADMIN_KEY)
    ap.add_argument("--gold-rate", type=float, default=None, help="gold's requests per second")
    ap.add_argument("--gold-max-tokens", type=int, default=BenchParams.gold_max_tokens)
    ap.add_argument("--flood-concurrency", type=int, default=0, help="free as N closed-loop clients")
    ap.add_argument("--free-stream", action="store_true", help="free's requests streamed")
    ap.add_argument("--gold-idle-phase-s", type=float, default=0.0, help="phase C: free alone")
    ap.add_argument(
        "--latency-headroom", choices=("on", "off"), default=None,
        help="admission.latency_headroom.enabled (default: the config's)",
    )  # fmt: skip
    ap.add_argument("--engine-priority-default", action="store_true",
                    help="leave engine_priority to the config's default")  # fmt: skip
    ap.add_argument("--flood-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.flood_child is not None:  # internal: FloodProcess's child
        _run_loop(flood_child(json.loads(args.flood_child)))
        return 0
    p = BenchParams(
        engines=args.engines,
        phase_s=args.phase_s,
        free_factor=args.free_factor,
        gold_share=args.gold_share,
        best_effort_max_utilization=args.best_effort_max_utilization,
        time_scale=args.time_scale,
        max_num_seqs=args.max_num_seqs,
        step_overhead_s=args.step_overhead_s,
        decode_s_per_seq=args.decode_s_per_seq,
        gold_prompt_tokens=args.gold_prompt_tokens,
        free_max_tokens=args.free_max_tokens,
        seed=args.seed,
        flood_process=not args.same_process_flood,
        engine_priority=(
            False if args.no_engine_priority else None if args.engine_priority_default else True
        ),
        config=args.config,
        gold_key=args.gold_key,
        free_key=args.free_key,
        admin_key=args.admin_key,
        gold_rate_per_s=args.gold_rate,
        gold_max_tokens=args.gold_max_tokens,
        flood_concurrency=args.flood_concurrency,
        free_stream=args.free_stream,
        gold_idle_phase_s=args.gold_idle_phase_s,
        latency_headroom=None if args.latency_headroom is None else args.latency_headroom == "on",
    )
    with tempfile.TemporaryDirectory(prefix="fleetgate-nn-") as tmp:
        res = _run_loop(run_benchmark(p, Path(tmp)))
    res["date"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    res["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.1f}"
    print(report(res))
    if args.out is not None:
        args.out.write_text(json.dumps(res, indent=2))
    ok = (
        res["nothing_lost"]
        and (res["gold_admitted_share_B"] or 0) >= 0.99
        and (res["ttft_p95_ratio"] or 99) <= 1.10
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
