"""Chaos harness: a fleet of simulated engines behind two gateways sharing Redis, a load generator that keeps
a ledger of every request, a fault schedule, and the invariant checks run at the end.

Shared by tests/chaos (CI and long variants) and bench/soak.py. Real processes only, all on 127.0.0.1 free
ports. The harness also plays the role of a process supervisor (systemd/Kubernetes): a crashed engine is
started again on the same port, and a stopped Redis is started again; the gateways are told nothing, so
recovery (health states back to healthy, routing resumed) is the gateways' own work.

How mixing is detected: every request carries a nonce in its prompt and in ``x-request-id``. The simulated
engine's output text is a deterministic function of the rendered prompt (``simengine.textgen``), so the
harness recomputes the exact text each request must get; a response for another request has a different
start word (49 in 50) and, since every request asks for a different ``max_tokens``, usually another length.

The real llama.cpp replica (``llama-server`` on the project's tiny random-weight model, when built) cannot
give a text the harness computes from the prompt, so every request also carries a per-request *stamp*: a
``logit_bias`` of +100 on one vocabulary token picked from the nonce (the simulated engine ignores the
field). llama-server still runs the full model for every token, but the sampler then always picks the
stamp token, so a llama-served answer is exactly ``max_tokens`` copies of that token's text: the harness
knows it too (different requests get different, non-periodic pieces, so an answer cannot pass for another
request's). The gateways' access logs say which replica served each request.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from failover_text import splice
from fleetgate.core.tokenize import count_tokens, render_chat_prompt
from fleetgate.engines.llama import EngineProcess, LlamaServerConfig, llama_server, missing_llama_parts
from fleetgate.providers.local import free_port
from fleetgate.simengine.textgen import start_index, tokens_text
from integration_tools import integration_tools

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
MODEL = "chaos-model"
KEYS = {"alpha": "sk-chaos-alpha-7f3e", "capped": "sk-chaos-capped-91ab", "admin": "sk-chaos-admin-c0de"}
ADMIN_HEADERS = {"Authorization": f"Bearer {KEYS['admin']}"}  # GET /metrics needs the admin key
LLAMA = "llama"  # the real llama.cpp replica's name in the gateways' config, metrics and access logs
STAMP_BIAS = 100.0


ServerProcess = integration_tools().ServerProcess


def wait_port(port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


# -- processes ----------------------------------------------------------------------------------------------


class Redis:
    """A private redis-server (the harness stops and restarts it to simulate an outage)."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not installed")
        self.binary = binary
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="chaos-redis-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        if not wait_port(self.port):
            raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Engine:
    """One simulated engine on a fixed port, restartable there (the supervisor's job after a crash)."""

    def __init__(self, index: int, time_scale: float) -> None:
        self.index = index
        self.port = free_port()
        self.time_scale = time_scale
        self.proc: Any = None
        self.restarts = 0
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [
            PY,
            "-m",
            "fleetgate.cli",
            "engine",
            "sim",
            "--port",
            str(self.port),
            "--model",
            MODEL,
            "--time-scale",
            str(self.time_scale),
            "--seed",
            str(self.index),
        ]
        self.proc = ServerProcess(args, name=f"engine-{self.index}")
        self.proc.wait_ready(30)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()


class LlamaReplica:
    """The real llama.cpp replica: ``llama-server`` (1 thread, 4 slots, end-of-generation disabled so that
    every answer has exactly ``max_tokens`` tokens) on a fixed port, restartable there.

    ``start`` and ``restart`` fork from the calling thread, which must be the long-lived event-loop thread
    (the child gets ``PR_SET_PDEATHSIG``, which fires when the forking thread exits)."""

    def __init__(self, log_path: Path | None = None) -> None:
        missing = missing_llama_parts()
        if missing:
            raise RuntimeError("real llama.cpp engine not built: " + "; ".join(missing))
        self.name = LLAMA
        self.port = free_port()
        cfg = LlamaServerConfig(
            port=self.port, alias=MODEL, parallel=4, ctx_size=4096, threads=1, ignore_eos=True
        )
        self.proc: EngineProcess = llama_server(cfg, log_path=log_path)
        self.restarts = 0
        self.proc.start()
        self.proc.wait_ready(timeout=60)

    @property
    def url(self) -> str:
        return self.proc.url

    def alive(self) -> bool:
        return self.proc.running()

    def kill(self) -> None:
        self.proc.kill()

    async def wait_busy(self, limit_s: float = 5.0) -> int:
        """Wait until llama-server is working on a request (``/slots``), so that a fault lands mid-request;
        returns the busy slots (0 when none got busy within ``limit_s``)."""
        deadline = time.monotonic() + limit_s
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                with contextlib.suppress(aiohttp.ClientError, OSError, ValueError):
                    async with s.get(self.url + "/slots") as r:
                        busy = sum(1 for slot in await r.json() if slot.get("is_processing"))
                    if busy:
                        return busy
                await asyncio.sleep(0.005)
        return 0

    async def restart(self) -> float:
        """Kill (if still there) and start again on the same port; seconds until ``/health`` is 200."""
        seconds = await self.proc.restart_async(limit_s=60.0)
        self.restarts += 1
        return seconds

    def stamp_table(self, want: int = 256) -> list[tuple[int, str]]:
        """``(token id, text)`` of single vocabulary tokens usable as stamps: ASCII letters or digits only
        (streamed one token per chunk, untouched by any output parsing), each *primitive* (not a repetition
        of a shorter string) and all distinct, so that ``a * n == b * m`` implies ``a == b``."""
        out: list[tuple[int, str]] = []
        seen: set[str] = set()
        for tid in range(3, 3072):  # ids 0-2: the tiny model's special tokens; 3,072 tokens in its vocabulary
            req = urllib.request.Request(
                self.url + "/detokenize",
                data=orjson.dumps({"tokens": [tid]}),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=5) as resp:
                piece = str(orjson.loads(resp.read()).get("content", ""))
            if not (piece.isascii() and piece.isalnum() and len(piece) >= 2) or piece in seen:
                continue
            if piece in (piece + piece)[1:-1]:  # periodic, e.g. "abab"
                continue
            seen.add(piece)
            out.append((tid, piece))
            if len(out) >= want:
                break
        if len(out) < 16:
            raise RuntimeError(f"only {len(out)} stamp tokens found in the llama-server vocabulary")
        return out


