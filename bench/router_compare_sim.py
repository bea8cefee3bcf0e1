"""Offline proxy of ``bench/router_compare.py`` in the discrete-event simulator (seconds instead of minutes).

The live comparison replays 1,000 requests of the Mooncake conversation trace at 6x against 4 simulated
engines (tokens scaled by 1/32, engines at ``--time-scale 0.25``). This script builds the same workload for
``sim.des``: the same trace slice with lengths scaled by 1/32 and each ``hash_id`` one 16-token block, the
live engine profile (``router_compare.ENGINE_PROFILE``) with every duration multiplied by the time scale, the
gateway's default cost profile, and the same fleetgate parameters (``router_compare.engine_facts``). It
runs several 1,000-request slices of the trace (the live run uses the first) and reports each policy's p95
TTFT and hit rate relative to the first policy listed, so a routing change can be judged on more than the
50 requests that make up one slice's tail. Not a substitute for the live run: no HTTP, no gateway/engine CPU
contention (the live p95s are 0.05-0.1 s higher), but it ranked the policies like the live runs did.

    .venv/bin/python bench/router_compare_sim.py [--policies cache_aware,fleetgate,fleetgate@x]
        [--params '{"x": {"spill_factor": 2.0}}'] [--slices 0,1000,...] [--rate 6] [--replicas 4]

``name@tag`` runs policy ``name`` with ``params[tag]`` (on top of the engine facts for fleetgate).

``--engine llama`` predicts ``router_compare.py --engine llama`` instead: llama-server replicas of the tiny
model as a calibrated engine model (``llama_engine``: slots as ``max_num_seqs``, the slots' context plus the
prompt cache as the prefix cache, the prefill rate measured by ``fleetgate calibrate`` against one replica,
``--prefill-tokens-per-s``), prompt lengths in the engine's tokens (``--tokens-per-word``: the synthesised
prompts' words are several BPE tokens each; the live run's usage gives the factor), any trace
(``--trace``). fleetgate gets what the live run gives it: the cache size from the flags; its prefill rate
is learned online in both. With ``--prompts live`` (the default since session 10) the lengths are instead
the tiny model's token counts of the prompts the live replay sends (its ``tokenizer.json``; a run's recorded
``usage.prompt_tokens`` checks them) and the hashes the gateway's (``llama_prompt_slice``).

    .venv/bin/python bench/router_compare_sim.py --engine llama --trace T --tokens-scale 0.0078125 \
        --rate 1.5 --replicas 3 --slices 0 --requests 500 --prefill-tokens-per-s 5747 --tokens-per-word 2.5
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from router_compare import LlamaFleet, engine_facts, engine_profile, load_workload
from sglang_router_model import SglangCacheAwareModel

from fleetgate.core.routing.registry import build_policy
from fleetgate.core.units import DEFAULT_PROFILE
from fleetgate.engines.llama import default_hf_model
from fleetgate.sim.des import SimConfig, Simulator, default_ids
from fleetgate.sim.speed import SpeedVariation, SpeedVaryingEngine
from fleetgate.sim.traces import Trace, TraceRequest, default_traces_dir, load_trace
from fleetgate.simengine.contention import SharedCpu, parse_slowdown
from fleetgate.simengine.llamaserver import LlamaServerModel, LlamaServerParams
from fleetgate.simengine.perfmodel import EngineModel, PerfParams


def live_engine(time_scale: float, cache_blocks: int | None = None) -> PerfParams:
    """The live engines' parameters with every duration in wall-clock seconds (``cache_blocks``: the live
    run's ``--engine-cache-blocks``)."""
    perf = engine_profile(cache_blocks)
    p = PerfParams.from_mapping(perf)
    return PerfParams.from_mapping(
        {
            **perf,
            "prefill_s_per_token": p.prefill_s_per_token * time_scale,
            "prefill_s_per_token_sq": p.prefill_s_per_token_sq * time_scale,
            "step_overhead_s": p.step_overhead_s * time_scale,
            "decode_s_per_seq": p.decode_s_per_seq * time_scale,
            "decode_s_per_kv_token": p.decode_s_per_kv_token * time_scale,
        }
    )


def llama_engine(
    fleet: LlamaFleet,
    prefill_tokens_per_s: float,
    decode_step_s: float,
    block_tokens: int,
    prefill_s_per_token_sq: float = 0.0,
) -> PerfParams:
    """A calibrated engine model of one llama-server replica run with ``fleet``'s flags.

    Slots are sequences (``--parallel``), ``--batch-size`` 512 tokens per iteration, each slot's context
    ``ctx_size / parallel``; the prefix cache holds ``fleet.cache_tokens()`` (the slots' KV plus the prompt
    cache) in blocks of the trace's scaled block size. Prefill costs ``1 / prefill_tokens_per_s`` per token
    plus ``prefill_s_per_token_sq`` per token and position attended (a cached prefix still costs its
    attention: with the tiny model's 256-wide layers that dominates long prompts); an iteration
    ``decode_step_s`` (one thread: the slots' decode shares it, hence no per-sequence term).
    """
    return PerfParams(
        max_num_seqs=fleet.parallel,
        kv_capacity_tokens=fleet.ctx_size,
        block_tokens=block_tokens,
        max_num_batched_tokens=512,
        prefix_cache_blocks=fleet.cache_tokens() // block_tokens,
        step_overhead_s=decode_step_s,
        prefill_s_per_token=1.0 / prefill_tokens_per_s,
        prefill_s_per_token_sq=prefill_s_per_token_sq,
        decode_s_per_seq=0.0,
        decode_s_per_kv_token=0.0,
        max_model_len=fleet.ctx_size // fleet.parallel,
    )


