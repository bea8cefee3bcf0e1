"""llama-server replicas of the tiny model for the live router comparison (``router_compare.py --engine
llama``): the flags a deployment sets, fresh replicas (cold caches), their own prompt-cache counters, and a
probe of one replica's prefill cost for ``router_compare_sim.py``'s engine model."""

from __future__ import annotations

import json
import math
import os
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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


def _chat(url: str, content: str, max_tokens: int) -> dict[str, Any]:
    """One chat completion; the response's ``timings`` (llama-server's own report of this request)."""
    body = {"model": LLAMA_MODEL, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": content}]}  # fmt: skip
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        timings: dict[str, Any] = json.load(resp)["timings"]
    return timings


def fit_engine_model(
    prefill: Sequence[tuple[float, int, int]], decode: Sequence[tuple[float, int, float]], batch: int = 512
) -> dict[str, float]:
    """``simengine.llamaserver``'s iteration cost fitted to a probe's timings (least squares on relative
    errors, refitted without any parameter that came out negative).

    A prompt of ``n`` tokens after ``c`` cached ones (``prefill``: seconds, n, c) takes ``ceil(n / batch)``
    iterations and samples one token: ``k step + sample + token n + attn n (2c + n)``; one decode iteration
    of ``d`` slots (``decode``: seconds per token, d, mean sum of 2 position + 1 over the slots) costs
    ``step + d (token + sample) + attn sum``."""
    import numpy as np

    rows = [[math.ceil(n / batch), 1.0, n, n * (2 * c + n)] for _, n, c in prefill]
    rows += [[1.0, d, d, k] for _, d, k in decode]
    y = np.array([t for t, _, _ in prefill] + [t for t, _, _ in decode])
    a_all = np.array(rows, dtype=float)
    w = 1.0 / y  # relative errors: the short prompts' and the decode steps' milliseconds count too
    keep = [0, 1, 2, 3]
    while True:
        coef, *_ = np.linalg.lstsq(a_all[:, keep] * w[:, None], y * w, rcond=None)
        neg = [keep[i] for i, v in enumerate(coef) if v < 0]
        if not neg:
            break
        keep = [k for k in keep if k not in neg]
    full = dict.fromkeys(range(4), 0.0)
    full.update({k: float(v) for k, v in zip(keep, coef, strict=True)})
    pred = a_all @ np.array([full[i] for i in range(4)])
    n_pre = len(prefill)
    return {
        "decode_step_s": full[0],
        "sample_s": full[1],
        "prefill_tokens_per_s": 1.0 / full[2] if full[2] > 0 else float("inf"),
        "prefill_s_per_token_sq": full[3],
        "prefill_mape": float(np.mean(np.abs(pred[:n_pre] - y[:n_pre]) / y[:n_pre])),
        "decode_mape": float(np.mean(np.abs(pred[n_pre:] - y[n_pre:]) / y[n_pre:])) if decode else 0.0,
    }


def probe_llama_prefill(
    fleet: LlamaFleet, logdir: Path, log: Callable[[str], None], repeats: int = 3
) -> dict[str, Any]:
    """Prefill and decode cost of one llama-server replica as the simulator's engine models need them.

    Prefill: sequential requests (nothing else on the replica), cold prompts of 64-3,000 tokens and the same
    prompts extended after a cached prefix; each response's ``timings`` (the engine's own ``prompt_n``,
    ``cache_n``, ``prompt_ms``) fit ``t = a * n + b * n * (2c + n)`` for ``n`` evaluated tokens after ``c``
    cached ones (``PerfParams.prefill_s_per_token`` and ``prefill_s_per_token_sq``). Median of ``repeats``
    per shape. Decode: 1 to ``parallel`` concurrent requests with short prompts and 64 output tokens; each
    one's ``predicted_ms / predicted_n`` is the iteration time with that many slots decoding. Both fit
    ``engine_model`` (``fit_engine_model``: the llama-server model's step, token, attention and sampling
    costs).
    """
    import numpy as np

    synth = PromptSynth(tokens_scale=1.0, source_block_tokens=16)
    engines = start_llama(fleet, 1, logdir, "probe")
    rows: list[tuple[float, int, int]] = []
    decode: list[tuple[float, int, float]] = []
    try:
        url = f"{engines[0].url}/v1/chat/completions"
        for k, words in enumerate((16, 64, 128, 256, 512, 768)):
            base = synth.text(tuple(range(k * 1000, k * 1000 + words // 16)), words, unique_key=f"p{k}")
            for extra, rep in [(0, r) for r in range(repeats)] + [(48, r) for r in range(repeats)]:
                tail = "" if not extra else synth.text((), extra, unique_key=f"t{k}-{rep}")
                # cold: a fresh unique prefix word each time; warm: the same base, a new tail
                head = f"probe{k}x{rep} " if not extra else ""
                t = _chat(url, head + base + tail, 1)
                rows.append((t["prompt_ms"] / 1000.0, int(t["prompt_n"]), int(t.get("cache_n", 0))))
        out_tokens = 64
        for d in range(1, fleet.parallel + 1):
            for rep in range(repeats):
                prompts = [synth.text((), 12, unique_key=f"d{d}-{rep}-{i}") for i in range(d)]
                with ThreadPoolExecutor(d) as pool:
                    got = list(pool.map(lambda c: _chat(url, c, out_tokens), prompts))
                n_prompt = float(np.mean([g["prompt_n"] + g.get("cache_n", 0) for g in got]))
                # mean over the decode iterations of sum (2 position + 1) over the d slots
                pos = d * (2 * (n_prompt + out_tokens / 2) + 1)
                for g in got:
                    if g.get("predicted_n", 0) > 1:
                        decode.append((g["predicted_ms"] / 1000.0 / g["predicted_n"], d, pos))
    finally:
        stop_all(engines)
    a_mat = np.array([[n, n * (2 * c + n)] for _, n, c in rows], dtype=float)
    y = np.array([r[0] for r in rows])
    (a, b), *_ = np.linalg.lstsq(a_mat, y, rcond=None)
    mape = float(np.mean(np.abs(a_mat @ np.array([a, b]) - y) / y))
    model = fit_engine_model(rows, decode)
    out = {"prefill_tokens_per_s": 1.0 / a if a > 0 else None, "prefill_s_per_token_sq": float(b),
           "mape": mape, "samples": rows, "decode_samples": decode, "engine_model": model,
           "load_avg": os.getloadavg()[0]}  # fmt: skip
    log(f"llama prefill probe: 1/a = {1.0 / a:.0f} tokens/s, b = {b:.3e} s, MAPE {mape:.1%}")
    log(f"llama-server engine model: {json.dumps(model)}")
    return out
