"""Run llama.cpp's native ``llama-server`` as a local replica: command-line builder and process lifecycle.

The binary is built from the ``vendor/llama.cpp`` folder of the llama-cpp-python source package
(``make llama-server``) and the model is the project's tiny random-weight Llama (``make tiny-model``); both
are cached under ``~/.cache/fleetgate``. ``EngineProcess`` is shared with the vLLM CPU launcher: start a
command, wait for ``/health``, freeze/thaw it with SIGSTOP/SIGCONT (hang drills), stop or restart it
on the same port.

Random weights rarely emit end-of-sequence, so clients that need exact output lengths send ``max_tokens`` with
``"ignore_eos": true`` (llama-server accepts it in the request body and turns it into a -inf logit bias on the
end-of-generation tokens); ``LlamaServerConfig.ignore_eos`` sets the same for every request.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
CACHE_ENV = "FLEETGATE_CACHE"
BINARY_ENV = "FLEETGATE_LLAMA_SERVER"
GGUF_ENV = "FLEETGATE_TINY_GGUF"
HF_MODEL_ENV = "FLEETGATE_TINY_HF"
DEFAULT_ALIAS = "tiny-llama"


def cache_dir() -> Path:
    """Root of fleetgate's build caches (outside the repository; ``make`` targets rebuild them)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "fleetgate")


def default_binary() -> Path:
    """Where ``scripts/build_llama_server.sh`` puts llama-server (``$FLEETGATE_LLAMA_SERVER`` overrides)."""
    env = os.environ.get(BINARY_ENV)
    if env:
        return Path(env)
    return cache_dir() / "llama.cpp" / LLAMA_CPP_PYTHON_VERSION / "bin" / "llama-server"


def default_gguf() -> Path:
    """Where ``scripts/build_tiny_model.sh`` puts the tiny model's GGUF (``$FLEETGATE_TINY_GGUF``
    overrides)."""
    env = os.environ.get(GGUF_ENV)
    if env:
        return Path(env)
    return cache_dir() / "models" / "tiny-llama" / "tiny-llama-f32.gguf"


def default_hf_model() -> Path:
    """The tiny model's Hugging Face folder (what vLLM serves); ``$FLEETGATE_TINY_HF`` overrides."""
    env = os.environ.get(HF_MODEL_ENV)
    if env:
        return Path(env)
    return cache_dir() / "models" / "tiny-llama" / "hf"


def missing_llama_parts() -> list[str]:
    """Human-readable list of what is not built yet (empty when llama-server can run)."""
    missing = []
    if not os.access(default_binary(), os.X_OK):
        missing.append(f"llama-server binary {default_binary()} (run `make llama-server`)")
    if not default_gguf().is_file():
        missing.append(f"tiny model {default_gguf()} (run `make tiny-model`)")
    return missing


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LlamaServerConfig:
    """Flags for one llama-server replica. ``ctx_size`` is the total KV context shared by the ``parallel``
    slots (llama.cpp splits it evenly unless the KV cache is unified)."""

    port: int
    model: Path = field(default_factory=default_gguf)
    binary: Path = field(default_factory=default_binary)
    host: str = "127.0.0.1"
    parallel: int = 2
    ctx_size: int = 4096
    threads: int = 1
    batch_size: int = 512
    alias: str = DEFAULT_ALIAS
    ignore_eos: bool = False
    seed: int = 0
    extra_args: tuple[str, ...] = ()


def build_llama_command(cfg: LlamaServerConfig) -> list[str]:
    """The llama-server argv for ``cfg``: metrics on, fixed slots and threads, no web UI, local host only."""
    cmd = [
        str(cfg.binary),
        "--model",
        str(cfg.model),
        "--alias",
        cfg.alias,
        "--host",
        cfg.host,
        "--port",
        str(cfg.port),
        "--parallel",
        str(cfg.parallel),
        "--ctx-size",
        str(cfg.ctx_size),
        "--threads",
        str(cfg.threads),
        "--threads-batch",
        str(cfg.threads),
        "--batch-size",
        str(cfg.batch_size),
        "--seed",
        str(cfg.seed),
        "--metrics",
        "--no-webui",
        "--cont-batching",
    ]
    if cfg.ignore_eos:
        cmd.append("--ignore-eos")
    cmd.extend(cfg.extra_args)
    return cmd


def llama_command_template(**kwargs: object) -> list[str]:
    """The llama-server argv with ``{port}`` and ``{model}`` placeholders, for ``local.command`` in a
    fleetgate config (``fleetgate up`` fills them in per replica). ``kwargs`` go to ``LlamaServerConfig``."""
    cmd = build_llama_command(LlamaServerConfig(port=0, **kwargs))  # type: ignore[arg-type]
    cmd[cmd.index("--port") + 1] = "{port}"
    cmd[cmd.index("--alias") + 1] = "{model}"
    return cmd


def _clean_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    # llama-server reads LLAMA_ARG_* variables as flags: drop inherited ones so the argv alone decides.
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    if extra:
        env.update(extra)
    return env


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


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
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
        self.env = _clean_env(env)
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
            preexec_fn=_die_with_parent,
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
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

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

    async def restart_async(self, limit_s: float = 60.0) -> float:
        """``restart`` for event-loop callers."""
        self.kill()
        t0 = time.monotonic()
        self.start()
        await self.wait_ready_async(limit_s=limit_s)
        return time.monotonic() - t0

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def llama_server(cfg: LlamaServerConfig, *, log_path: Path | None = None) -> EngineProcess:
    """An (unstarted) ``EngineProcess`` for a llama-server replica."""
    return EngineProcess(
        build_llama_command(cfg),
        host=cfg.host,
        port=cfg.port,
        health_path="/health",
        log_path=log_path,
        name=f"llama-server:{cfg.port}",
    )


def start_llama_replicas(
    n: int,
    *,
    ports: Sequence[int] | None = None,
    log_dir: Path | None = None,
    timeout: float = 60.0,
    **kwargs: object,
) -> list[EngineProcess]:
    """Start ``n`` llama-server replicas side by side and wait until all are healthy.

    ``kwargs`` go to ``LlamaServerConfig`` (parallel, ctx_size, threads, alias, ...). On failure every replica
    already started is stopped before the error propagates.
    """
    ports = list(ports) if ports is not None else [free_port() for _ in range(n)]
    procs: list[EngineProcess] = []
    try:
        for port in ports[:n]:
            cfg = LlamaServerConfig(port=port, **kwargs)  # type: ignore[arg-type]
            log = log_dir / f"llama-server-{port}.log" if log_dir is not None else None
            proc = llama_server(cfg, log_path=log)
            proc.start()
            procs.append(proc)
        for proc in procs:
            proc.wait_ready(timeout=timeout)
    except BaseException:
        for proc in procs:
            proc.stop()
        raise
    return procs
