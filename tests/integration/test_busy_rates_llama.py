"""The busy-replica rate learner (``rate_learning: busy``) on a real llama-server with 2 slots.

Six streams at once against 2 slots: llama-server defers the rest (``llamacpp:requests_deferred``), so
requests wait for a slot and completions fall inside the service intervals. Fed as the gateway feeds it
(lifecycle times from this client, a /metrics scrape every 0.5 s through the gateway's scrape listener),
the learner replays the slots' admission and keeps nearly every request as a sample, at a rate near the
engine's own prefill counters; without the scrapes (session 8's rule) it drops most of them. Runs
bench/busy_rates_llama.py's phase code at a small size.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from pathlib import Path

from bench_module import load_bench
from fleetgate.core.engine_rates import BusyRateLearner, EngineRateLearner
from fleetgate.engines.llama import LlamaServerConfig, free_port, llama_server
from real_engines import need_llama

REQUESTS = 40


def test_busy_learner_keeps_slot_waits_as_samples_on_llama_server() -> None:
    need_llama()
    bench = load_bench("busy_rates_llama.py", "busy_rates_llama_for_test")
    cfg = LlamaServerConfig(
        port=free_port(), parallel=2, ctx_size=8192, threads=1, alias=bench.MODEL, ignore_eos=True
    )
    proc = llama_server(cfg, log_path=Path(tempfile.mkdtemp(prefix="busy-llama-")) / "llama.log")
    proc.start()
    try:
        proc.wait_ready(timeout=60)
        rng = random.Random(0)
        sizes = [rng.choice((40, 150, 400, 800)) for _ in range(REQUESTS)]
        scraped = BusyRateLearner()
        unscraped = BusyRateLearner()
        learners: list[EngineRateLearner] = [scraped]
        c0 = bench._counters(proc.url)
        asyncio.run(bench._phase(proc.url, learners, [unscraped], sizes, 6, "t", 0.5))
        c1 = bench._counters(proc.url)
    finally:
        proc.stop()
    engine_tps = (c1["llamacpp:prompt_tokens_total"] - c0["llamacpp:prompt_tokens_total"]) / (
        c1["llamacpp:prompt_seconds_total"] - c0["llamacpp:prompt_seconds_total"]
    )
    rates = scraped.rates("r0")
    old = unscraped.rates("r0")
    new_tps, old_tps = rates.timing_prefill_tokens_per_s, old.timing_prefill_tokens_per_s
    print(f"engine {engine_tps:.0f} tok/s; scraped {new_tps} ({rates.prefill_samples}); "
          f"unscraped {old_tps} ({old.prefill_samples})")  # fmt: skip
    # every request after the first scrape that showed the slots full is a sample (the first few, before it,
    # fall under the conservative rule)
    assert rates.prefill_samples >= REQUESTS - 8
    assert old.prefill_samples < rates.prefill_samples
    assert rates.timing_prefill_tokens_per_s is not None
    # a wide margin: the engine's share of 2 shared cores moves between requests
    assert 0.5 < rates.timing_prefill_tokens_per_s / engine_tps < 2.0
