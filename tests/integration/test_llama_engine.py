"""Real llama.cpp ``llama-server`` replicas on the project's tiny random-weight model.

Two replicas run side by side on 127.0.0.1. Needs the binary and the model built by ``make llama-server
tiny-model`` (cached under ~/.cache/fleetgate; ``make test`` builds them): skipped with that instruction when
they are missing in a run by hand, a failure under ``make test`` (tests/real_engines.py).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import openai
import pytest
from engine_http import MODEL, chat, openai_client, scrape_metrics

from fleetgate.engines.llama import (
    EngineProcess,
    LlamaServerConfig,
    build_llama_command,
    descendant_pids,
    free_port,
    llama_command_template,
    start_llama_replicas,
)
from real_engines import need_llama


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EngineProcess]]:
    need_llama()
    logs = tmp_path_factory.mktemp("llama-logs")
    t0 = time.monotonic()
    procs = start_llama_replicas(2, log_dir=logs, parallel=2, ctx_size=4096, threads=1, timeout=60)
    startup = time.monotonic() - t0
    print(f"2 llama-server replicas healthy in {startup:.2f} s")
    try:
        yield procs
    finally:
        for p in procs:
            p.thaw()
            p.stop()


_client = partial(openai_client, timeout=30.0)
_metrics = partial(scrape_metrics, timeout=5)
_chat = partial(chat, timeout=30)


def test_command_line_has_metrics_slots_threads_and_local_host() -> None:
    cmd = build_llama_command(LlamaServerConfig(port=18123, parallel=3, ctx_size=6144, threads=1))
    flags = dict(zip(cmd[1::2], cmd[2::2], strict=False))
    assert "--metrics" in cmd and "--no-webui" in cmd
    assert cmd[cmd.index("--parallel") + 1] == "3"
    assert cmd[cmd.index("--ctx-size") + 1] == "6144"
    assert cmd[cmd.index("--threads") + 1] == "1"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--port") + 1] == "18123"
    assert flags["--model"].endswith(".gguf")
    assert "--ignore-eos" not in cmd
    assert "--ignore-eos" in build_llama_command(LlamaServerConfig(port=1, ignore_eos=True))


def test_two_replicas_healthy_and_serve_the_alias(replicas: list[EngineProcess]) -> None:
    assert len({p.port for p in replicas}) == 2
    for p in replicas:
        assert httpx.get(p.url + "/health", timeout=5).status_code == 200
        models = httpx.get(p.url + "/v1/models", timeout=5).json()
        assert MODEL in [m["id"] for m in models["data"]]


def test_chat_template_is_chatml(replicas: list[EngineProcess]) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    out = httpx.post(replicas[0].url + "/apply-template", json={"messages": messages}, timeout=10).json()
    assert out["prompt"] == (
        "<|im_start|>system\nbe brief<|im_end|>\n"
        "<|im_start|>user\nhello there<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chat_completion_exact_length_and_usage(replicas: list[EngineProcess]) -> None:
    resp = _client(replicas[0]).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me about the request queue in the gateway."}],
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 12
    assert resp.usage.prompt_tokens > 10
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 12
    assert resp.choices[0].finish_reason == "length"
    assert resp.choices[0].message.content


def test_prompt_tokens_match_the_tokenizer(replicas: list[EngineProcess]) -> None:
    prompt = httpx.post(
        replicas[0].url + "/apply-template",
        json={"messages": [{"role": "user", "content": "count these words please"}]},
        timeout=10,
    ).json()["prompt"]
    tokens = httpx.post(
        replicas[0].url + "/tokenize",
        json={"content": prompt, "add_special": False, "parse_special": True},
        timeout=10,
    ).json()["tokens"]
    out = _chat(replicas[0], "count these words please", 3)
    assert out["usage"]["prompt_tokens"] == len(tokens)
    assert tokens[0] == 1  # <|im_start|> is one special token, id 1 in the trained vocab


def test_greedy_output_is_deterministic(replicas: list[EngineProcess]) -> None:
    a = _chat(replicas[0], "same prompt, same answer", 16)["choices"][0]["message"]["content"]
    b = _chat(replicas[1], "same prompt, same answer", 16)["choices"][0]["message"]["content"]
    assert a == b


def test_stream_reports_usage(replicas: list[EngineProcess]) -> None:
    stream = _client(replicas[1]).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "stream a short answer"}],
        max_tokens=7,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    pieces: list[str] = []
    usage = None
    finish = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            finish = choice.finish_reason or finish
    assert usage is not None and usage.completion_tokens == 7
    assert finish == "length"
    assert 1 <= len(pieces) <= 7 and "".join(pieces)


def test_metrics_use_llamacpp_names_and_count_tokens(replicas: list[EngineProcess]) -> None:
    p = replicas[1]
    before = _metrics(p)
    for name in (
        "llamacpp:prompt_tokens_total",
        "llamacpp:tokens_predicted_total",
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:n_decode_total",
    ):
        assert name in before, name
    out = _chat(p, "metrics should count these tokens", 9)
    after = _metrics(p)
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 9
    assert after["llamacpp:prompt_tokens_total"] > before["llamacpp:prompt_tokens_total"]
    assert out["usage"]["completion_tokens"] == 9
    # The other replica is a separate process: its counters did not move.
    other = _metrics(replicas[0])
    assert other["llamacpp:tokens_predicted_total"] != after["llamacpp:tokens_predicted_total"]


def test_prefix_cache_reuses_a_shared_prompt(replicas: list[EngineProcess]) -> None:
    p = replicas[0]
    long_text = " ".join(
        f"section {i} of the shared system prompt about replicas and queues." for i in range(60)
    )
    first = _chat(p, long_text, 2)
    second = _chat(p, long_text, 2)
    assert first["usage"]["prompt_tokens"] == second["usage"]["prompt_tokens"] > 400
    # llama-server reports how many prompt tokens it actually evaluated: the repeat hits the slot's cache.
    assert first["timings"]["prompt_n"] > 400
    assert second["timings"]["prompt_n"] < 10
    cached = second["usage"].get("prompt_tokens_details", {}).get("cached_tokens")
    if cached is not None:
        assert cached >= second["usage"]["prompt_tokens"] - 10


def test_parallel_slots_run_concurrently(replicas: list[EngineProcess]) -> None:
    p = replicas[1]
    slots = httpx.get(p.url + "/slots", timeout=5).json()
    assert len(slots) == 2
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda i: _chat(p, f"concurrent request {i}", 20), range(4)))
    assert [o["usage"]["completion_tokens"] for o in outs] == [20, 20, 20, 20]


def test_sigstop_freezes_replica_and_restart_recovers_it(replicas: list[EngineProcess]) -> None:
    """A hung engine (SIGSTOP) keeps its port but answers nothing; kill + restart on the same address
    heals it.

    This is the engine half of the hang drill: the health prober (core/health.py) decides when to restart.
    """
    p = replicas[1]
    pid_before = p.pid
    p.freeze()
    try:
        with pytest.raises(httpx.TimeoutException):
            httpx.get(p.url + "/health", timeout=1.0)
        with pytest.raises(httpx.TimeoutException):
            httpx.post(
                p.url + "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
                timeout=1.0,
            )
        assert p.running()  # frozen, not dead: a liveness check on the process alone misses it
        # The other replica is unaffected.
        assert _chat(replicas[0], "still serving", 2)["usage"]["completion_tokens"] == 2
    finally:
        p.thaw()
    assert httpx.get(p.url + "/health", timeout=5).status_code == 200

    p.freeze()
    healed_in = p.restart(timeout=30)
    assert p.pid != pid_before
    assert p.url.endswith(f":{p.port}")
    assert httpx.get(p.url + "/health", timeout=5).status_code == 200
    assert _chat(p, "back again", 3)["usage"]["completion_tokens"] == 3
    print(f"restart of a frozen llama-server took {healed_in:.2f} s")


@pytest.mark.parametrize("entry", ["serve", "up"])
def test_gateway_in_front_of_two_llama_replicas(tmp_path: Path, entry: str) -> None:
    """`fleetgate serve` with `provider: {kind: local, command: <llama-server>}` (and `fleetgate up` with the
    deprecated `local.command`): the gateway starts two real replicas and proxies OpenAI requests (plain and
    streamed) to them; stopping the gateway stops the replicas."""
    need_llama()
    command = llama_command_template(parallel=2, ctx_size=2048)
    port = free_port()
    cfg_path = tmp_path / "fleet.json.yaml"
    if entry == "serve":  # the form docs/real-engines.md shows
        provider = {"kind": "local", "command": command, "replicas": 2, "ready_timeout_s": 60}
        deployment = {"model": MODEL, "engine": "llamacpp", "routing": {"policy": "round_robin"}}
        cfg: dict[str, object] = {
            "gateway": {"port": port},
            "deployments": [{**deployment, "provider": provider}],
        }
        argv = ["serve", "--config", str(cfg_path)]
    else:
        cfg = {
            "deployments": [{"model": MODEL, "routing": {"policy": "round_robin"}}],
            "local": {"command": command, "ready_timeout_s": 60},
        }
        argv = ["up", "--config", str(cfg_path), "--replicas", "2", "--port", str(port), "--model", MODEL]
    cfg_path.write_text(json.dumps(cfg))  # JSON is valid YAML
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        gw = subprocess.Popen(
            [sys.executable, "-m", "fleetgate.cli", *argv],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    engines: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while True:
            assert gw.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "gateway not ready: " + log.read_text()[-3000:]
            time.sleep(0.2)
        engines = descendant_pids(gw.pid, comm="llama-server")
        assert len(engines) == 2, engines

        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=30, max_retries=0)
        for n in (3, 5, 7, 9):
            resp = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"through the gateway {n}"}],
                max_tokens=n,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            assert resp.usage is not None and resp.usage.completion_tokens == n
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "stream through the gateway"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        usages = [c.usage for c in stream if c.usage is not None]
        assert usages and usages[-1].completion_tokens == 6
    finally:
        gw.send_signal(signal.SIGTERM)
        try:
            gw.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(gw.pid, signal.SIGKILL)
            gw.wait(timeout=10)
    time.sleep(0.5)
    for pid in engines:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_four_replicas_side_by_side(tmp_path: Path) -> None:
    need_llama()
    procs = start_llama_replicas(4, log_dir=tmp_path, parallel=1, ctx_size=1024, timeout=60)
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda p: _chat(p, f"replica on port {p.port}", 5), procs))
        assert [o["usage"]["completion_tokens"] for o in outs] == [5, 5, 5, 5]
        assert len({p.pid for p in procs}) == 4
        for p in procs:
            assert _metrics(p)["llamacpp:tokens_predicted_total"] == 5
    finally:
        for p in procs:
            p.stop()
    assert not any(p.running() for p in procs)
