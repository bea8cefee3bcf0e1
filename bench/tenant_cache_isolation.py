"""Prefix-cache hit rate with tenant isolation (``prefix_cache_scope: tenant``) against a shared cache.

A live, small run: one simulated engine (its prefix cache honours ``cache_salt``) behind ``fleetgate serve``
with ``--tenants`` tenants. Every tenant runs ``--conversations`` multi-turn chats that start with the same
system prompt (about 600 tokens) and add a unique question and the engine's answer each turn. The hit rate
is the share of prompt tokens the engine reported as cached (``usage.prompt_tokens_details.cached_tokens``).

    .venv/bin/python bench/tenant_cache_isolation.py --tenants 4 --conversations 5 --turns 4
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

PY = sys.executable
SYSTEM = " ".join(f"rule {i}: answer politely and cite the handbook section {i}." for i in range(60))


def _start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        match = re.search(r"ready on (http://127\.0\.0\.1:\d+)", line)
        if match:
            threading.Thread(target=lambda: [None for _ in proc.stdout or []], daemon=True).start()
            return proc, match.group(1)
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError("did not start: " + " ".join(args))


def run(scope: str, tenants: int, conversations: int, turns: int) -> dict[str, Any]:
    engine, engine_url = _start([PY, "-m", "fleetgate.cli", "engine", "sim", "--port", "0", "--model", "m",
                                 "--time-scale", "0"])  # fmt: skip
    keys = {f"t{i}": f"sk-bench-{i}-{scope}" for i in range(tenants)}
    cfg = {
        "gateway": {"host": "127.0.0.1", "port": 0, "health_checks": False},
        "deployments": [
            {
                "model": "m",
                "capacity_mu_per_min": 1e9,
                "prefix_cache_scope": scope,
                "replicas": [{"name": "r0", "url": engine_url}],
            }
        ],
        "tenants": [{"name": n, "api_keys": [k], "reserved_mu_per_min": {"m": 1e8}} for n, k in keys.items()],
        "admission": {"burst_s": 60},
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gw.yaml"
        path.write_text(yaml.safe_dump(cfg))
        gateway, url = _start([PY, "-m", "fleetgate.cli", "serve", "--config", str(path)])
        prompt = cached = 0
        first_turn_prompt = first_turn_cached = 0
        try:
            with httpx.Client(timeout=30) as client:
                for c in range(conversations):
                    for name, key in keys.items():
                        messages = [{"role": "system", "content": SYSTEM}]
                        for t in range(turns):
                            messages.append({"role": "user", "content": f"{name} question {c}.{t}: how?"})
                            r = client.post(
                                url + "/v1/chat/completions",
                                headers={"Authorization": f"Bearer {key}"},
                                json={"model": "m", "messages": messages, "max_tokens": 16},
                            )
                            r.raise_for_status()
                            body = r.json()
                            usage = body["usage"]
                            hit = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                            prompt += usage["prompt_tokens"]
                            cached += hit
                            if t == 0:
                                first_turn_prompt += usage["prompt_tokens"]
                                first_turn_cached += hit
                            messages.append(
                                {"role": "assistant", "content": body["choices"][0]["message"]["content"]}
                            )
        finally:
            gateway.kill()
            engine.kill()
    return {
        "scope": scope,
        "requests": tenants * conversations * turns,
        "hit_rate": round(cached / prompt, 4),
        "first_turn_hit_rate": round(first_turn_cached / first_turn_prompt, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tenants", type=int, default=4)
    ap.add_argument("--conversations", type=int, default=5)
    ap.add_argument("--turns", type=int, default=4)
    a = ap.parse_args()
    rows = [run(scope, a.tenants, a.conversations, a.turns) for scope in ("shared", "tenant")]
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
