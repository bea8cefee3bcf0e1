"""Mid-stream failover under a crash storm (issue 21): how many interrupted streams complete transparently,
whether any token is duplicated or lost, and how long a continuation takes to resume.

A fleet of simulated engines (optionally plus the real llama.cpp replica, ``--llama``) behind one
``fleetgate serve``; ``--workers`` closed-loop clients stream chat answers of 100-250 tokens (each prompt
unique); every ``--crash-every`` seconds one engine is crashed (kill, restarted by the harness after 1 s) and
every third time one is stalled for 3 s instead. Every finished stream is checked token for token: its
text must be an exact splice of what the engines produce given everything before it
(tests/failover_text.py), its usage must count the prompt once and every token once. Interruptions and
times to resume come from the gateway's log (one line per continuation).

    PYTHONPATH=src .venv/bin/python bench/failover_storm.py --duration 120 [--llama]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "chaos"))

import chaos_ledger as cl  # noqa: E402

from failover_text import splice  # noqa: E402
from fleetgate.core.tokenize import count_tokens, render_chat_prompt  # noqa: E402


def _config(path: Path, replicas: list[tuple[str, str]], idle_s: float) -> Path:
    cfg = {
        "gateway": {
            "host": "127.0.0.1",
            "port": 0,
            "stream_idle_timeout_s": idle_s,
            "first_byte_timeout_s": 5.0,
            "connect_timeout_s": 0.5,
            "health_checks": True,
        },
        "deployments": [
            {
                "model": cl.MODEL,
                "routing": {"policy": "least_requests"},
                "failover": {"max_continuations": 3, "timeout_s": 3.0},
                "replicas": [{"name": n, "url": u} for n, u in replicas],
            }
        ],
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"text": "", "usage": None, "error": None, "done": False, "ids": set()}
    parts: list[str] = []
    try:
        async with session.post(url + "/v1/chat/completions", data=orjson.dumps(body)) as r:
            if r.status != 200:
                out["error"] = f"HTTP {r.status}"
                return out
            buf = b""
            async for chunk in r.content.iter_any():
                buf += chunk
                while b"\n\n" in buf:
                    raw, buf = buf.split(b"\n\n", 1)
                    data = raw[6:] if raw.startswith(b"data: ") else raw
                    if data == b"[DONE]":
                        out["done"] = True
                        continue
                    event = orjson.loads(data)
                    if "error" in event:
                        out["error"] = str(event["error"].get("message"))
                        continue
                    out["ids"].add(event.get("id"))
                    if event.get("usage"):
                        out["usage"] = event["usage"]
                    for choice in event.get("choices") or ():
                        parts.append((choice.get("delta") or {}).get("content") or "")
    except (aiohttp.ClientError, OSError) as exc:
        out["error"] = f"{exc.__class__.__name__}"
    out["text"] = "".join(parts)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="fg-storm-"))
    engines = [cl.Engine(i, args.time_scale) for i in range(args.engines)]
    llama: cl.LlamaReplica | None = None
    stamps: list[tuple[int, str]] = []
    replicas = [(f"e{e.index}", e.url) for e in engines]
    gateway: cl.Gateway | None = None
    try:
        if args.llama:
            llama = cl.LlamaReplica(log_path=work / "llama.log")
            replicas.append((cl.LLAMA, llama.url))
            stamps = await asyncio.to_thread(llama.stamp_table)
        gateway = cl.Gateway(_config(work / "gw.yaml", replicas, args.idle_s), "gateway")
        url = gateway.url
        results: list[dict[str, Any]] = []
        stop_at = time.monotonic() + args.duration
        counter = 0

        async def worker(session: aiohttp.ClientSession) -> None:
            nonlocal counter
            while time.monotonic() < stop_at:
                counter += 1
                i = counter
                messages = [{"role": "user", "content": f"storm request {i}-{rng.getrandbits(32):08x}"}]
                tokens = rng.randint(100, 250)
                body: dict[str, Any] = {
                    "model": cl.MODEL,
                    "messages": messages,
                    "max_tokens": tokens,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                stamp = stamps[i % len(stamps)] if stamps else None
                if stamp is not None:
                    body["logit_bias"] = {str(stamp[0]): cl.STAMP_BIAS}
                got = await _stream(session, url, body)
                got.update(messages=messages, tokens=tokens, stamp=stamp)
                results.append(got)

        async def storm() -> list[str]:
            log: list[str] = []
            n = 0
            while time.monotonic() + args.crash_every < stop_at:
                await asyncio.sleep(args.crash_every)
                n += 1
                victim = rng.choice(engines)
                if n % 3 == 0:
                    await cl.set_fault(victim, "stall", 0)
                    log.append(f"stall e{victim.index}")
                    await asyncio.sleep(3.0)
                    await cl.set_fault(victim, "none")
                elif victim.alive():
                    try:
                        await cl.set_fault(victim, "crash", 0)
                    except aiohttp.ClientError:
                        pass
                    log.append(f"crash e{victim.index}")
                    await cl.restart_later(victim, 1.0)
            return log

        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            gathered = await asyncio.gather(storm(), *(worker(session) for _ in range(args.workers)))
        events = gathered[0]
        broke, resume = cl.interruptions({"gw": gateway.proc.output})
        (work / "gateway.log").write_text(gateway.proc.output)
        ok = bad_text = bad_usage = errors = 0
        samples: list[str] = []
        for r in results:
            if r["error"] is not None or not r["done"]:
                errors += 1
                samples.append(str(r["error"] or "no [DONE]")[:200])
                continue
            ok += 1
            render = render_chat_prompt(r["messages"])
            stamp = r["stamp"][1] if r["stamp"] is not None else None
            if splice(render, stamp, r["text"], r["tokens"]) is None or len(r["ids"]) != 1:
                bad_text += 1
            usage = r["usage"] or {}
            if usage.get("completion_tokens") != r["tokens"] or (
                stamp is None and usage.get("prompt_tokens") != count_tokens(render)
            ):
                bad_usage += 1
        metrics = await _metrics(url)
        interrupted = metrics.get("continued", 0.0) + metrics.get("error", 0.0)
        ordered = sorted(resume)

        def q(p: float) -> float | None:
            return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else None

        return {
            "streams": len(results),
            "ok": ok,
            "errors": errors,
            "wrong_text": bad_text,
            "wrong_usage": bad_usage,
            "interrupted": interrupted,
            "continued": metrics.get("continued", 0.0),
            "transparent_share": metrics.get("continued", 0.0) / interrupted if interrupted else None,
            "broken_request_ids_logged": len(broke),
            "continuations": len(resume),
            "resume_p50_s": q(0.5),
            "resume_p99_s": q(0.99),
            "resume_max_s": ordered[-1] if ordered else None,
            "faults": events,
            "error_samples": samples[:10],
            "gateway_log": str(work / "gateway.log"),
        }
    finally:
        if gateway is not None:
            gateway.kill()
        for e in engines:
            e.kill()
        if llama is not None:
            llama.proc.stop()


async def _metrics(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("fleetgate_interrupted_streams_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = out.get(outcome, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--workers", type=int, default=24)
    ap.add_argument("--crash-every", type=float, default=4.0)
    ap.add_argument("--idle-s", type=float, default=1.0, help="gateway.stream_idle_timeout_s")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--llama", action="store_true", help="add the real llama.cpp replica")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