def llama_server_params(fleet: LlamaFleet, args: argparse.Namespace) -> LlamaServerParams:
    """``simengine.llamaserver``'s model of one replica run with ``fleet``'s flags: slots, context, batch,
    slot similarity and prompt cache as the live replicas are started; the iteration cost from the
    calibration flags (``--llama-calibration``: a probe of one live replica, ``llama_fleet.probe_llama``)."""
    from fleetgate.engines.llama import LlamaServerConfig

    return LlamaServerParams(
        parallel=fleet.parallel,
        ctx_size=fleet.ctx_size,
        batch_size=LlamaServerConfig(port=0).batch_size,
        slot_prompt_similarity=fleet.slot_prompt_similarity,
        cache_ram_mib=fleet.cache_ram_mib,
        kv_bytes_per_token=fleet.kv_bytes_per_token,
        step_s=args.decode_step_s,
        token_s=1.0 / args.prefill_tokens_per_s,
        attn_s=args.prefill_s_per_token_sq,
        sample_s=args.sample_s,
    )


def llama_contention(spec: str) -> tuple[float, ...]:
    """``--llama-contention``: factors ``f1,f2,f3`` (an iteration's slowdown with 1, 2, 3 replicas busy
    at once) or a contention probe's JSON (``bench/llama_contention.py --out``: its prefill factors)."""
    path = Path(spec)
    if path.suffix == ".json" or path.exists():
        factors = json.loads(path.read_text())["factors"]["prefill"]  # relative to one busy replica
        return parse_slowdown([factors[k] / factors["1"] for k in sorted(factors, key=int)])
    return parse_slowdown([float(x) for x in spec.split(",") if x])


def scaled_slice(
    reqs: list[TraceRequest], rate: float, tokens_scale: float, input_factor: float = 1.0
) -> Trace:
    """``reqs`` from their first arrival at ``rate`` x, lengths scaled like the live prompts (input lengths
    also by ``input_factor``, engine tokens per synthesised word)."""
    t0 = reqs[0].arrival_s

    def sc(x: int) -> int:
        return max(1, round(x * tokens_scale))

    def sci(x: int) -> int:
        return max(1, round(x * tokens_scale * input_factor))

    return Trace(
        "mooncake-scaled",
        [
            TraceRequest(
                arrival_s=(r.arrival_s - t0) / rate,
                input_tokens=sci(r.input_tokens),
                output_tokens=sc(r.output_tokens),
                tenant=r.tenant,
                hash_ids=r.hash_ids,
                block_tokens=sci(r.block_tokens),
                session=r.session,
            )
            for r in reqs
        ],
        "mooncake",
    )


def live_prompt_slice(
    reqs: list[TraceRequest],
    rate: float,
    tokens_scale: float,
    hash_block: int = 16,
    engine_tokens: Callable[[list[dict[str, Any]]], list[int]] | None = None,
) -> Trace:
    """``reqs`` as a live replay sends them (``PromptSynth``'s prompts in ``bench.replay``'s chat body), from
    their first arrival at ``rate`` x: each request's length and ``hash_block``-token block hashes are what
    the gateway counts (``core.tokenize``, which the simulated engine shares), so the template and the
    synthesised words are included (on the Mooncake slice 6% more tokens than the scaled trace lengths
    ``scaled_slice`` gives: near saturation that moved the default's p99 by 40%). ``engine_tokens``: the
    engine's own token ids of a request's messages when it tokenizes differently (llama:
    ``llama_prompt_slice``): the request's length and ``token_ids``; a hash block then stands for
    ``hash_block * engine tokens / gateway tokens`` of its engine tokens."""
    from fleetgate.bench.prompts import PromptSynth
    from fleetgate.bench.replay import ReplayOptions, plan_requests, request_body
    from fleetgate.core.tokenize import PromptTokenizer

    planned = plan_requests(Trace("slice", reqs, "mooncake"), PromptSynth(tokens_scale=tokens_scale))
    tok, opts = PromptTokenizer(), ReplayOptions(base_url="", model="")
    out = []
    for p, r in zip(planned, reqs, strict=True):
        messages = request_body(p, opts)["messages"]
        _text, n, hashes = tok.count_and_hash_chat(messages, hash_block, hashes=True)
        ids = () if engine_tokens is None else tuple(engine_tokens(messages))
        engine_n = len(ids) if ids else n
        block = hash_block if engine_tokens is None else max(1, round(hash_block * engine_n / n))
        out.append(
            TraceRequest(
                arrival_s=p.at_s / rate, input_tokens=engine_n, output_tokens=p.max_tokens, tenant=r.tenant,
                hash_ids=hashes, block_tokens=block, session=r.session, token_ids=ids,
            )
        )  # fmt: skip
    return Trace(
        "mooncake-live-prompts" if engine_tokens is None else "mooncake-live-prompts-llama", out, "mooncake"
    )


