"""How much slower a llama-server replica computes when other replicas compute at the same time (CPU
contention on a shared machine): the live bench runs 3 single-thread replicas of the tiny model unpinned on
this VM's cores, while ``router_compare.py --probe-prefill`` calibrates one replica alone.

Starts 3 replicas with the live bench's flags (``LlamaFleet``), then for k = 1, 2, 3 (and back, to see
drift) keeps k of them busy for ``--seconds`` each, in two modes: *prefill* (each busy replica evaluates cold
prompts back to back, one at a time, 1 output token: ``timings.prompt_ms / prompt_n``) and *decode* (each
busy replica runs ``--decode-slots`` concurrent requests of 64 output tokens:
``timings.predicted_ms / predicted_n``, one iteration). The slowdown ``f(k)`` is the median time per token
with k busy over the median with 1 busy (per k the median of its blocks' medians: the machine drifts).
Also the CPU time each replica got (``/proc/PID/stat``) over each block and the load average.

    flock /tmp/fleetgate-live.lock .venv/bin/python bench/llama_contention.py --out F.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from live_procs import stop_all
from llama_fleet import LLAMA_MODEL, LlamaFleet, start_llama

from fleetgate.bench.prompts import PromptSynth

TICK = os.sysconf("SC_CLK_TCK")


def chat(url: str, content: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": LLAMA_MODEL, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": content}]}  # fmt: skip
    req = urllib.request.Request(
        f"{url}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        timings: dict[str, Any] = json.load(resp)["timings"]
    return timings


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def block(urls: list[str], pids: list[int], k: int, mode: str, seconds: float, words: int, slots: int,
          synth: PromptSynth, tag: str) -> dict[str, Any]:  # fmt: skip
    """Keep the first ``k`` replicas busy for ``seconds``; per-token times of every request finished."""
    stop = time.monotonic() + seconds
    samples: list[list[float]] = [[] for _ in range(k)]
    lock = threading.Lock()

    def worker(i: int, w: int) -> None:
        n = 0
        while time.monotonic() < stop:
            n += 1
            if mode == "prefill":
                text = synth.text((), words, unique_key=f"{tag}-{i}-{w}-{n}")
                t = chat(urls[i], f"cold{tag}x{i}x{w}x{n} " + text, 1)
                per = t["prompt_ms"] / 1000.0 / max(1, t["prompt_n"])
            else:
                text = synth.text((), 12, unique_key=f"{tag}-{i}-{w}-{n}")
                t = chat(urls[i], text, 64)
                per = t["predicted_ms"] / 1000.0 / max(1, t["predicted_n"])
            with lock:
                samples[i].append(per)

    cpu0 = [cpu_seconds(p) for p in pids]
    load0 = os.getloadavg()
    t0 = time.monotonic()
    threads = [
        threading.Thread(target=worker, args=(i, w))
        for i in range(k)
        for w in range(1 if mode == "prefill" else slots)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.monotonic() - t0
    cpu = [(cpu_seconds(p) - c) / wall for p, c in zip(pids, cpu0, strict=True)]
    flat = [x for s in samples for x in s]
    return {
        "k": k, "mode": mode, "wall_s": wall, "requests": len(flat),
        "median_s_per_token": statistics.median(flat) if flat else None,
        "per_replica_median": [statistics.median(s) if s else None for s in samples],
        "cpu_share": cpu, "load_before": load0, "load_after": os.getloadavg(),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--words", type=int, default=256, help="prefill: words per cold prompt")
    ap.add_argument("--decode-slots", type=int, default=2)
    ap.add_argument("--order", default="1,2,3,3,2,1")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--logdir", type=Path, default=Path("/tmp/llama_contention"))
    args = ap.parse_args()
    args.logdir.mkdir(parents=True, exist_ok=True)
    fleet = LlamaFleet()
    synth = PromptSynth(tokens_scale=1.0, source_block_tokens=16)
    procs = start_llama(fleet, 3, args.logdir, "cont")
    urls = [p.url or "" for p in procs]
    pids = [p.popen.pid for p in procs]
    blocks = []
    started = time.strftime("%H:%M:%S", time.gmtime())
    load_start = os.getloadavg()
    try:
        for w in range(3):  # warm-up: one request each
            chat(urls[w], "hello", 2)
        for j, k in enumerate(int(x) for x in args.order.split(",")):
            for mode in ("prefill", "decode"):
                b = block(urls, pids, k, mode, args.seconds, args.words, args.decode_slots, synth, f"b{j}")
                blocks.append(b)
                print(json.dumps(b), file=sys.stderr, flush=True)
    finally:
        stop_all(procs)
    factors: dict[str, dict[str, float]] = {}
    for mode in ("prefill", "decode"):
        # per k: the median of its blocks' medians; over k = 1's (the machine drifts between blocks)
        per_k = {
            k: statistics.median(b["median_s_per_token"] for b in blocks if b["mode"] == mode and b["k"] == k)
            for k in sorted({b["k"] for b in blocks})
        }
        factors[mode] = {str(k): v / per_k[1] for k, v in per_k.items()}
    doc = {
        "started_utc": started, "ended_utc": time.strftime("%H:%M:%S", time.gmtime()),
        "load_avg_start": load_start, "load_avg_end": os.getloadavg(), "cpus": os.cpu_count(),
        "threads_per_replica": fleet.threads, "pinned": False, "seconds": args.seconds, "words": args.words,
        "decode_slots": args.decode_slots, "blocks": blocks, "factors": factors,
    }  # fmt: skip
    args.out.write_text(json.dumps(doc, indent=2))
    print(json.dumps(factors, indent=2))


if __name__ == "__main__":
    main()
