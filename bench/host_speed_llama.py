"""How steady this host is: one fixed prefill sent back to back to a fresh llama-server, timed by the engine.

    .venv/bin/python bench/host_speed_llama.py [--seconds 150] [--words 760] [-- <extra llama-server flags>]

One llama-server replica of the tiny model (4 slots, 1 thread, 16,384 tokens of context), then requests of
``--words`` filler words (about 890 prompt tokens) and one output token, one at a time, each prompt new (no
prefix-cache hit), for ``--seconds``. Printed every 10 requests: the median, min and max of the engine's own
``timings.prompt_ms`` per prompt token. On a quiet dedicated core the medians stay within a few percent;
docs/benchmarks.md ("Online engine calibration on llama-server", session 17) records this VM's. Any
comparison of two timing windows on a host (a calibration sweep, then served traffic) inherits this spread.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from fleetgate.engines.calibration_probe import FILLER_WORDS as WORDS
from fleetgate.engines.llama import DEFAULT_ALIAS, LlamaServerConfig, free_port, llama_server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--words", type=int, default=760)
    ap.add_argument("extra", nargs="*", help="extra llama-server flags (after --), e.g. --cache-ram 0")
    args = ap.parse_args()
    cfg = LlamaServerConfig(
        port=free_port(), parallel=4, ctx_size=16384, threads=1, ignore_eos=True, extra_args=tuple(args.extra)
    )
    proc = llama_server(cfg, log_path=Path(tempfile.mkdtemp(prefix="host-speed-")) / "llama.log")
    proc.start()
    rng = random.Random(1)
    try:
        proc.wait_ready(timeout=60)
        with httpx.Client(timeout=60) as client:
            t0, k, window = time.monotonic(), 0, []
            medians: list[float] = []
            while time.monotonic() - t0 < args.seconds:
                k += 1
                prompt = f"Request {k} {rng.random()} :" + "".join(
                    " " + rng.choice(WORDS) for _ in range(args.words)
                )
                body = {
                    "model": DEFAULT_ALIAS,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": 1,
                    "temperature": 0,
                }
                timings = client.post(proc.url + "/v1/chat/completions", json=body).json()["timings"]
                window.append(timings["prompt_ms"] / timings["prompt_n"] * 1000.0)
                if len(window) == 10:
                    medians.append(statistics.median(window))
                    print(
                        f"{time.monotonic() - t0:6.1f} s: median {medians[-1]:.0f} us/token "
                        f"(min {min(window):.0f}, max {max(window):.0f})",
                        flush=True,
                    )
                    window = []
        if medians:
            print(
                f"10-request medians over {len(medians)} windows: {min(medians):.0f}-{max(medians):.0f} "
                f"us/token (max / min {max(medians) / min(medians):.2f})"
            )
    finally:
        proc.stop()


if __name__ == "__main__":
    main()