def llama_prompt_slice(
    reqs: list[TraceRequest], rate: float, tokens_scale: float, tokenizer: Path, hash_block: int = 16
) -> Trace:
    """``reqs`` as a live llama replay sends them: ``live_prompt_slice``'s prompts, each one's length in the
    tiny model's tokens (its ``tokenizer.json`` on the rendered ChatML prompt, what llama-server counts:
    ``usage.prompt_tokens`` of the live run checks it) with the gateway's block hashes (blocks of
    ``hash_block`` of its tokens, 16 live) and the token ids themselves (``TraceRequest.token_ids``: the
    llama-server engine model reuses any common token prefix, as llama-server does; the block engine model
    matches whole hash blocks)."""
    from fleetgate.core.tokenize import render_chat_prompt
    from fleetgate.hf_tokenizer import load_tokenizer

    engine_tok = load_tokenizer(tokenizer)
    return live_prompt_slice(
        reqs,
        rate,
        tokens_scale,
        hash_block,
        lambda messages: list(engine_tok.encode(render_chat_prompt(messages))),
    )


def send_jitter(trace: Trace, max_s: float, seed: int) -> Trace:
    """``trace`` with every arrival delayed by up to ``max_s`` (uniform, seeded), re-sorted: the live client
    sends each request within 10-25 ms of its schedule (the gateway's access log against the plan, session
    10) and requests due at the same instant reach the gateway in no fixed order. Where a policy's outcome
    hangs on such details (the default on wandering engine speeds) one simulated run is one draw."""
    rng = random.Random(seed)
    moved = [replace(r, arrival_s=r.arrival_s + rng.uniform(0.0, max_s)) for r in trace.requests]
    return replace(trace, requests=sorted(moved, key=lambda r: r.arrival_s))


@dataclass(frozen=True)
class PathTerm:
    """The live path's latency, which the simulator does not model: the replay client's, the gateway's and the
    engine's HTTP, JSON, tokenisation and SSE and their event loops' wake-ups (session 13). Added to every
    simulated TTFT: ``fixed_s`` plus ``per_token_s`` per prompt token (the gateway's count), plus, with
    ``residuals_s``, one of the measured residuals drawn for each request (seeded by the draw, the same
    draws for every policy of a draw). The engines see each request at its simulated arrival; the term only
    lengthens what the client measures. Calibrated on one engine by ``bench/path_latency.py``, not on the
    runs predicted (``from_calibration``)."""

    fixed_s: float = 0.0
    per_token_s: float = 0.0
    residuals_s: tuple[float, ...] = ()

    @property
    def active(self) -> bool:
        return bool(self.fixed_s or self.per_token_s or self.residuals_s)

    def delays(self, trace: Trace, draw: int) -> np.ndarray:
        """Each request's path latency (s), in ``trace``'s order."""
        tokens = np.array([r.input_tokens for r in trace.requests], dtype=float)
        out = self.fixed_s + self.per_token_s * tokens
        if self.residuals_s:
            rng = np.random.default_rng(1_000 + draw)
            out = out + rng.choice(np.asarray(self.residuals_s), size=len(tokens))
        return out

    @staticmethod
    def from_calibration(doc: dict[str, Any], rate: float, residuals: bool = True) -> tuple[PathTerm, str]:
        """The term from ``path_latency.py --out``: its gateway cell (open loop) whose arrival rate is nearest
        ``rate`` (requests per second of the run predicted): the least-squares fit of its per-request path
        (live TTFT minus the simulator's) on prompt tokens, and that fit's residuals."""
        cells = [c for c in doc["cells"] if c["mode"] == "gateway" and c["rate"] > 0]
        if not cells:
            raise SystemExit("--path-from: no open-loop gateway cell in the calibration")
        cell = min(cells, key=lambda c: abs(c["rate"] - rate))
        rows = [r for r in cell["rows"] if r["live"] is not None and r["sim"] is not None]
        tokens = np.array([r["tokens"] for r in rows], dtype=float)
        path = np.array([r["live"] - r["sim"] for r in rows])
        b, a = np.polyfit(tokens, path, 1)
        res = tuple(float(x) for x in path - (a + b * tokens)) if residuals else ()
        note = (
            f"path term from the gateway cell at {cell['rate']:g} req/s (time scale {cell['time_scale']}, "
            f"{len(rows)} requests): {a * 1e3:.2f} ms + {b * 1e6:.3f} ms per 1k tokens"
            + (
                f", residuals p50 {np.median(res) * 1e3:+.2f} / p95 {np.percentile(res, 95) * 1e3:+.2f} ms"
                if res
                else ""
            )
        )
        return PathTerm(float(a), float(b), res), note


#: What the simulator runs for each live contender. vllm-router 0.1.17's cache_aware is not modelled by
#: default: it routes by token ids it asks the worker to render (vLLM's ``/v1/chat/completions/render``);
#: the simulated engines and llama-server have no such endpoint, so every decision is ``missing_tokens``
#: (its own metrics) and it balances load. ``--vllm-model least_load`` runs that fallback (docs/benchmarks.md,
#: session 10's "### vllm-router" and "Session 11: live runs under cache pressure").
#: sglang-router's ``cache_aware`` is ``sglang_router_model`` (session 10; ``--sglang-model cache_aware``:
#: our own cache_aware, the stand-in of the predictions recorded before).
SIM_POLICY = {
    "fleetgate:fleetgate": "fleetgate",
    "fleetgate:cache_aware": "cache_aware",
    "fleetgate:round_robin": "round_robin",
    "fleetgate:least_requests": "least_requests",
    "fleetgate:p2c": "p2c",
    "sglang-router:cache_aware": "sglang_cache_aware",
    "vllm-router:round_robin": "round_robin",
}