class Gateway:
    """``fleetgate serve --config`` with its output captured (for the key-leak checks too)."""

    def __init__(self, config: Path, name: str) -> None:
        self.proc = ServerProcess([PY, "-m", "fleetgate.cli", "serve", "--config", str(config)], name=name)
        self.url: str = self.proc.wait_ready(30)

    def kill(self) -> None:
        self.proc.kill()


def gateway_config(
    path: Path,
    engines: Sequence[Engine],
    redis_url: str,
    *,
    capped_rpm: float,
    first_byte_timeout_s: float = 2.0,
    stream_idle_timeout_s: float = 1.5,
    extra_replicas: Sequence[tuple[str, str]] = (),
) -> Path:
    """The gateways' config; ``extra_replicas`` are ``(name, url)`` of replicas beside the simulated engines
    (the real llama.cpp one)."""
    cfg: dict[str, Any] = {
        "gateway": {
            "host": "127.0.0.1",
            "port": 0,
            "scrape_interval_s": 0.5,
            "first_byte_timeout_s": first_byte_timeout_s,
            "stream_idle_timeout_s": stream_idle_timeout_s,
            "max_attempts": 3,
            "shutdown_grace_s": 5.0,
            "health_checks": True,
        },
        "deployments": [
            {
                "model": MODEL,
                "capacity_mu_per_min": 6000.0,
                "routing": {"policy": "least_requests"},
                "replicas": [{"name": f"e{e.index}", "url": e.url} for e in engines]
                + [{"name": name, "url": url} for name, url in extra_replicas],
            }
        ],
        "tenants": [
            {
                "name": "alpha",
                "api_keys": [KEYS["alpha"]],
                "priority": "interactive",
                "reserved_mu_per_min": {MODEL: 1.0e9},
                "best_effort_mu_per_min": None,
            },
            {
                "name": "capped",
                "api_keys": [KEYS["capped"]],
                "priority": "interactive",
                "reserved_mu_per_min": {MODEL: 1.0e9},
                "requests_per_minute": capped_rpm,
            },
        ],
        "admission": {
            "admin_api_keys": [KEYS["admin"]],
            "deadline_s": 1.0,
            "burst_s": 0.0,
            "store": {"kind": "redis", "url": redis_url, "fail_open": False, "timeout_s": 0.25},
        },
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


# -- ledger -------------------------------------------------------------------------------------------------


@dataclass
class Entry:
    """One request sent and what became of it."""

    nonce: str
    tenant: str
    stream: bool
    max_tokens: int
    sent: float = 0.0
    done: float = 0.0
    gateway: str = ""
    status: int | None = None  # HTTP status; None: no response at all
    outcome: str = "pending"  # ok | error (explicit, HTTP or SSE event) | lost (no explicit answer) | hung
    error: str = ""
    text: str = ""
    completion_tokens: int | None = None
    finish_reason: str | None = None
    response_ids: set[str] = field(default_factory=set)
    echoed_id: str | None = None
    #: gateways a first attempt was sent to and whose connection broke before any response byte; the
    #: client retried (as the OpenAI SDK does), and ``check`` proves from that gateway's access log that the
    #: broken attempt never ran (else it would be a duplicate)
    reset_on: list[str] = field(default_factory=list)
    #: ``(token id, token text)`` sent as ``logit_bias`` +100 when the fleet has the llama.cpp replica
    stamp: tuple[int, str] | None = None
    #: the replica that answered, from the gateways' access logs (filled in by ``check``)
    replica: str | None = None
    #: the engines whose outputs make the text, when it is a splice of several (a continued stream)
    splice: list[str] | None = None

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"chaos request {self.nonce}: tell me about rivers"}]

    def expected_text(self, tokens: int) -> str:
        """What the simulated engine answers to this request."""
        return tokens_text(start_index(render_chat_prompt(self.messages)), 0, tokens)

    def expected_llama_text(self, tokens: int) -> str | None:
        """What the llama.cpp replica answers to this request: its stamp token, ``tokens`` times."""
        return None if self.stamp is None else self.stamp[1] * tokens


