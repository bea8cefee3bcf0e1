"""Simulated engine streaming cost, side by side for two source trees (e.g. before and after a change).

    python bench/simengine_stream.py OLD_SRC NEW_SRC [--rounds 2]

Starts `fleetgate engine sim --time-scale 0.001` from each tree (PYTHONPATH), streams one 4,000-token chat
answer five times and reports the best time and chunks per second; the trees alternate so machine noise
hits both alike.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

import httpx

BODY = {
    "model": "fleetgate-sim",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 4000,
    "stream": True,
    "ignore_eos": True,
}


def run(src: str) -> tuple[int, float]:
    env = {**os.environ, "PYTHONPATH": src}
    cmd = [sys.executable, "-m", "fleetgate.cli", "engine", "sim", "--port", "0", "--time-scale", "0.001"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        found = re.search(r"(http://\S+)", proc.stdout.readline())
        assert found, "engine did not start"
        url = found.group(1) + "/v1/chat/completions"
        with httpx.Client(timeout=60) as client:
            client.post(url, json={**BODY, "max_tokens": 10, "stream": False}).read()
            best, chunks = float("inf"), 0
            for _ in range(5):
                t0 = time.perf_counter()
                with client.stream("POST", url, json=BODY) as resp:
                    chunks = sum(1 for line in resp.iter_lines() if line.startswith("data: {"))
                best = min(best, time.perf_counter() - t0)
        return chunks, best
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("old_src")
    parser.add_argument("new_src")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for _ in range(args.rounds):
        for label, src in (("old", args.old_src), ("new", args.new_src)):
            chunks, best = run(src)
            print(f"{label} {chunks} chunks best {best * 1000:.1f} ms = {chunks / best:,.0f} chunks/s")


if __name__ == "__main__":
    main()
