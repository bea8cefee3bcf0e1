"""The simulated engine as a real process on 127.0.0.1, driven by the official ``openai`` SDK and httpx."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from fleetgate.core.tokenize import count_tokens

MODEL = "sim-test"


@dataclass
class Engine:
    proc: subprocess.Popen[str]
    url: str

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def client(self, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.v1, api_key="unused", max_retries=0, **kw)

    def stats(self) -> dict[str, Any]:
        return httpx.get(self.url + "/admin/stats").json()

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics").text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def fault(self, kind: str, value: float | None = None) -> None:
        body: dict[str, object] = {"kind": kind}
        if value is not None:
            body["value"] = value
        r = httpx.post(self.url + "/admin/fault", json=body)
        assert r.status_code == 200, r.text


def start_engine(*args: str, expect_ready: bool = True) -> Engine:
    cmd = [sys.executable, "-m", "fleetgate.cli", "engine", "sim", "--port", "0", "--model", MODEL, *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if not expect_ready:
        return Engine(proc, "")
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline() if proc.stdout else ""))
    reader.start()
    reader.join(timeout=20)
    if not line or not line[0]:
        proc.kill()
        raise AssertionError(f"engine did not start: {proc.stderr.read() if proc.stderr else ''}")
    m = re.fullmatch(r"engine ready on (http://127\.0\.0\.1:(\d+))\n", line[0])
    assert m, line[0]
    assert int(m.group(2)) > 0
    return Engine(proc, m.group(1))


def stop_engine(engine: Engine) -> None:
    if engine.proc.poll() is None:
        engine.proc.terminate()
        try:
            engine.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            engine.proc.kill()
            engine.proc.wait()
    for f in (engine.proc.stdout, engine.proc.stderr):
        if f is not None:
            f.close()


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    # 0.01: model time runs 100x faster than real time, so a 100-token answer takes a few ms.
    eng = start_engine("--time-scale", "0.01")
    try:
        yield eng
    finally:
        stop_engine(eng)


@pytest.fixture(autouse=True)
def _clear_fault(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "engine" in request.fixturenames:
        request.getfixturevalue("engine").fault("none")


PROMPT = "Tell me about rivers and the towns that grew along their banks over many centuries."


def test_chat_non_stream(engine: Engine) -> None:
    r = engine.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=7
    )
    assert r.object == "chat.completion"
    assert r.choices[0].finish_reason == "length"
    text = r.choices[0].message.content or ""
    assert r.usage is not None
    assert r.usage.completion_tokens == 7 == count_tokens(text)
    assert r.usage.prompt_tokens > 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7
    assert r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens is not None


def test_chat_stream_with_usage(engine: Engine) -> None:
    stream = engine.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT + " (stream)"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert count_tokens(text) == 12
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_usage_has_none(engine: Engine) -> None:
    stream = engine.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
    )
    chunks = list(stream)
    assert all(c.usage is None for c in chunks)


def test_completions_stream_and_non_stream(engine: Engine) -> None:
    client = engine.client()
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=9)
    assert r.object == "text_completion"
    assert r.usage is not None and r.usage.completion_tokens == 9 == count_tokens(r.choices[0].text)
    assert r.usage.prompt_tokens == count_tokens("Once upon a time")
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == r.choices[0].text  # deterministic filler for the same prompt
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 9


def test_stop_string_ends_output(engine: Engine) -> None:
    client = engine.client()
    full = client.completions.create(model=MODEL, prompt="stop test", max_tokens=40).choices[0].text
    words = full.split()
    stop_word = words[5]
    r = client.completions.create(model=MODEL, prompt="stop test", max_tokens=40, stop=[stop_word])
    assert r.choices[0].finish_reason == "stop"
    assert stop_word not in r.choices[0].text.split()
    assert full.startswith(r.choices[0].text)
    assert r.usage is not None and r.usage.completion_tokens < 40


def test_models_and_health(engine: Engine) -> None:
    models = engine.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(engine.url + "/health").status_code == 200


def test_prefix_cache_hit_visible_in_metrics(engine: Engine) -> None:
    long_prompt = "A shared system prompt that is long enough to fill several cache blocks. " * 8
    client = engine.client()
    hits_before = engine.metric("vllm:prefix_cache_hits_total")
    first = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": long_prompt}], max_tokens=2
    )
    second = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": long_prompt}], max_tokens=2
    )
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens_details is not None and second.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens or 0
    assert cached >= first.usage.prompt_tokens - 16
    assert engine.metric("vllm:prefix_cache_hits_total") - hits_before >= cached
    assert engine.metric("vllm:prefix_cache_queries_total") >= 2 * first.usage.prompt_tokens


def test_metrics_use_vllm_names(engine: Engine) -> None:
    text = httpx.get(engine.url + "/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:request_success_total",
        "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
        "fleetgate_sim_requests_cancelled_total",
    ):
        assert re.search(rf'^{re.escape(name)}\{{.*model_name="{MODEL}"', text, re.M), name
    assert engine.metric("vllm:generation_tokens_total") > 0


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[]", 400, None),
        (b'{"model": "sim-test"}', 400, "messages"),
        (b'{"model": "sim-test", "messages": [{"role": "user", "content": "x"}], "n": 0}', 400, "n"),
        (
            b'{"model": "sim-test", "messages": [{"role": "user", "content": "x"}], "logprobs": true, '
            b'"top_logprobs": 21}',
            400,
            "top_logprobs",
        ),
        (b'{"model": "sim-test", "messages": [{"role": "user", "content": "x"}], "n": 999}', 400, "n"),
        (
            b'{"model": "sim-test", "messages": [{"role": "user", "content": "x"}], '
            b'"tool_choice": "required"}',
            400,
            "tool_choice",
        ),
        (
            b'{"model": "sim-test", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
            400,
            "max_tokens",
        ),
        (b'{"model": "sim-test", "messages": [{"role": "user", "content": "x"}], "stop": 5}', 400, "stop"),
        (
            b'{"model": "sim-test", "messages": [{"role": "user", "content": "x"}], "priority": "hi"}',
            400,
            "priority",
        ),
        (
            b'{"model": "sim-test", "messages": [{"role": "user", "content": "x"}], "max_tokens": 99999}',
            400,
            None,
        ),
        (b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    ],
)
def test_bad_requests_get_openai_errors(engine: Engine, body: bytes, status: int, param: str | None) -> None:
    r = httpx.post(
        engine.v1 + "/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == status
    err = r.json()["error"]
    assert err["message"] and err["type"] in ("invalid_request_error",)
    if param is not None:
        assert err["param"] == param


def test_error_rate_fault(engine: Engine) -> None:
    client = engine.client()
    engine.fault("error_rate", 1.0)
    with pytest.raises(openai.InternalServerError) as info:
        client.completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert info.value.status_code == 500
    engine.fault("none")
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).choices[0].text
    assert engine.stats()["server"]["errors_injected"] >= 1


def test_hang_fault_keeps_health_and_resumes(engine: Engine) -> None:
    client = engine.client(timeout=0.5)
    engine.fault("hang")
    with pytest.raises(openai.APITimeoutError):
        client.completions.create(model=MODEL, prompt="hang", max_tokens=2)
    assert httpx.get(engine.url + "/health").status_code == 200
    result: list[str] = []
    t = threading.Thread(
        target=lambda: result.append(
            engine.client(timeout=10)
            .completions.create(model=MODEL, prompt="after", max_tokens=2)
            .choices[0]
            .text
        )
    )
    t.start()
    time.sleep(0.3)
    assert not result  # still hung
    engine.fault("none")
    t.join(timeout=5)
    assert result and count_tokens(result[0]) == 2


def test_slow_fault_stretches_time(engine: Engine) -> None:
    client = engine.client(timeout=20)
    engine.fault("slow", 30.0)
    t0 = time.monotonic()
    client.completions.create(model=MODEL, prompt="slow please", max_tokens=20)
    elapsed = time.monotonic() - t0
    # Model time of this request: prefill 4 ms + 20 decode iterations of >= 4.1 ms = > 0.08 s;
    # at time scale 0.01 x 30 that is >= 0.024 s of real time (real time can only be longer).
    assert elapsed >= 0.08 * 0.01 * 30
    assert engine.stats()["time_scale"] == pytest.approx(0.3)


def test_stall_fault_stops_stream_and_disconnect_cancels(engine: Engine) -> None:
    engine.fault("stall", 2)
    before = engine.stats()["server"]["requests_cancelled"]
    body = {"model": MODEL, "prompt": "stall", "max_tokens": 50, "stream": True}
    lines: list[str] = []
    with (
        httpx.Client(timeout=httpx.Timeout(5.0, read=0.5)) as http,
        http.stream("POST", engine.v1 + "/completions", json=body) as resp,
        pytest.raises(httpx.ReadTimeout),
    ):
        for line in resp.iter_lines():
            if line:
                lines.append(line)
    assert len(lines) == 2 and "[DONE]" not in "".join(lines)
    wait_for(lambda: engine.stats()["server"]["requests_cancelled"] == before + 1)


def test_client_disconnect_cancels_request_in_engine(engine: Engine) -> None:
    before = engine.metric("fleetgate_sim_requests_cancelled_total")
    # A long non-stream request that a short client timeout abandons.
    with pytest.raises(openai.APITimeoutError):
        engine.client(timeout=0.3).completions.create(model=MODEL, prompt="long", max_tokens=20000)
    wait_for(lambda: engine.metric("fleetgate_sim_requests_cancelled_total") == before + 1)
    # A stream closed after a few chunks.
    body = {"model": MODEL, "prompt": "long stream", "max_tokens": 20000, "stream": True}
    with httpx.Client(timeout=5) as http, http.stream("POST", engine.v1 + "/completions", json=body) as resp:
        got = 0
        for line in resp.iter_lines():
            got += bool(line)
            if got >= 3:
                break
    wait_for(lambda: engine.metric("fleetgate_sim_requests_cancelled_total") == before + 2)
    wait_for(lambda: engine.metric("vllm:num_requests_running") == 0)
    stats = engine.stats()
    assert stats["engine"]["requests_cancelled"] >= 2


def test_priority_field_orders_waiting_requests(tmp_path: Path) -> None:
    profile = tmp_path / "one-seq.yaml"
    profile.write_text("perf:\n  max_num_seqs: 1\n  kv_capacity_tokens: 65536\n")
    eng = start_engine("--time-scale", "0.1", "--profile", str(profile))
    try:
        done: list[str] = []

        def send(name: str, prio: int, tokens: int) -> None:
            engine_client = eng.client(timeout=30)
            engine_client.completions.create(
                model=MODEL, prompt=name, max_tokens=tokens, extra_body={"priority": prio}
            )
            done.append(name)

        # Freeze the engine so that all three queue up, in FCFS order blocker, low, high.
        eng.fault("hang")
        threads = []
        for i, (name, prio) in enumerate((("blocker", 0), ("low", 10), ("high", -10))):
            threads.append(threading.Thread(target=send, args=(name, prio, 200)))
            threads[-1].start()
            wait_for(lambda n=i + 1: eng.metric("vllm:num_requests_waiting") == n)  # type: ignore[misc]
        eng.fault("none")
        for t in threads:
            t.join(timeout=30)
        # One sequence at a time (each ~80 ms of real time), lowest priority value first.
        assert done == ["high", "blocker", "low"]
    finally:
        stop_engine(eng)


def test_crash_fault_exits_non_zero() -> None:
    eng = start_engine("--time-scale", "0")
    try:
        eng.fault("crash")
        assert eng.proc.wait(timeout=5) != 0
    finally:
        stop_engine(eng)


def test_crash_flag_at_start_exits_before_ready() -> None:
    eng = start_engine("--fault", "crash", expect_ready=False)
    try:
        assert eng.proc.wait(timeout=20) == 1
        assert eng.proc.stdout is not None and "engine ready" not in eng.proc.stdout.read()
    finally:
        stop_engine(eng)


def test_hang_flag_and_time_scale_zero_throughput() -> None:
    eng = start_engine("--time-scale", "0", "--fault", "hang")
    try:
        with pytest.raises(openai.APITimeoutError):
            eng.client(timeout=0.3).completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert httpx.get(eng.url + "/health").status_code == 200
        eng.fault("none")
        client = eng.client()
        for i in range(50):
            usage = client.completions.create(model=MODEL, prompt=f"p{i}", max_tokens=4).usage
            assert usage is not None and usage.completion_tokens == 4
    finally:
        stop_engine(eng)


def test_bad_fault_request_is_400(engine: Engine) -> None:
    r = httpx.post(engine.url + "/admin/fault", json={"kind": "melt"})
    assert r.status_code == 400 and "fault kind" in r.json()["error"]["message"]
    r = httpx.post(engine.url + "/admin/fault", json={"kind": "error_rate", "value": 3})
    assert r.status_code == 400
    assert httpx.get(engine.url + "/admin/fault").json() == {"kind": "none", "value": None}


def test_image_parts_are_charged_as_prompt_tokens(engine: Engine) -> None:
    client = engine.client()
    text_only = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": [{"type": "text", "text": "What is this?"}]}],
        max_tokens=2,
    )
    with_image = client.chat.completions.create(
        model=MODEL,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                ],
            }
        ],
        max_tokens=2,
    )
    assert text_only.usage is not None and with_image.usage is not None
    assert with_image.usage.prompt_tokens == text_only.usage.prompt_tokens + 576  # --image-tokens default
    details = with_image.usage.prompt_tokens_details
    assert details is not None and details.model_dump().get("image_tokens") == 576


def test_unknown_route_and_method_are_json_errors(engine: Engine) -> None:
    r = httpx.get(engine.url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"]
    r = httpx.get(engine.v1 + "/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