class Front:
    """The clients' load balancer: the active gateway, failing over when its listener is gone (nothing was
    sent, so the retry cannot duplicate anything)."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = list(urls)
        self.active = 0

    def url(self) -> str:
        return self.urls[self.active]

    def failover(self, bad: str) -> None:
        if self.urls[self.active] == bad and self.active + 1 < len(self.urls):
            self.active += 1


class LoadGen:
    """Closed-loop workers sending chat requests (stream and not) and recording every outcome."""

    def __init__(
        self,
        front: Front,
        *,
        total: int,
        workers: int,
        deadline_s: float,
        seed: int = 1,
        capped_share: float = 0.2,
        stream_share: float = 0.6,
        think_s: float = 0.0,
        rate: float | None = None,
        stamps: Sequence[tuple[int, str]] = (),
    ) -> None:
        self.front = front
        self.stamps = list(stamps)
        self.total = total
        self.workers = workers
        self.deadline_s = deadline_s
        self.rng = random.Random(seed)
        self.capped_share = capped_share
        self.stream_share = stream_share
        self.think_s = think_s
        self.rate = rate
        self.t0 = 0.0
        self.ledger: list[Entry] = []
        self.failovers = 0
        self.resets = 0
        self._next = 0

    @property
    def sent(self) -> int:
        return self._next

    def _make(self) -> Entry | None:
        if self._next >= self.total:
            return None
        i = self._next
        self._next += 1
        tenant = "capped" if self.rng.random() < self.capped_share else "alpha"
        entry = Entry(
            nonce=f"c{i:06d}-{self.rng.getrandbits(40):010x}",
            tenant=tenant,
            stream=self.rng.random() < self.stream_share,
            max_tokens=4 + i % 29,
        )
        if self.stamps:  # picked from the nonce's random part, so neighbours rarely share a stamp
            entry.stamp = self.stamps[zlib.crc32(entry.nonce.encode()) % len(self.stamps)]
        self.ledger.append(entry)
        return entry

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=2.0)
        conn = aiohttp.TCPConnector(limit=0, force_close=False)
        self.t0 = time.monotonic()
        async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
            await asyncio.gather(*(self._worker(session) for _ in range(self.workers)))

    async def _worker(self, session: aiohttp.ClientSession) -> None:
        while (entry := self._make()) is not None:
            if self.rate:  # paced: request i starts no earlier than t0 + i / rate
                slot = self.t0 + (self._next - 1) / self.rate
                delay = slot - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            await self.one(session, entry)
            if self.think_s:
                await asyncio.sleep(self.think_s * self.rng.random() * 2)

    async def one(self, session: aiohttp.ClientSession, entry: Entry) -> None:
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": entry.messages,
            "max_tokens": entry.max_tokens,
            "stream": entry.stream,
        }
        if entry.stream:
            body["stream_options"] = {"include_usage": True}
        if entry.stamp is not None:
            body["logit_bias"] = {str(entry.stamp[0]): STAMP_BIAS}
        headers = {
            "Authorization": f"Bearer {KEYS[entry.tenant]}",
            "x-request-id": entry.nonce,
            "Content-Type": "application/json",
        }
        entry.sent = time.monotonic()
        for _ in range(3):  # only connection-refused (nothing sent) is retried, on the other gateway
            url = self.front.url()
            entry.gateway = url
            try:
                async with asyncio.timeout(self.deadline_s):
                    await self._exchange(session, url, body, headers, entry)
            except aiohttp.ClientConnectorError:
                self.front.failover(url)
                self.failovers += 1
                await asyncio.sleep(0.05)
                continue
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if entry.status is None and not entry.reset_on:  # nothing came back: retry once
                    entry.reset_on.append(url)
                    entry.error = f"{exc.__class__.__name__}: {exc}"
                    self.front.failover(url)
                    self.resets += 1
                    await asyncio.sleep(0.05)
                    continue
                entry.outcome = "lost"
                entry.error = f"{exc.__class__.__name__}: {exc}"
            except TimeoutError:
                entry.outcome = "hung"
                entry.error = f"no complete answer within {self.deadline_s} s"
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                entry.outcome = "lost"
                entry.error = f"{exc.__class__.__name__}: {exc}"
            break
        else:
            entry.outcome = "lost"
            entry.error = "no gateway accepted the connection"
        entry.done = time.monotonic()

    async def _exchange(
        self,
        session: aiohttp.ClientSession,
        url: str,
        body: dict[str, Any],
        headers: dict[str, str],
        entry: Entry,
    ) -> None:
        async with session.post(url + "/v1/chat/completions", data=orjson.dumps(body), headers=headers) as r:
            entry.status = r.status
            entry.echoed_id = r.headers.get("x-request-id")
            if r.status != 200:
                raw = await r.read()
                entry.outcome = "error"
                try:
                    err = orjson.loads(raw)["error"]
                    entry.error = f"{r.status} {err.get('type')}: {err.get('message')}"
                except Exception:
                    entry.outcome = "lost"  # an error without the OpenAI error body is not explicit
                    entry.error = f"{r.status} unparseable body {raw[:100]!r}"
                return
            if not entry.stream:
                data = orjson.loads(await r.read())
                entry.response_ids.add(str(data.get("id")))
                choice = data["choices"][0]
                entry.text = choice["message"]["content"] or ""
                entry.finish_reason = choice.get("finish_reason")
                entry.completion_tokens = data["usage"]["completion_tokens"]
                entry.outcome = "ok"
                return
            await self._read_stream(r, entry)

    @staticmethod
    async def _read_stream(r: aiohttp.ClientResponse, entry: Entry) -> None:
        buf = b""
        done = False
        parts: list[str] = []
        error_event: str | None = None
        async for chunk in r.content.iter_any():
            buf += chunk
            while b"\n\n" in buf:
                raw, buf = buf.split(b"\n\n", 1)
                data = b"".join(line[5:].lstrip() for line in raw.split(b"\n") if line.startswith(b"data:"))
                if not data:
                    continue
                if data == b"[DONE]":
                    done = True
                    continue
                event = orjson.loads(data)
                if "error" in event:
                    error_event = str(event["error"].get("message"))
                    continue
                if event.get("id") is not None:
                    entry.response_ids.add(str(event["id"]))
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        parts.append(delta["content"])
                    if choice.get("finish_reason"):
                        entry.finish_reason = choice["finish_reason"]
                if event.get("usage"):
                    entry.completion_tokens = event["usage"]["completion_tokens"]
        entry.text = "".join(parts)
        if error_event is not None:
            entry.outcome = "error"
            entry.error = f"SSE error event: {error_event}"
        elif done:
            entry.outcome = "ok"
        else:
            entry.outcome = "lost"
            entry.error = "stream ended without [DONE] or an error event (silent truncation)"


# -- invariants ---------------------------------------------------------------------------------------------


@dataclass
class Report:
    total: int
    ok: int
    errors: int
    lost: int
    hung: int
    duplicated_or_mixed: int
    truncated: int
    error_kinds: dict[str, int]
    rate_limit_max_window: int
    rate_limit_allowed: int
    violations: list[str]
    #: replica -> outcome -> requests (from the access logs; ``-`` when no gateway dispatched it)
    by_replica: dict[str, dict[str, int]] = field(default_factory=dict)
    #: replica -> invariant breaches among the requests it answered
    replica_violations: dict[str, int] = field(default_factory=dict)
    #: streams whose replica broke after the first byte (the gateways' logs say so), and how many of them
    #: still completed for the client (continued on another replica: one stream, exact text and usage)
    interrupted: int = 0
    continued_ok: int = 0
    #: seconds from detecting each break to the continued stream's first event (gateways' logs)
    resume_s: list[float] = field(default_factory=list)

    @property
    def transparent_share(self) -> float:
        return self.continued_ok / self.interrupted if self.interrupted else 1.0

    def resume_quantile(self, q: float) -> float | None:
        if not self.resume_s:
            return None
        ordered = sorted(self.resume_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def summary(self) -> str:
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(self.error_kinds.items(), key=lambda kv: -kv[1]))
        replicas = "; ".join(
            f"{name}: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
            for name, outcomes in sorted(self.by_replica.items())
        )
        return (
            f"requests {self.total}: ok {self.ok}, explicit errors {self.errors}, lost {self.lost}, "
            f"hung {self.hung}, duplicated/mixed {self.duplicated_or_mixed}, silently truncated "
            f"{self.truncated}; capped tenant max admitted in a 60 s window {self.rate_limit_max_window} "
            f"(allowed {self.rate_limit_allowed}); errors by kind: {kinds or '-'}"
            + (f"; by replica: {replicas}" if replicas else "")
            + f"; interrupted streams {self.interrupted}, completed transparently {self.continued_ok} "
            f"({100 * self.transparent_share:.1f}%), resume p50 {_ms(self.resume_quantile(0.5))} "
            f"p99 {_ms(self.resume_quantile(0.99))}"
        )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f} ms"


#: The gateway's warning when a stream's replica breaks after the first byte, and when it was continued.
_BROKE = re.compile(
    r"request (\S+): replica \S+ (?:stream stalled|stream broke|ended the stream early|sent an error event)"
)
_CONTINUED = re.compile(
    r"request (\S+): stream continued on replica \S+ after \d+ tokens, resumed in ([0-9.]+) s"
)


def interruptions(outputs: dict[str, str]) -> tuple[set[str], list[float]]:
    """Request ids whose stream broke after the first byte, and every continuation's time to resume."""
    broke: set[str] = set()
    resume: list[float] = []
    for text in outputs.values():
        for match in _BROKE.finditer(text):
            broke.add(match.group(1).strip('",'))
        resume += [float(m.group(2)) for m in _CONTINUED.finditer(text)]
    return broke, resume


