"""llama-server replicas of the tiny model for the live router comparison (``router_compare.py --engine
llama``): the flags a deployment sets, fresh replicas (cold caches), their own prompt-cache counters, and a
probe of one replica's prefill cost for ``router_compare_sim.py``'s engine model."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from live_procs import Proc, free_port, spawn, stop_all, wait_http

from fleetgate.bench.prompts import PromptSynth
from fleetgate.engines.llama import LlamaServerConfig, build_llama_command, missing_llama_parts

LLAMA_MODEL = "tiny-llama"


@dataclass(frozen=True)
class LlamaFleet:
    """How ``--engine llama`` replicas run: llama-server with the tiny model, flags as a deployment sets them.

    ``parallel`` slots share ``ctx_size`` tokens of KV; each slot keeps its last prompt, a new request takes
    the slot whose prompt it matches best when the match is above ``slot_prompt_similarity`` (llama.cpp's
    default 0.1), and the host-memory prompt cache (``--cache-ram`` MiB) keeps idle slots' prompts and
    restores the longest cached prefix of a new prompt. ``cache_ram_mib`` is sized like the simulated
    engines' prefix cache (65,536 tokens at 2,048 bytes of f16 KV per token: 4 layers x 4 KV heads x 32
    dimensions x K and V), so the replay's working set does not fit one replica and where a conversation's
    turns land decides the hit rate, as it would with a real model's far larger KV per token.
    """

    parallel: int = 4
    ctx_size: int = 16384
    cache_ram_mib: int = 128
    cache_reuse: int = 0
    slot_prompt_similarity: float = 0.1
    threads: int = 1
    kv_bytes_per_token: int = 2048

    def config(self, port: int) -> LlamaServerConfig:
        extra = (
            "--cache-ram", str(self.cache_ram_mib), "--cache-reuse", str(self.cache_reuse),
            "--slot-prompt-similarity", str(self.slot_prompt_similarity),
        )  # fmt: skip
        return LlamaServerConfig(
            port=port, parallel=self.parallel, ctx_size=self.ctx_size, threads=self.threads,
            alias=LLAMA_MODEL, ignore_eos=True, extra_args=extra,
        )  # fmt: skip

    def cache_tokens(self) -> int:
        """Prefix-cache capacity of one replica in tokens: the prompt cache plus the slots' own KV (what an
        operator knows from the flags and the model's KV size, not read from the engine)."""
        return self.cache_ram_mib * 2**20 // self.kv_bytes_per_token + self.ctx_size


def start_llama(
    fleet: LlamaFleet, replicas: int, logdir: Path, tag: str, cpus: set[int] | None = None
) -> list[Proc]:
    """Fresh llama-server replicas (cold slot and prompt caches), each ready on /health."""
    missing = missing_llama_parts()
    if missing:
        raise RuntimeError("llama-server not built: " + "; ".join(missing))
    procs = []
    for i in range(replicas):
        port = free_port()
        proc = spawn(f"{tag}-llama{i}", build_llama_command(fleet.config(port)), logdir, cpus)
        proc.url = f"http://127.0.0.1:{port}"
        procs.append(proc)
    for proc in procs:
        assert proc.url is not None
        wait_http(proc.url + "/health", proc)
    return procs


def llama_cache_counters(engines: Sequence[Proc]) -> dict[str, Any]:
    """The replicas' own prompt-cache counters since they started (they start fresh for each contender).

    ``llamacpp:prompt_tokens_total`` counts the prompt tokens a replica evaluated and
    ``llamacpp:prompt_tokens_cached_total`` those it took from its caches, so the hit rate is cached /
    (cached + evaluated).
    """
    cached = evaluated = 0.0
    per = []
    for e in engines:
        try:
            with urllib.request.urlopen(f"{e.url}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            per.append(None)
            continue
        vals = {}
        for line in text.splitlines():
            if line.startswith("llamacpp:") and not line.startswith("#"):
                name, _, v = line.rpartition(" ")
                vals[name.removeprefix("llamacpp:")] = float(v)
        c, ev = vals.get("prompt_tokens_cached_total", 0.0), vals.get("prompt_tokens_total", 0.0)
        cached, evaluated = cached + c, evaluated + ev
        per.append({"cached": c, "evaluated": ev, "hit_rate": c / (c + ev) if c + ev else None, **vals})
    total = cached + evaluated
    return {"hit_rate": cached / total if total else None, "cached_tokens": cached,
            "evaluated_tokens": evaluated, "engines": per}  # fmt: skip


def probe_llama_prefill(
    fleet: LlamaFleet, logdir: Path, log: Callable[[str], None], repeats: int = 3
) -> dict[str, Any]:
    """Prefill cost of one llama-server replica as the simulator's engine model needs it.

    Sequential requests (nothing else on the replica), cold prompts of 64-3,000 tokens and the same prompts
    extended after a cached prefix; each response's ``timings`` (the engine's own ``prompt_n``, ``cache_n``,
    ``prompt_ms``) fit ``t = a * n + b * n * (2c + n)`` for ``n`` evaluated tokens after ``c`` cached ones
    (``PerfParams.prefill_s_per_token`` and ``prefill_s_per_token_sq``). Median of ``repeats`` per shape.
    """
    import numpy as np

    synth = PromptSynth(tokens_scale=1.0, source_block_tokens=16)
    engines = start_llama(fleet, 1, logdir, "probe")
    rows: list[tuple[float, int, int]] = []
    try:
        url = f"{engines[0].url}/v1/chat/completions"
        for k, words in enumerate((16, 64, 128, 256, 512, 768)):
            base = synth.text(tuple(range(k * 1000, k * 1000 + words // 16)), words, unique_key=f"p{k}")
            for extra, rep in [(0, r) for r in range(repeats)] + [(48, r) for r in range(repeats)]:
                tail = "" if not extra else synth.text((), extra, unique_key=f"t{k}-{rep}")
                # cold: a fresh unique prefix word each time; warm: the same base, a new tail
                head = f"probe{k}x{rep} " if not extra else ""
                body = {"model": LLAMA_MODEL, "max_tokens": 1, "temperature": 0,
                        "messages": [{"role": "user", "content": head + base + tail}]}  # fmt: skip
                req = urllib.request.Request(
                    url, json.dumps(body).encode(), {"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(req, timeout=60) as resp:
                    t = json.load(resp)["timings"]
                rows.append((t["prompt_ms"] / 1000.0, int(t["prompt_n"]), int(t.get("cache_n", 0))))
    finally:
        stop_all(engines)
    a_mat = np.array([[n, n * (2 * c + n)] for _, n, c in rows], dtype=float)
    y = np.array([r[0] for r in rows])
    (a, b), *_ = np.linalg.lstsq(a_mat, y, rcond=None)
    mape = float(np.mean(np.abs(a_mat @ np.array([a, b]) - y) / y))
    out = {"prefill_tokens_per_s": 1.0 / a if a > 0 else None, "prefill_s_per_token_sq": float(b),
           "mape": mape, "samples": rows, "load_avg": os.getloadavg()[0]}  # fmt: skip
    log(f"llama prefill probe: 1/a = {1.0 / a:.0f} tokens/s, b = {b:.3e} s, MAPE {mape:.1%}")
    return out
