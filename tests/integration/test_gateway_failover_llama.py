"""Mid-stream failover in a fleet with a real llama.cpp replica: llama-server (the tiny model, every answer
pinned to one "stamp" token per request by a +100 logit bias, end of generation off) beside two simulated
engines. The llama-server process is SIGKILLed while it streams and a simulated engine stalls; every stream
must still complete without an error event, and its text must be exactly a splice of what each engine
produces given everything before it (the stamp repeated on llama.cpp, the simulated engine's running text
on the others): nothing duplicated, nothing lost. Needs ``make real-engines`` (tests/real_engines.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from test_gateway_failover import SLOW, _metric, _read, _set_fault

from failover_text import splice
from fleetgate.core.tokenize import count_tokens, render_chat_prompt
from fleetgate.engines.llama import EngineProcess, LlamaServerConfig, free_port, llama_server
from real_engines import need_llama

MODEL = "sim-model"
TOKENS = 200
STREAMS = 30


@pytest.fixture
def llama() -> Iterator[EngineProcess]:
    need_llama()
    cfg = LlamaServerConfig(
        port=free_port(), alias=MODEL, parallel=4, ctx_size=8192, threads=1, ignore_eos=True
    )
    proc = llama_server(cfg)
    proc.start()
    proc.wait_ready(timeout=60)
    try:
        yield proc
    finally:
        proc.kill()


def _stamps(url: str, want: int) -> list[tuple[int, str]]:
    """Single-token ASCII words, none a repetition of a shorter string, all distinct (see the chaos suite)."""
    out: list[tuple[int, str]] = []
    for tid in range(3, 3072):
        piece = str(httpx.post(url + "/detokenize", json={"tokens": [tid]}).json().get("content", ""))
        primitive = piece not in (piece + piece)[1:-1]
        if piece.isascii() and piece.isalpha() and len(piece) >= 3 and primitive and (tid, piece) not in out:
            out.append((tid, piece))
        if len(out) == want:
            return out
    raise AssertionError("not enough stamp tokens")


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Story number {i}: tell me about rivers and towns."}]


def test_llama_replica_crash_and_sim_stall_mid_stream_are_continued(
    llama: EngineProcess, start_engine: Any, start_gateway: Any
) -> None:
    sims = [start_engine(MODEL, time_scale="1.0", wait=False) for _ in range(2)]
    for e in sims:
        e.wait_ready()
    stamps = _stamps(llama.url, STREAMS)
    bodies = [
        {
            "model": MODEL,
            "messages": _messages(i),
            "max_tokens": TOKENS,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logit_bias": {str(stamps[i][0]): 100},
            "seed": 1,
        }
        for i in range(STREAMS)
    ]
    # the prompt as each engine counts it (llama.cpp: its real tokenizer; the simulated engine: the shared)
    llama_prompt = [
        httpx.post(
            llama.url + "/v1/chat/completions", json={**b, "stream": False, "max_tokens": 1}, timeout=30
        ).json()["usage"]["prompt_tokens"]
        for b in bodies
    ]
    replicas = [llama, *sims]
    gateway = start_gateway(
        {MODEL: replicas},
        policy="round_robin",
        deployment={"failover": {"timeout_s": 2.0, "max_continuations": 3}},
        stream_idle_timeout_s=1.0,
        connect_timeout_s=0.5,
        # a request still held at the gateway when the stall starts may be sent to the stalled engine, which
        # then sends no headers at all: it is retried elsewhere after this (the default, 120 s, outlasts the
        # client's patience)
        first_byte_timeout_s=3.0,
    )

    async def run() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as client:

            async def one(body: dict[str, Any]) -> dict[str, Any]:
                r = await client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                return _read(r.content)

            # The simulated engines run SLOW times slower until every stream on them has sent its first
            # bytes through the gateway (its own first-token count per replica): at full speed a 200-token
            # stream lasts ~0.9 s, and on a loaded CI machine (load 10-16) the stall found most of them not
            # started yet or already ended (4 continuations of the 10 wanted).
            async with httpx.AsyncClient(timeout=10) as c:
                for e in sims:
                    await _set_fault(c, e.url, "slow", SLOW)
            tasks = [asyncio.create_task(one(b)) for b in bodies]
            each = STREAMS // len(replicas)  # round robin
            await _until_first_bytes(gateway.url, {"r1": each, "r2": each})
            await _wait_busy(llama.url)
            await _until_first_bytes(gateway.url, {"r0": 1})  # a llama.cpp stream is under way too
            llama.kill()  # SIGKILL mid-stream
            async with httpx.AsyncClient(timeout=10) as c:  # at once: the stall also ends sims[0]'s slowdown
                await _set_fault(c, sims[0].url, "stall", 0)
                await _set_fault(c, sims[1].url, "none")
            return await asyncio.gather(*tasks)

    t0 = time.monotonic()
    results = asyncio.run(run())
    wall = time.monotonic() - t0
    metrics = httpx.get(gateway.url + "/metrics").text
    continued = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("fleetgate_stream_continuations_total{") and 'outcome="ok"' in line
    )
    kinds: dict[str, int] = {}
    for i, got in enumerate(results):
        assert got["errors"] == [] and got["done"] and got["dones"] == 1, got
        assert len(got["ids"]) == 1 and got["roles"] == 1
        render = render_chat_prompt(_messages(i))
        salted = "\x001\x000\x00" + render  # the simulated engine's text for seed 1, choice 0
        path = splice(salted, stamps[i][1], got["text"], TOKENS)
        assert path is not None, (i, got["text"][:300])
        if path[0] == "sim":  # (llama-server stamps each chunk with the second it was sent in)
            assert len(got["created"]) == 1
        key = "+".join(path)
        kinds[key] = kinds.get(key, 0) + 1
        usage = got["usage"]
        assert usage["completion_tokens"] == TOKENS  # every generated token once
        assert usage["total_tokens"] == usage["prompt_tokens"] + TOKENS
        if path == ["sim"]:
            assert usage["prompt_tokens"] == count_tokens(render)
        elif path == ["llama"]:
            assert usage["prompt_tokens"] == llama_prompt[i]
        elif (
            path[-1] == "llama"
        ):  # the prompt once, as llama.cpp counts it, though it re-read the text before
            assert usage["prompt_tokens"] == llama_prompt[i], (path, usage)
    print(f"wall {wall:.2f} s, continuations {continued}, splices {kinds}")
    assert continued >= 10
    assert any(
        k.startswith("llama+") for k in kinds
    )  # streams of the killed llama.cpp replica went on elsewhere


async def _until_first_bytes(url: str, want: dict[str, int], timeout_s: float = 60.0) -> None:
    """Until the gateway at ``url`` has relayed the first bytes of ``want[name]`` streams from each replica
    (``fleetgate_time_to_first_token_seconds_count``, counted as the first bytes go to the client)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=10) as c:
        while True:
            text = (await c.get(url + "/metrics")).text
            got = {
                name: _metric(text, "fleetgate_time_to_first_token_seconds_count", replica=name)
                for name in want
            }
            if all(got[name] >= n for name, n in want.items()):
                return
            assert time.monotonic() < deadline, f"first bytes from the replicas: {got}, wanted {want}"
            await asyncio.sleep(0.05)


async def _wait_busy(url: str, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    async with httpx.AsyncClient(timeout=2) as c:
        while time.monotonic() < deadline:
            try:
                slots = orjson.loads((await c.get(url + "/slots")).content)
                if sum(1 for s in slots if s.get("is_processing")) >= 2:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            await asyncio.sleep(0.005)