def _error_kind(entry: Entry) -> str:
    """A short bucket for an explicit error: status/type and the first words of the message."""
    words = re.sub(r"[0-9.]+|'[^']*'", "#", entry.error).split()
    return " ".join(words[:6])


def served_by(access_logs: dict[str, str]) -> dict[str, list[tuple[str, int]]]:
    """Request id -> ``(replica, status)`` of every access-log line the gateways wrote for it (replica ``-``
    when the request was answered without reaching one, e.g. a 429)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for text in access_logs.values():
        for line in text.splitlines():
            if '"request_id"' not in line or '"replica"' not in line:
                continue
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(rec, dict) or "status" not in rec:
                continue
            out.setdefault(str(rec["request_id"]), []).append(
                (str(rec.get("replica") or "-"), int(rec["status"]))
            )
    return out


def _entry_violations(e: Entry, access_logs: dict[str, str]) -> tuple[list[str], int, int]:
    """The breaches of one request: (messages, how many are duplicates/mixing, how many truncations)."""
    found: list[str] = []
    mixed = truncated = 0
    if e.outcome in ("lost", "hung", "pending"):
        return [f"{e.nonce}: {e.outcome}: {e.error}"], 0, int("truncation" in e.error)
    for url in e.reset_on:
        log = access_logs.get(url, "")
        if f'"request_id":"{e.nonce}"' in log:
            mixed += 1
            lines = [line for line in log.splitlines() if f'"request_id":"{e.nonce}"' in line]
            found.append(f"{e.nonce}: the attempt broken on {url} ran there too (duplicate): {lines}")
    if e.echoed_id is not None and e.echoed_id != e.nonce:
        mixed += 1
        found.append(f"{e.nonce}: answered with x-request-id {e.echoed_id}")
    if len(e.response_ids) > 1:
        mixed += 1
        found.append(f"{e.nonce}: chunks of several responses {sorted(e.response_ids)}")
    # the exact answer this request must get: a llama.cpp answer is its stamp repeated, a simulated
    # engine's the text computed from its prompt; when no access log names the replica, either will do
    sim = e.expected_text(e.max_tokens)
    llama = e.expected_llama_text(e.max_tokens)
    if e.replica == LLAMA and llama is not None:
        candidates = [llama]
    elif e.replica is None and llama is not None:
        candidates = [sim, llama]
    else:
        candidates = [sim]
    stamp = e.stamp[1] if e.stamp is not None else None
    render = render_chat_prompt(e.messages)
    if e.outcome == "ok" and e.stream and e.text not in candidates:
        # a stream continued on another replica after a break: the engines' outputs spliced, each given
        # everything before it (a llama.cpp stamp run, then the simulated engine's text, or the reverse)
        path = splice(render, stamp, e.text, e.max_tokens)
        if path is not None and len(path) > 1:  # one engine alone must be the replica that answered
            e.splice = path
            candidates = [e.text]
    if e.outcome == "ok":
        if e.text not in candidates:
            mixed += 1
            found.append(
                f"{e.nonce}: text from {e.replica} is not this request's "
                f"({e.text[:40]!r} != {candidates[0][:40]!r})"
            )
        # tokens received: the simulated engine's text counts with the shared tokenizer; a stamped llama.cpp
        # answer that equals its expected text has exactly max_tokens tokens
        received = count_tokens(e.text)
        if (llama is not None and e.text == llama) or (e.splice is not None and "llama" in e.splice):
            received = e.max_tokens  # a splice explains exactly max_tokens tokens
        if e.completion_tokens != e.max_tokens or received != e.completion_tokens:
            truncated += 1
            found.append(
                f"{e.nonce}: usage {e.completion_tokens} tokens, received {received}, asked {e.max_tokens}"
            )
        if e.finish_reason is None:
            truncated += 1
            found.append(f"{e.nonce}: no finish_reason")
    elif (
        e.text
        and not any(c.startswith(e.text) for c in candidates)
        and splice(render, stamp, e.text, e.max_tokens, partial=True) is None
    ):
        # an explicit mid-stream error: what arrived must still be this request's own prefix
        mixed += 1
        found.append(f"{e.nonce}: partial text from {e.replica} is not a prefix of this request's answer")
    return found, mixed, truncated


def check(
    ledger: Sequence[Entry], *, capped_rpm: float, capped_concurrency: int, access_logs: dict[str, str]
) -> Report:
    """Every invariant of the chaos run over the ledger; ``violations`` lists each breach.

    ``access_logs``: gateway URL -> its output, to prove that a retried attempt never ran there, and to
    know which replica answered each request (a llama.cpp answer is checked against the request's stamp,
    a simulated engine's against the text computed from its prompt)."""
    violations: list[str] = []
    counts = {"ok": 0, "error": 0, "lost": 0, "hung": 0, "pending": 0}
    mixed = truncated = 0
    kinds: dict[str, int] = {}
    lines = served_by(access_logs)
    by_replica: dict[str, dict[str, int]] = {}
    replica_violations: dict[str, int] = {}
    for e in ledger:
        counts[e.outcome] = counts.get(e.outcome, 0) + 1
        logged = lines.get(e.nonce, [])
        if e.replica is None and logged:
            same_status = [r for r, status in logged if status == e.status]
            e.replica = (same_status or [r for r, _ in logged])[-1]
        where = e.replica or "-"
        outcomes = by_replica.setdefault(where, {})
        outcomes[e.outcome] = outcomes.get(e.outcome, 0) + 1
        if e.outcome == "error":
            kinds[_error_kind(e)] = kinds.get(_error_kind(e), 0) + 1
        found, n_mixed, n_truncated = _entry_violations(e, access_logs)
        mixed += n_mixed
        truncated += n_truncated
        if found:
            violations.extend(found)
            replica_violations[where] = replica_violations.get(where, 0) + len(found)
    # rate limit of the capped tenant: any 60 s window admits at most the limit plus one (burst_s 0); the
    # client sees send times, which trail admission by at most its own concurrency
    admitted = sorted(e.sent for e in ledger if e.tenant == "capped" and e.status == 200)
    worst = 0
    j = 0
    for i, t in enumerate(admitted):
        while admitted[j] < t - 60.0:
            j += 1
        worst = max(worst, i - j + 1)
    allowed = int(capped_rpm) + 1 + capped_concurrency
    if worst > allowed:
        violations.append(f"capped tenant: {worst} admitted within 60 s, limit {capped_rpm:g}")
    broke, resume = interruptions(access_logs)
    interrupted = [e for e in ledger if e.stream and e.nonce in broke]
    return Report(
        total=len(ledger),
        ok=counts["ok"],
        errors=counts["error"],
        lost=counts["lost"] + counts["pending"],
        hung=counts["hung"],
        duplicated_or_mixed=mixed,
        truncated=truncated,
        error_kinds=kinds,
        rate_limit_max_window=worst,
        rate_limit_allowed=allowed,
        violations=violations,
        by_replica=by_replica,
        replica_violations=replica_violations,
        interrupted=len(interrupted),
        continued_ok=sum(1 for e in interrupted if e.outcome == "ok"),
        resume_s=resume,
    )


# -- fault schedule -----------------------------------------------------------------------------------------


async def set_fault(engine: Engine, kind: str, value: float | None = None) -> None:
    body: dict[str, Any] = {"kind": kind}
    if value is not None:
        body["value"] = value
    async with aiohttp.ClientSession() as s, s.post(engine.url + "/admin/fault", json=body) as r:
        r.raise_for_status()


async def restart_later(engine: Engine, delay_s: float) -> None:
    """The supervisor: once the crashed engine exited, start it again on its port after ``delay_s``."""
    for _ in range(200):
        if not engine.alive():
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(delay_s)
    engine.kill()
    await asyncio.to_thread(engine.start)
    engine.restarts += 1


@dataclass
class Event:
    at: float  # share of the requests sent, in [0, 1)
    name: str
    done: bool = False


async def health_verdict(gateways: Sequence[Gateway], replica: str) -> str | None:
    """``replica``'s health state as the first gateway that answers sees it (``None``: none answered)."""
    for g in gateways:
        if g.proc.proc.poll() is not None:
            continue
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with asyncio.timeout(2.0):
                return (await fleet_health(g.url)).get(replica)
    return None


class Chaos:
    """Runs the scripted schedule against the fleet, keyed to the load's progress (machine-speed neutral)."""

    def __init__(
        self,
        engines: list[Engine],
        redis: Redis,
        gateways: list[Gateway],
        load: LoadGen,
        llama: LlamaReplica | None = None,
        verdict_limit_s: float = 60.0,
    ) -> None:
        self.engines = engines
        self.redis = redis
        self.gateways = gateways
        self.load = load
        self.llama = llama
        self.verdict_limit_s = verdict_limit_s
        #: seconds from the llama.cpp replica's SIGSTOP to the gateways' ``unhealthy`` verdict
        self.llama_verdict_s: float | None = None
        self._llama_hang: asyncio.Task[None] | None = None
        self.log: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []
        e = engines
        self.schedule: list[tuple[float, str, Any]] = [
            (0.04, "e0 error_rate 0.5 (HTTP 500s)", lambda: set_fault(e[0], "error_rate", 0.5)),
            (0.10, "e1 slow x10", lambda: set_fault(e[1], "slow", 10)),
            (0.14, "e0 fault cleared", lambda: set_fault(e[0], "none")),
            (0.18, "e2 stall after 2 chunks", lambda: set_fault(e[2], "stall", 2)),
            (0.24, "e1 fault cleared", lambda: set_fault(e[1], "none")),
            (0.28, "e2 fault cleared", lambda: set_fault(e[2], "none")),
            (0.30, "e3 hang", lambda: set_fault(e[3], "hang")),
            (0.40, "e3 fault cleared", lambda: set_fault(e[3], "none")),
            (0.42, "e0 crash (restarted by the supervisor after 1 s)", lambda: self._crash(e[0])),
            (0.50, "redis outage (kill -9)", self._redis_down),
            (0.56, "redis restarted (empty)", self._redis_up),
            (0.64, "gateway A SIGTERM (clients fail over to gateway B)", self._sigterm_a),
            (0.74, f"e{len(e) - 1} crash (restarted after 1 s)", lambda: self._crash(e[-1])),
            (0.82, "e2 stall after 1 chunk", lambda: set_fault(e[2], "stall", 1)),
            (0.86, "e2 fault cleared", lambda: set_fault(e[2], "none")),
        ]
        if llama is not None:  # the real llama.cpp replica: a hang, then a crash, both of the real process
            self.schedule += [
                (
                    0.45,
                    f"{LLAMA} SIGSTOP (hang; restarted once the gateways' health monitor calls it unhealthy)",
                    self._hang_llama,
                ),
                (0.78, f"{LLAMA} SIGKILL (crash; restarted by the supervisor after 1 s)", self._crash_llama),
            ]
            self.schedule.sort(key=lambda item: item[0])

    async def _crash(self, engine: Engine) -> None:
        await set_fault(engine, "crash", 0)
        self.tasks.append(asyncio.create_task(restart_later(engine, 1.0)))

    async def _hang_llama(self) -> None:
        self._llama_hang = asyncio.create_task(self._hang_llama_until_verdict())
        self.tasks.append(self._llama_hang)

    async def _hang_llama_until_verdict(self) -> None:
        """SIGSTOP the llama.cpp replica mid-request; the supervisor's liveness check reads the gateways'
        health verdict (the role a kubelet plays with ``/livez``): the frozen process looks alive, only the
        gateways' monitor can tell that it hangs. On ``unhealthy`` it is killed and started again."""
        assert self.llama is not None
        busy = await self.llama.wait_busy()
        self.llama.proc.freeze()
        frozen_at = time.monotonic()
        self.log.append(f"   {LLAMA} frozen with {busy} request(s) in progress")
        state: str | None = None
        while time.monotonic() - frozen_at < self.verdict_limit_s:
            state = await health_verdict(self.gateways, LLAMA)
            if state == "unhealthy":
                break
            await asyncio.sleep(0.25)
        waited = time.monotonic() - frozen_at
        if state == "unhealthy":
            self.llama_verdict_s = waited
        else:
            self.log.append(
                f"   failed: no unhealthy verdict for {LLAMA} {waited:.1f} s after SIGSTOP ({state})"
            )
        restart_s = await self.llama.restart()
        verdict = f"unhealthy {waited:.1f} s after SIGSTOP" if state == "unhealthy" else "no verdict"
        self.log.append(f"   {LLAMA} {verdict}; killed and restarted, healthy in {restart_s:.2f} s")

    async def _crash_llama(self) -> None:
        self.tasks.append(asyncio.create_task(self._crash_llama_then_restart(1.0)))

    async def _crash_llama_then_restart(self, delay_s: float) -> None:
        assert self.llama is not None
        if self._llama_hang is not None and not self._llama_hang.done():
            # on a short run the crash comes before the hang was detected: crash it only once it serves again
            await self._llama_hang
            self.log.append(f"   {LLAMA} crash delayed until the hung replica was restarted")
        busy = await self.llama.wait_busy()
        self.llama.kill()  # SIGKILL to its process group
        self.log.append(f"   {LLAMA} killed with {busy} request(s) in progress")
        await asyncio.sleep(delay_s)
        restart_s = await self.llama.restart()
        self.log.append(f"   {LLAMA} restarted {delay_s:.0f} s after its crash, healthy in {restart_s:.2f} s")

    async def _redis_down(self) -> None:
        self.redis.stop()

    async def _redis_up(self) -> None:
        await asyncio.to_thread(self.redis.start)

    async def _sigterm_a(self) -> None:
        self.gateways[0].proc.signal(signal.SIGTERM)

    async def run(self) -> None:
        pending = list(self.schedule)
        start = time.monotonic()
        while pending and self.load.sent < self.load.total:
            share = self.load.sent / self.load.total
            while pending and pending[0][0] <= share:
                _, name, action = pending.pop(0)
                self.log.append(f"{time.monotonic() - start:7.2f}s @{share:.2f}: {name}")
                try:
                    await action()
                except Exception as exc:  # a fault that could not be injected is reported, not hidden
                    self.log.append(f"   failed: {exc!r}")
            await asyncio.sleep(0.02)
        for _, name, _ in pending:
            self.log.append(f"not reached: {name}")
        for t in self.tasks:
            await t

    async def clear_all(self) -> None:
        for engine in self.engines:
            if engine.alive():
                with contextlib.suppress(Exception):
                    await set_fault(engine, "none")


async def fleet_health(url: str) -> dict[str, str]:
    """Replica -> health state from the gateway's ``fleetgate_health_state`` gauge."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics", headers=ADMIN_HEADERS) as r:
        text = await r.text()
    states: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("fleetgate_health_state{") and line.rstrip().endswith(" 1.0"):
            labels = dict(
                kv.split("=", 1) for kv in line[line.index("{") + 1 : line.index("}")].split(",") if "=" in kv
            )
            states[labels["replica"].strip('"')] = labels["state"].strip('"')
    return states


async def wait_full_health(url: str, replicas: int, timeout_s: float) -> tuple[bool, float, dict[str, str]]:
    """Wait (without touching anything) until every replica is healthy and the gateway is ready."""
    start = time.monotonic()
    states: dict[str, str] = {}
    while time.monotonic() - start < timeout_s:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            states = await fleet_health(url)
            async with aiohttp.ClientSession() as s, s.get(url + "/readyz") as r:
                ready = r.status == 200
            if ready and len(states) == replicas and all(v == "healthy" for v in states.values()):
                return True, time.monotonic() - start, states
        await asyncio.sleep(0.5)
    return False, time.monotonic() - start, states


@dataclass
class ChaosResult:
    report: Report
    log: list[str]
    wall_s: float
    recovered: bool
    recovery_s: float
    health: dict[str, str]
    gateway_output: str
    metrics_text: str
    gateway_a_exit: int | None
    failovers: int
    resets: int
    #: whether the fleet had the real llama.cpp replica, how often the harness restarted it, and how long
    #: the gateways' health monitor took to call the frozen one unhealthy
    llama: bool = False
    llama_restarts: int = 0
    llama_verdict_s: float | None = None


async def run_chaos(
    workdir: Path,
    *,
    total: int,
    engines: int = 4,
    workers: int = 48,
    rate: float = 30.0,
    time_scale: float = 0.01,
    capped_rpm: float = 120.0,
    deadline_s: float = 30.0,
    llama: bool = False,
) -> ChaosResult:
    """The whole scenario; always stops every process it started. ``llama``: add the real llama.cpp
    replica (``llama-server``, must be built) to the fleet and its hang and crash to the schedule."""
    redis = Redis()
    fleet: list[Engine] = []
    gateways: list[Gateway] = []
    real: LlamaReplica | None = None
    try:
        fleet = [Engine(i, time_scale) for i in range(engines)]
        extra: list[tuple[str, str]] = []
        stamps: list[tuple[int, str]] = []
        if llama:
            real = LlamaReplica(log_path=workdir / "llama-server.log")
            extra.append((LLAMA, real.url))
            stamps = await asyncio.to_thread(real.stamp_table)
        cfg = gateway_config(
            workdir / "chaos.yaml", fleet, redis.url, capped_rpm=capped_rpm, extra_replicas=extra
        )
        gateways = [Gateway(cfg, "gateway-a"), Gateway(cfg, "gateway-b")]
        load = LoadGen(
            Front([g.url for g in gateways]),
            total=total,
            workers=workers,
            deadline_s=deadline_s,
            rate=rate,
            stamps=stamps,
        )
        chaos = Chaos(fleet, redis, gateways, load, llama=real)
        t0 = time.monotonic()
        await asyncio.gather(load.run(), chaos.run())
        wall = time.monotonic() - t0
        await chaos.clear_all()
        recovered, recovery_s, health = await wait_full_health(gateways[1].url, engines + len(extra), 90.0)
        async with (
            aiohttp.ClientSession() as s,
            s.get(gateways[1].url + "/metrics", headers=ADMIN_HEADERS) as r,
        ):
            metrics_text = await r.text()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(gateways[0].proc.wait, 10)
        a_exit = gateways[0].proc.proc.poll()
        capped_workers = max(1, round(workers * load.capped_share * 2))  # generous bound on its in-flight
        logs = {g.url: g.proc.output for g in gateways}
        report = check(
            load.ledger, capped_rpm=capped_rpm, capped_concurrency=capped_workers, access_logs=logs
        )
        output = "\n".join(g.proc.output for g in gateways)
        return ChaosResult(
            report,
            chaos.log,
            wall,
            recovered,
            recovery_s,
            health,
            output,
            metrics_text,
            a_exit,
            load.failovers,
            load.resets,
            llama=real is not None,
            llama_restarts=real.restarts if real is not None else 0,
            llama_verdict_s=chaos.llama_verdict_s,
        )
    finally:
        for g in gateways:
            g.kill()
        for e in fleet:
            e.kill()
        if real is not None:
            real.proc.stop()
        redis.close()


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default
