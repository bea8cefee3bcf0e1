"""The prefill rate learned online on a busy llama-server replica, against the engine's own counters.

    FLEETGATE_REQUIRE_REAL_ENGINES=llama .venv/bin/python bench/busy_rates_llama.py --parallel 1,4
        [--requests 160] [--concurrency 6] [--threads 1]

One llama-server replica of the tiny model per ``--parallel`` value (fresh, 16,384 tokens of context, prompts
that share nothing but the chat template). Two phases against it, each feeding two learners at once
(``core.engine_rates``: the default ``EngineRateLearner`` and the ``BusyRateLearner`` of ``rate_learning:
busy``) with the times this client sees, exactly as the gateway's lifecycle would (dispatch when the request
is sent, first token at the first content chunk, completion with the engine's ``usage``; a scrape of its
/metrics every ``--scrape-interval`` s to both, as the gateway's scrape listener passes it: counters and the
queue gauges, requests processing and deferred), and a third, a ``BusyRateLearner`` given no scrapes (its
rule is then session 8's: an interval in which another request finished is no sample):

* **solo**: requests one at a time (the reference: every request ran alone, so both learners agree);
* **busy**: ``--concurrency`` streams at once, more than the slots (llama-server queues the rest), so no
  request runs alone.

Printed per phase: each learner's timing rate and samples (a learner with the engine's counters shows
their intervals as its samples where they were used: in the solo phase), and llama-server's
``prompt_tokens_total`` over ``prompt_seconds_total`` in that phase (its own prefill timer; with several
slots prefilling in one batch it counts the batch once per slot, so it reads low there), plus the engine's
CPU share. The gateway is not in the loop (the learner is sans-IO; the client's clock stands in for the
gateway's, on the same host).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from fleetgate.core.engine_rates import BusyRateLearner, EngineRateLearner
from fleetgate.core.openai import usage_from_mapping
from fleetgate.core.types import RequestInfo
from fleetgate.engines.calibration_probe import FILLER_WORDS as WORDS
from fleetgate.engines.calibration_probe import process_tree_cpu_seconds
from fleetgate.engines.dialects.llamacpp import LLAMACPP
from fleetgate.engines.llama import LlamaServerConfig, free_port, llama_server, missing_llama_parts
from fleetgate.engines.metrics import engine_signals, parse_prometheus_text
from fleetgate.gateway.engine_rates import counters_from

MODEL = "tiny-llama"


def _counters(url: str) -> dict[str, float]:
    """llama-server's counters (``llamacpp:*``, unlabelled), summed over label sets as the scraper does."""
    parsed = parse_prometheus_text(httpx.get(url + "/metrics", timeout=10).text)
    return {name: sum(v for _, v in rows) for name, rows in parsed.items() if name.startswith("llamacpp:")}


async def _one(
    client: httpx.AsyncClient, learners: list[EngineRateLearner], i: int, words: int, out: int, tag: str
) -> None:
    rng = random.Random(f"{tag}:{i}")
    prompt = f"Request {tag}-{i} :" + "".join(" " + rng.choice(WORDS) for _ in range(words))
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": out,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    clock = time.monotonic
    for attempt in range(4):  # (llama-server's HTTP threads sometimes drop a queued connection: retried)
        info = RequestInfo(request_id=f"{tag}-{i}-{attempt}", model=MODEL, stream=True)
        for learner in learners:
            learner.on_dispatch(info, "r0", clock())
        first = False
        usage = None
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
                resp.raise_for_status()
                async for line in resp.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk: dict[str, Any] = json.loads(line[6:])
                    if not first and chunk.get("choices"):
                        now = clock()
                        first = True
                        for learner in learners:
                            learner.on_first_token(info, "r0", now)
                    if chunk.get("usage"):
                        usage = usage_from_mapping(chunk["usage"])
        except httpx.TransportError:
            now = clock()
            for learner in learners:
                learner.on_complete(info, "r0", now, None, 0.0, False)
            if first:
                raise
            continue
        now = clock()
        for learner in learners:
            learner.on_complete(info, "r0", now, usage, 0.0, usage is not None)
        return
    raise RuntimeError(f"request {tag}-{i} failed 4 times")