def sim_policy(contender: str) -> str | None:
    """The simulator's policy label for a live contender (``fleetgate:name@variant`` -> ``name@variant``)."""
    if contender.startswith("fleetgate:"):
        return contender.removeprefix("fleetgate:")
    return SIM_POLICY.get(contender)


def live_words(meta: dict[str, Any]) -> int:
    """Words of the prompts the live run sent (the same synthesiser, trace slice and scale)."""
    from fleetgate.bench.prompts import PromptSynth
    from fleetgate.bench.replay import plan_requests

    if meta.get("workload"):
        trace = load_workload(workload_args(meta))
    else:
        trace = load_trace(meta["trace"], max_requests=meta["requests"])
    planned = plan_requests(trace, PromptSynth(tokens_scale=meta["tokens_scale"]))
    return sum(len(r.prompt.split()) for r in planned)


def live_speed(meta: dict[str, Any]) -> tuple[SpeedVariation, str]:
    """The wandering speeds of a live sim-engine run (``router_compare.py --speed-noise``) and a note on
    whether its recorded schedule is the simulator's (runs before session 10 drew their own)."""
    noise = meta.get("speed_noise") or 0.0
    variation = SpeedVariation(
        noise=noise, period_s=meta.get("speed_period_s") or 10.0, seed=meta.get("speed_seed", meta["seed"])
    )
    if not noise:
        return variation, "uniform engines"
    recorded = meta.get("speed_schedule")
    if not recorded:
        return variation, "WARNING: the live run predates the shared schedule: its speeds were not these"
    names = meta["speed_replica_names"]
    same = all(
        variation.schedule(n, len(row)) == row for n, row in zip(names, recorded, strict=True)
    ) and names == [SimConfig().replica_ids(i) for i in range(len(names))]
    return (
        variation,
        "the live schedule" if same else "WARNING: the live schedule differs from the simulator's",
    )


def workload_args(meta: dict[str, Any]) -> argparse.Namespace:
    """``router_compare.load_workload``'s arguments from a live run's ``meta`` (``--workload`` runs)."""
    w = meta["workload"]
    return argparse.Namespace(
        workload=w["name"],
        workload_load=w["load"],
        workload_per_replica=w["per_replica"],
        workload_seed=w["seed"],
        replicas=meta["replicas"],
        requests=meta["requests"],
    )


def apply_live(args: argparse.Namespace, live: dict[str, Any]) -> None:
    """Set ``args`` to predict the live run ``live`` (``router_compare.py --out``, sim or llama engines)."""
    meta = live["meta"]
    if meta.get("workload"):
        w = meta["workload"]
        args.workload, args.workload_load = w["name"], w["load"]
        args.workload_per_replica, args.workload_seed = w["per_replica"], w["seed"]
    else:
        args.trace = Path(meta["trace"])
    args.requests = meta["requests"]
    args.slices = "0"
    args.rate = meta["rate_scale"]
    args.replicas = meta["replicas"]
    args.tokens_scale = meta["tokens_scale"]
    names = [sim_policy(c) for c in live["results"]]
    extra = [v for v in args.variants.split(",") if v]
    args.policies = ",".join(dict.fromkeys(["fleetgate", *(n for n in names if n), *extra]))
    # the live run's policy parameters (variants' entries and engine facts included), --params on top
    args.params = json.dumps((meta.get("policy_params") or {}) | json.loads(args.params))
    if meta.get("engine", "sim") == "sim":
        args.engine = "sim"
        args.time_scale = meta["engine_time_scale"]
        args.engine_cache_blocks = (meta.get("engine_profile") or {}).get("prefix_cache_blocks")
        variation, note = live_speed(meta)
        args.speed_noise, args.speed_period, args.speed_seed = (
            variation.noise,
            variation.period_s,
            variation.seed,
        )
        print(f"predicting {args.from_live}: sim engines, speeds: {note}", file=sys.stderr)
        return
    args.engine = "llama"
    args.llama_cache_ram = meta["llama"]["cache_ram_mib"]
    args.llama_ctx_size = meta["llama"]["ctx_size"]
    args.llama_parallel = meta["llama"]["parallel"]
    ok = [r for r in live["results"].values() if "failed" not in r and r.get("prompt_tokens")]
    if ok:  # engine tokens per synthesised word (the chat template's few tokens per request included)
        # usage counts only the answered requests: scale the words by the share answered (Azure's runs
        # lose a few to empty streams; session 6 read no factor from them and used 1.0 there)
        best = max(ok, key=lambda r: r.get("ok") or r["requests"] - (r.get("errors") or 0))
        answered = (best.get("ok") or best["requests"] - (best.get("errors") or 0)) / best["requests"]
        args.tokens_per_word = best["prompt_tokens"] / (live_words(meta) * answered)
    print(f"predicting {args.from_live}: tokens per word {args.tokens_per_word:.3f}", file=sys.stderr)


def prompt_check(live: dict[str, Any], trace: Trace) -> str:
    """The simulated prompts' engine tokens against the live run's ``usage.prompt_tokens`` (a check of the
    tokenization, not an input: per contender, on the requests it answered)."""
    mine = sum(r.input_tokens for r in trace.requests)
    parts = []
    for name, r in live["results"].items():
        if "failed" in r or not r.get("prompt_tokens"):
            continue
        answered = (r.get("ok") or r["requests"] - (r.get("errors") or 0)) / r["requests"]
        parts.append(f"{name} {r['prompt_tokens'] / answered / mine:.4f}")
    return f"{mine} engine tokens; live usage / these: " + (", ".join(parts) or "(no usage recorded)")