async def _scrape(client: httpx.AsyncClient, learners: list[EngineRateLearner], interval_s: float) -> None:
    """The gateway's scrape listener: every ``interval_s``, the engine's counters and queue gauges (requests
    processing and deferred) to each learner (``gateway.engine_rates.EngineRateListener``)."""
    while True:
        try:
            text = (await client.get("/metrics")).text
            signals = engine_signals(parse_prometheus_text(text), LLAMACPP)
        except httpx.HTTPError:
            signals = None
        now = time.monotonic()
        for learner in learners:
            learner.on_counters("r0", now, counters_from(signals))
            if signals is None:
                learner.on_engine_load("r0", now, None, None, False)
            else:
                learner.on_engine_load("r0", now, signals.waiting, signals.running, signals.waiting_for_slots)
        await asyncio.sleep(interval_s)


async def _phase(
    url: str,
    learners: list[EngineRateLearner],
    unscraped: list[EngineRateLearner],
    sizes: list[int],
    concurrency: int,
    tag: str,
    scrape_s: float,
) -> None:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:

        async def run(i: int, words: int) -> None:
            async with sem:
                await _one(client, [*learners, *unscraped], i, words, 16, tag)

        scraper = asyncio.create_task(_scrape(client, learners, scrape_s))
        try:
            await asyncio.gather(*(run(i, w) for i, w in enumerate(sizes)))
        finally:
            scraper.cancel()


def _row(name: str, learner: EngineRateLearner) -> str:
    r = learner.rates("r0")
    tps = r.timing_prefill_tokens_per_s
    if not tps:
        return f"{name} none ({r.prefill_samples} samples)"
    return f"{name} {tps:.0f} tok/s ({r.prefill_samples} samples)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parallel", default="1,4", help="llama-server slots, one replica per value")
    ap.add_argument("--requests", type=int, default=160, help="requests per phase")
    ap.add_argument("--concurrency", type=int, default=6, help="streams at once in the busy phase")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scrape-interval", type=float, default=1.0, help="s between scrapes (gateway default)")
    args = ap.parse_args()
    missing = missing_llama_parts()
    if missing:
        raise SystemExit("llama-server not built: " + "; ".join(missing))
    rng = random.Random(args.seed)
    logs = Path(tempfile.mkdtemp(prefix="busy-rates-"))
    for parallel in (int(x) for x in args.parallel.split(",")):
        cfg = LlamaServerConfig(
            port=free_port(),
            parallel=parallel,
            ctx_size=16384,
            threads=args.threads,
            alias=MODEL,
            ignore_eos=True,
        )
        proc = llama_server(cfg, log_path=logs / f"llama-{parallel}.log")
        proc.start()
        try:
            proc.wait_ready(timeout=60)
            for phase, conc in (("solo", 1), ("busy", args.concurrency)):
                sizes = [rng.choice((40, 120, 300, 600, 1000)) for _ in range(args.requests)]
                learners: list[EngineRateLearner] = [EngineRateLearner(), BusyRateLearner()]
                unscraped = BusyRateLearner()  # no queue gauges: session 8's rule (any completion excludes)
                c0, cpu0, t0 = _counters(proc.url), process_tree_cpu_seconds(proc.pid), time.monotonic()
                tag = f"p{parallel}{phase}"
                asyncio.run(_phase(proc.url, learners, [unscraped], sizes, conc, tag, args.scrape_interval))
                c1, cpu1, wall = (
                    _counters(proc.url),
                    process_tree_cpu_seconds(proc.pid),
                    time.monotonic() - t0,
                )
                dtok = c1["llamacpp:prompt_tokens_total"] - c0["llamacpp:prompt_tokens_total"]
                dsec = c1["llamacpp:prompt_seconds_total"] - c0["llamacpp:prompt_seconds_total"]
                print(
                    f"parallel {parallel}, {phase} (concurrency {conc}, {len(sizes)} requests, {wall:.1f} s, "
                    f"engine CPU {(cpu1 - cpu0) / wall:.2f} of a core, load {os.getloadavg()[0]:.1f}): "
                    f"engine counters {dtok / dsec:.0f} tok/s; {_row('alone', learners[0])}; "
                    f"{_row('busy', learners[1])}; {_row('busy without the gauges', unscraped)}",
                    flush=True,
                )
        finally:
            proc.stop()


if __name__ == "__main__":
    main()