#: The ratios compared with a live run: (label, live result key, index in the simulator's figures).
RATIOS = (("p50", "p50", 3), ("p95", "p95", 0), ("p99", "p99", 4), ("hit", "hit", 1))


def _live_figure(r: dict[str, Any], key: str) -> float:
    return float(r.get("prefix_cache_hit_rate") or 0.0) if key == "hit" else float(r["ttft_s"][key])


Figures = tuple[float, float, float, float, float]  # p95 s, hit rate, max/mean load, p50 s, p99 s


def compare_live(
    live: dict[str, Any], out: dict[str, list[Figures]], draws: dict[str, list[Figures]] | None = None
) -> str:
    """fleetgate's p50 / p95 / p99 TTFT and hit rate over each other contender's, live and predicted; the
    p95 within 15% is the acceptance bar (the others are shown, not counted).

    With repeats (``router_compare.py --repeats``) the live ratio is the median of the per-repeat paired
    ratios and the live figures the medians over repeats. With ``draws`` (``--send-jitter``: the first slice
    run several times with jittered arrivals) the prediction is the median of the per-draw ratios, its
    range shown beside it, and the sim figures are medians over the draws."""
    res = {k: v for k, v in live["results"].items() if "failed" not in v}
    paired = live.get("paired") or {}
    me = res.get("fleetgate:fleetgate")
    if me is None:
        return "(no live fleetgate:fleetgate result)"

    def sim_figures(label: str) -> Figures:
        if not draws:
            return out[label][0]
        m = np.median(np.array(draws[label]), axis=0)
        return (float(m[0]), float(m[1]), float(m[2]), float(m[3]), float(m[4]))

    sim_me = sim_figures("fleetgate")
    lines = [
        "| other | figure | live fleetgate | sim fleetgate | live other | sim other "
        "| live fleetgate/other | predicted | error | within 15% | predicted range |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    held = modelled = 0
    for name, r in res.items():
        if name == "fleetgate:fleetgate":
            continue
        pol = sim_policy(name)
        variant = name.startswith("fleetgate:fleetgate@")  # a variant of ours, not an "other" router
        for label, key, i in RATIOS:
            mine, theirs = _live_figure(me, key), _live_figure(r, key)
            live_ratio = (paired.get(name) or {}).get(f"{key}_ratio_median") or (
                mine / theirs if theirs else float("nan")
            )
            head = f"| {name} | {label} | {mine:.3f} | {sim_me[i]:.3f} | {theirs:.3f} "
            if pol is None or pol not in out:
                lines.append(f"{head}| - | {live_ratio:.3f} | (not modelled) | | | |")
                continue
            sim = sim_figures(pol)
            pred = sim_me[i] / sim[i] if sim[i] else float("nan")
            span = ""
            if draws:
                per = [
                    a[i] / b[i] if b[i] else float("nan")
                    for a, b in zip(draws["fleetgate"], draws[pol], strict=True)
                ]
                pred = float(np.median(per))
                span = f"{min(per):.3f}-{max(per):.3f} ({len(per)})"
            err = pred / live_ratio - 1.0
            ok = abs(err) <= 0.15
            if label == "p95":
                modelled += not variant
                held += not variant and ok
            lines.append(
                f"{head}| {sim[i]:.3f} | {live_ratio:.3f} | {pred:.3f} | {err:+.1%} "
                f"| {'yes' if ok else 'no'} | {span} |"
            )
    lines.append(
        f"\np95 within 15%: {held} of {modelled} modelled ratios (variants of the default not counted)"
    )
    return "\n".join(lines)


def dump_requests(path: Path, runs: dict[str, Any], trace: Trace) -> None:
    """Per request of the first slice and each policy: arrival, TTFT, replica, dispatch time (JSON)."""
    doc: dict[str, Any] = {"input_tokens": [r.input_tokens for r in trace.requests]}
    doc["output_tokens"] = [r.output_tokens for r in trace.requests]
    for label, res in runs.items():
        doc[label] = {
            "arrival_s": res.arrival_s.tolist(),
            "ttft_s": [None if np.isnan(x) else float(x) for x in res.ttft_s],
            "replica": [res.replica_names[int(i)] if i >= 0 else None for i in res.replica_of],
            "dispatch_s": [None if np.isnan(x) else float(x) for x in res.dispatch_s],
        }
    path.write_text(json.dumps(doc))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="cache_aware,fleetgate,least_requests,round_robin")
    ap.add_argument("--params", default="{}", help='JSON {"tag or policy": {params}}.')
    ap.add_argument(
        "--variants", default="",
        help="With --from-live: more policies (name@tag, params from --params) run beside the live ones.",
    )  # fmt: skip
    ap.add_argument("--rate", type=float, default=6.0)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--slices", default="0,1000,2000,3000,4000,5000")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--time-scale", type=float, default=0.25)
    ap.add_argument("--tokens-scale", type=float, default=1 / 32)
    ap.add_argument("--no-engine-facts", action="store_true")
    ap.add_argument("--engine", choices=("sim", "llama"), default="sim")
    ap.add_argument("--trace", type=Path, default=None, help="Default: the Mooncake conversation trace.")
    ap.add_argument(
        "--workload", default=None, choices=("agentic", "rag", "batch", "mix"),
        help="A seeded generated workload as router_compare.py --workload replays it (instead of --trace; "
        "one slice from its first request, --requests of it, --rate as the live --rate-scale).",
    )  # fmt: skip
    ap.add_argument("--workload-load", type=float, default=0.01)
    ap.add_argument("--workload-per-replica", type=float, default=None)
    ap.add_argument("--workload-seed", type=int, default=0)
    ap.add_argument("--prefill-tokens-per-s", type=float, default=5747.0, help="llama: calibrated prefill.")
    ap.add_argument("--prefill-s-per-token-sq", type=float, default=0.0, help="llama: attention term.")
    ap.add_argument("--decode-step-s", type=float, default=0.003, help="llama: one iteration's time.")
    ap.add_argument("--tokens-per-word", type=float, default=1.0, help="llama: engine tokens per word.")
    ap.add_argument(
        "--engine-model", choices=("llama-server", "blocks"), default="llama-server",
        help="llama: the engine model: llama-server's slots, token-prefix reuse and prompt cache "
        "(simengine.llamaserver, session 11) or the block-hash engine (perfmodel, the predictions before).",
    )  # fmt: skip
    ap.add_argument("--sample-s", type=float, default=0.0, help="llama-server model: cost per sampled token.")
    ap.add_argument(
        "--llama-calibration", type=Path, default=None,
        help="llama: a probe of one live replica (router_compare.py --engine llama --probe-prefill --out F): "
        "sets --prefill-tokens-per-s, --prefill-s-per-token-sq, --decode-step-s and --sample-s from its fit.",
    )  # fmt: skip
    ap.add_argument(
        "--llama-contention", default=None, metavar="F1,F2,F3|PROBE.json",
        help="llama-server model: CPU contention between the replicas (off by default): each iteration takes "
        "Fk x its time with k replicas computing when it starts (simengine.contention; the last factor for "
        "more), or the prefill factors of a live probe (bench/llama_contention.py --out).",
    )  # fmt: skip
    llama_defaults = LlamaFleet()  # (the live bench's llama-server flags)
    ap.add_argument("--llama-cache-ram", type=int, default=llama_defaults.cache_ram_mib)
    ap.add_argument("--llama-ctx-size", type=int, default=llama_defaults.ctx_size)
    ap.add_argument("--llama-parallel", type=int, default=llama_defaults.parallel)
    ap.add_argument(
        "--engine-cache-blocks", type=int, default=None,
        help="sim: prefix-cache blocks per replica (router_compare.py --engine-cache-blocks; default 4,096).",
    )  # fmt: skip
    ap.add_argument(
        "--prompts", choices=("live", "trace"), default="live",
        help="The lengths and block hashes of the prompts the live replay sends (default; llama: lengths by "
        "--tokenizer, --tokens-per-word unused) or the trace's scaled lengths and block ids (the "
        "predictions recorded before session 10).",
    )  # fmt: skip
    ap.add_argument(
        "--tokenizer", type=Path, default=None,
        help="llama with --prompts live: the tiny model's tokenizer.json (default: its build folder).",
    )  # fmt: skip
    ap.add_argument(
        "--hash-block", type=int, default=16,
        help="llama with --prompts live: prefix-hash block in the gateway's tokens (16: what it hashes).",
    )  # fmt: skip
    ap.add_argument(
        "--send-jitter", type=int, default=1, metavar="N",
        help="Also run the first slice N - 1 more times with every arrival delayed by up to --jitter-ms "
        "(seeded): the prediction of each live ratio is then the median over the N runs.",
    )  # fmt: skip
    ap.add_argument("--jitter-ms", type=float, default=10.0, help="Largest arrival delay of --send-jitter.")
    ap.add_argument(
        "--sglang-model", choices=("sglang_cache_aware", "cache_aware"), default="sglang_cache_aware",
        help="With --from-live: what stands in for sglang-router:cache_aware (the model of its policy, "
        "bench/sglang_router_model.py; or our own cache_aware, the stand-in before session 10). The model's "
        "worker preference order is drawn anew for each --send-jitter draw (one draw: one router launch).",
    )  # fmt: skip
    ap.add_argument(
        "--vllm-model", choices=("none", "least_load"), default="none",
        help="With --from-live: what stands in for vllm-router:cache_aware. none: not modelled (session 10's "
        "text-prefix model missed). least_load: what 0.1.17 does on engines without vLLM's "
        "/v1/chat/completions/render (every decision 'missing_tokens', session 11): the least in-flight "
        "worker, ties to the first listed (the sglang model never matching, cache_threshold 1.0).",
    )  # fmt: skip
    ap.add_argument("--speed-noise", type=float, default=0.0, help="sim: replica speeds wander (sim.speed).")
    ap.add_argument("--speed-period", type=float, default=10.0, help="sim: seconds between speed redraws.")
    ap.add_argument("--speed-seed", type=int, default=1, help="sim: the speed schedule's seed.")
    ap.add_argument(
        "--path-ms", type=float, default=0.0,
        help="A fixed live-path latency added to every simulated TTFT (ms; PathTerm). Default 0: none.",
    )  # fmt: skip
    ap.add_argument(
        "--path-ms-per-1k", type=float, default=0.0, help="Path latency per 1,000 prompt tokens (ms)."
    )
    ap.add_argument(
        "--path-from", type=Path, default=None,
        help="The path term calibrated by bench/path_latency.py --out: its gateway cell nearest this run's "
        "arrival rate (fit and residuals; replaces --path-ms and --path-ms-per-1k).",
    )  # fmt: skip
    ap.add_argument(
        "--path-no-residuals", action="store_true", help="--path-from: the fit only, no residual draws."
    )
    ap.add_argument("--json", type=Path, default=None, help="Also write every slice's figures here.")
    ap.add_argument(
        "--requests-json", type=Path, default=None, help="Per-request results of the first slice."
    )
    ap.add_argument(
        "--from-live", type=Path, default=None,
        help="A router_compare.py result: predict that run (its trace, slice, rate, replicas, scale, engine"
        " speeds; llama: cache, tokens per word from its usage) and compare the fleetgate/other ratios.",
    )  # fmt: skip
    args = ap.parse_args()
    live: dict[str, Any] | None = None
    SIM_POLICY["sglang-router:cache_aware"] = args.sglang_model
    if args.vllm_model == "least_load":
        SIM_POLICY["vllm-router:cache_aware"] = "sglang_cache_aware@vllm_least_load"
    if args.from_live:
        live = json.loads(args.from_live.read_text())
        apply_live(args, live)
    if args.tokenizer is None:
        args.tokenizer = default_hf_model() / "tokenizer.json"
    if args.llama_calibration is not None:
        cal = json.loads(args.llama_calibration.read_text())
        fit = cal.get("engine_model") or cal
        args.prefill_tokens_per_s = fit["prefill_tokens_per_s"]
        args.prefill_s_per_token_sq = fit["prefill_s_per_token_sq"]
        args.decode_step_s = fit["decode_step_s"]
        args.sample_s = fit["sample_s"]
        print(
            f"llama calibration {args.llama_calibration}: {args.prefill_tokens_per_s:.0f} tokens/s, "
            f"attention {args.prefill_s_per_token_sq:.3e} s, step {args.decode_step_s * 1e3:.3f} ms, "
            f"sample {args.sample_s * 1e3:.3f} ms",
            file=sys.stderr,
        )
    slowdown = llama_contention(args.llama_contention) if args.llama_contention else ()
    if slowdown:
        if args.engine != "llama" or args.engine_model != "llama-server":
            raise SystemExit("--llama-contention: only with --engine llama --engine-model llama-server")
        print(f"llama contention: slowdown {', '.join(f'{f:.3f}' for f in slowdown)}", file=sys.stderr)
    starts = [int(x) for x in args.slices.split(",")]
    path = args.trace or default_traces_dir() / "mooncake" / "conversation_trace.jsonl"
    if args.workload:
        starts = [0]
        full = load_workload(args).requests
    else:
        full = load_trace(path, max_requests=max(starts) + args.requests).requests
    factor = 1.0
    llama_live: dict[int, Trace] = {}  # slice start -> the live llama prompts (tokenized once)
    if args.engine == "llama":
        factor = args.tokens_per_word
        fleet = LlamaFleet(
            parallel=args.llama_parallel, ctx_size=args.llama_ctx_size, cache_ram_mib=args.llama_cache_ram
        )
        block = max(1, round(512 * args.tokens_scale * factor))
        if args.prompts == "live":
            for st in starts:
                reqs = full[st : st + args.requests]
                llama_live[st] = llama_prompt_slice(
                    reqs, args.rate, args.tokens_scale, args.tokenizer, args.hash_block
                )
            block = int(np.median([r.block_tokens for t in llama_live.values() for r in t.requests]))
            if live is not None:
                print(f"live prompts: {prompt_check(live, llama_live[starts[0]])}", file=sys.stderr)
        perf = llama_engine(
            fleet, args.prefill_tokens_per_s, args.decode_step_s, block, args.prefill_s_per_token_sq
        )
        if args.engine_model == "llama-server":
            lparams = llama_server_params(fleet, args)
        facts = {} if args.no_engine_facts else {"cache_tokens_per_replica": fleet.cache_tokens()}
    else:
        perf = live_engine(args.time_scale, args.engine_cache_blocks)
        facts = (
            {}
            if args.no_engine_facts
            else engine_facts(args.time_scale, engine_profile(args.engine_cache_blocks))
        )
    params: dict[str, dict[str, Any]] = json.loads(args.params)
    params.setdefault("vllm_least_load", {"cache_threshold": 1.0})
    names = args.policies.split(",")
    out: dict[str, list[Figures]] = {}
    speed = SpeedVariation(noise=args.speed_noise, period_s=args.speed_period, seed=args.speed_seed)
    # With the live prompts the replicas also get the live gateway's names (router_compare.py: r0, r1, ...),
    # so fleetgate's affinity ring places every key where the gateway did; replica i's speed schedule is
    # keyed by the simulator's own name for it (replica-i), as router_compare.py's SpeedWander applies it.
    sim_ids = SimConfig().replica_ids
    ids = default_ids("r") if args.prompts == "live" else sim_ids
    speed_key = {ids(i): sim_ids(i) for i in range(args.replicas)}

    def make_engine(
        name: str, cpu: SharedCpu | None = None
    ) -> EngineModel | SpeedVaryingEngine | LlamaServerModel:
        if args.engine == "llama" and args.engine_model == "llama-server":
            if speed.active:
                raise SystemExit("--speed-noise: the llama-server model runs at its calibrated speed")
            return LlamaServerModel(lparams, cpu)
        engine = EngineModel(perf)
        return SpeedVaryingEngine(engine, speed, speed_key.get(name, name)) if speed.active else engine

    first: dict[str, Any] = {}

    def workload(st: int) -> Trace:
        reqs = full[st : st + args.requests]
        if st in llama_live:
            return llama_live[st]
        if args.engine == "sim" and args.prompts == "live":
            return live_prompt_slice(reqs, args.rate, args.tokens_scale)
        return scaled_slice(reqs, args.rate, args.tokens_scale, factor)

    path_term = PathTerm(args.path_ms / 1e3, args.path_ms_per_1k / 1e6)
    if args.path_from is not None:
        first_trace = workload(starts[0]).requests
        span = first_trace[-1].arrival_s - first_trace[0].arrival_s if len(first_trace) > 1 else 0.0
        arrival_rate = len(first_trace) / span if span > 0 else 0.0
        path_term, note = PathTerm.from_calibration(
            json.loads(args.path_from.read_text()), arrival_rate, not args.path_no_residuals
        )
        print(f"{note} (this run: {arrival_rate:.1f} req/s)", file=sys.stderr)

    def simulate(trace: Trace, label: str, draw: int = 0) -> tuple[Any, Figures]:
        name, _, tag = label.partition("@")
        p = {**(facts if name == "fleetgate" else {}), **params.get(tag or name, {})}
        if name == "sglang_cache_aware":  # a model of another router, not one of ours
            policy: Any = SglangCacheAwareModel.build({"order_seed": draw, **p})
        else:
            policy = build_policy(name, p)
        # one machine per simulated run: its replicas share the cores (--llama-contention)
        cpu = SharedCpu(slowdown) if slowdown else None
        sim = Simulator(
            trace,
            policy,
            DEFAULT_PROFILE,
            make_engine if cpu is None else lambda n: make_engine(n, cpu),
            SimConfig(replicas=args.replicas, seed=1, replica_ids=ids),
        )
        res = sim.run()
        if path_term.active:  # what the client measures: the simulated TTFT plus the live path
            res = replace(res, ttft_s=res.ttft_s + path_term.delays(trace, draw))
        tt = res.ttft_s[~np.isnan(res.ttft_s)]
        s = res.summary
        pct = np.percentile(tt, [95, 50, 99])
        return res, (
            float(pct[0]),
            s["cache_hit_rate"],
            s["max_over_mean_load"],
            float(pct[1]),
            float(pct[2]),
        )

    draws: dict[str, list[Figures]] = {}
    for st in starts:
        trace = workload(st)
        for label in names:
            res, fig = simulate(trace, label)
            out.setdefault(label, []).append(fig)
            if st == starts[0]:
                first[label] = res
                draws[label] = [fig]
                for j in range(1, args.send_jitter):
                    draws[label].append(simulate(send_jitter(trace, args.jitter_ms / 1000, j), label, j)[1])
    ref = out[names[0]]
    print(f"slices {starts} x {args.requests} requests, rate x{args.rate}, {args.replicas} replicas")
    print(
        "| policy | p95 / first (geo. mean) | per slice | hit / first | p95 s per slice | max/mean load "
        "| p50 / first | p99 / first |"
    )
    print("|---|---|---|---|---|---|---|---|")

    def geo(v: list[Figures], i: int) -> float:
        return float(np.exp(np.mean([np.log(a[i] / b[i]) for a, b in zip(v, ref, strict=True)])))

    for label, v in out.items():
        ratio = np.array([a[0] / b[0] for a, b in zip(v, ref, strict=True)])
        hit = np.array([a[1] / b[1] if b[1] else 1.0 for a, b in zip(v, ref, strict=True)])
        print(
            f"| {label} | {np.exp(np.log(ratio).mean()):.3f} | {' '.join(f'{x:.2f}' for x in ratio)} "
            f"| {hit.mean():.3f} | {' '.join(f'{a[0]:.2f}' for a in v)} | {max(a[2] for a in v):.2f} "
            f"| {geo(v, 3):.3f} | {geo(v, 4):.3f} |"
        )

    if args.send_jitter > 1:  # every policy over the draws: median (range) of the paired ratio to the first
        print(f"\n| policy | p50 / first ({args.send_jitter} draws) | p95 / first | p99 / first |")
        print("|---|---|---|---|")
        for label, v in draws.items():
            cells = []
            for i in (3, 0, 4):
                r = [a[i] / b[i] for a, b in zip(v, draws[names[0]], strict=True)]
                cells.append(f"{np.median(r):.3f} ({min(r):.3f}-{max(r):.3f})")
            print(f"| {label} | {' | '.join(cells)} |")

    if live is not None:
        print()
        print(compare_live(live, out, draws if args.send_jitter > 1 else None))

    if args.requests_json:
        dump_requests(args.requests_json, first, workload(starts[0]))
    if args.json:
        keys = ("p95_s", "hit_rate", "max_over_mean_load", "p50_s", "p99_s")
        rows = {k: [dict(zip(keys, v, strict=True)) for v in vals] for k, vals in out.items()}
        argv = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        doc = {"slices": starts, "args": argv, "trace_path": str(path), "policies": rows}
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
