"""Fault handling with real simulated engines: crash, stall, hang and error-rate faults behind the gateway."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest

from fleetgate.core.sse import parse_all

MODEL = "sim-model"
MESSAGES = [{"role": "user", "content": "Write one line about rivers."}]


def client(url: str, timeout: float = 30.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=timeout, max_retries=0)


def _client_requests_received(tools: Any, engines: list[Any]) -> int:
    """Requests the engines received, less the gateways' health probes (``X-Fleetgate-Probe``): a gateway
    probes a replica that showed no progress for ``probe_idle_s`` (5 s), which a slow run reaches."""
    stats = [tools.engine_stats(e)["server"] for e in engines]
    return sum(s["requests_received"] - s["probes_received"] for s in stats)


def test_replica_crash_requests_still_succeed(start_engine: Any, start_gateway: Any, tools: Any) -> None:
    engines = [start_engine(MODEL, wait=False), start_engine(MODEL, wait=False)]
    for engine in engines:
        engine.wait_ready()
    gateway = start_gateway({MODEL: engines}, policy="round_robin", connect_timeout_s=0.5, health_checks=True)
    c = client(gateway.url)
    assert c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3).choices
    try:
        tools.set_fault(engines[0], "crash")
    except httpx.HTTPError:
        pass  # the process may die before it answers
    engines[0].proc.wait(10)
    ok = 0
    for i in range(8):
        if i % 2:
            chunks = list(
                c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, stream=True)
            )
            assert chunks[-1].choices[0].finish_reason == "length"
        else:
            resp = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
            assert resp.usage is not None and resp.usage.completion_tokens == 4
        ok += 1
    assert ok == 8
    # every request reached the surviving replica
    assert tools.engine_stats(engines[1])["server"]["requests_received"] >= 8
    metrics = httpx.get(gateway.url + "/metrics").text
    assert 'fleetgate_upstream_retries_total{deployment="sim-model",replica="r0"}' in metrics


def test_stalled_stream_ends_with_clean_error_event(start_engine: Any, start_gateway: Any) -> None:
    engine = start_engine(MODEL, "--fault", "stall=2")
    gateway = start_gateway({MODEL: [engine]}, stream_idle_timeout_s=0.5)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 50, "stream": True}
    t0 = time.monotonic()
    r = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 200  # the first bytes were already sent when the stream stalled
    events = parse_all(r.content)
    assert len(events) >= 2
    assert "error" in events[-1].data and "stalled" in events[-1].data
    assert events[-1].data.startswith('{"error":')
    assert all("error" not in e.data for e in events[:-1])
    assert time.monotonic() - t0 < 5
    # the official SDK turns that event into an exception rather than a silent truncation
    with pytest.raises(openai.APIError, match="stalled"):
        for _ in client(gateway.url).chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=50, stream=True
        ):
            pass
    # non-streamed requests are unaffected by this fault
    assert client(gateway.url).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3).choices


def test_failures_before_first_byte_are_retried_elsewhere(start_engine: Any, start_gateway: Any) -> None:
    hung = start_engine(MODEL, "--fault", "hang", wait=False)
    failing = start_engine(MODEL, "--fault", "error_rate=1", wait=False)
    good = start_engine(MODEL, wait=False)
    for engine in (hung, failing, good):
        engine.wait_ready()
    gateway = start_gateway({MODEL: [hung, failing, good]}, first_byte_timeout_s=1.0, max_attempts=3)
    c = client(gateway.url)
    for _ in range(4):  # streams: a replica that sends no first byte within first_byte_timeout_s is skipped
        chunks = list(c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, stream=True))
        assert chunks[-1].choices[0].finish_reason == "length"
    gateway = start_gateway({MODEL: [failing, good]}, max_attempts=3)
    c = client(gateway.url)
    for _ in range(4):  # an HTTP 500 is an answer refused before any work: retried elsewhere
        resp = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
        assert resp.choices[0].message.content


def test_all_replicas_failing_gives_openai_error(start_engine: Any, start_gateway: Any) -> None:
    failing = start_engine(MODEL, "--fault", "error_rate=1")
    gateway = start_gateway({MODEL: [failing]}, max_attempts=2)
    r = httpx.post(
        gateway.url + "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES}, timeout=10
    )
    assert r.status_code == 502
    err = r.json()["error"]
    assert err["type"] == "server_error" and err["code"] == "upstream_error" and "r0" in err["message"]


def test_non_stream_answer_longer_than_first_byte_timeout_is_not_cut_nor_redone(
    start_engine: Any, start_gateway: Any, tools: Any
) -> None:
    """A non-streamed answer arrives whole at the end (as vLLM sends it), so it has its own total limit
    (``non_stream_timeout_s``), not ``first_byte_timeout_s``; and once an engine works on it, nothing is
    retried: a second try would only redo the work (issue 22, medium #10)."""
    engines = [start_engine(MODEL, time_scale="1.0", wait=False) for _ in range(2)]
    for e in engines:
        e.wait_ready()
    gateway = start_gateway({MODEL: engines}, first_byte_timeout_s=0.5, non_stream_timeout_s=30.0)
    t0 = time.monotonic()
    resp = client(gateway.url).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=150)
    took = time.monotonic() - t0
    assert resp.usage is not None and resp.usage.completion_tokens == 150
    assert took > 0.5  # longer than first_byte_timeout_s, and still answered
    assert _client_requests_received(tools, engines) == 1


def test_non_stream_total_timeout_and_body_limit_are_not_retried(
    start_engine: Any, start_gateway: Any, tools: Any
) -> None:
    """Past ``non_stream_timeout_s`` the client gets a 504 and no other replica repeats the work; a body over
    ``max_upstream_body_bytes`` is a 502 without buffering it (and without a retry either)."""
    engines = [start_engine(MODEL, time_scale="1.0", wait=False) for _ in range(2)]
    for e in engines:
        e.wait_ready()
    gateway = start_gateway({MODEL: engines}, non_stream_timeout_s=0.5, max_upstream_body_bytes=2000)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 150}
    r = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 504, r.text
    assert "non_stream_timeout_s" in r.json()["error"]["message"]
    assert _client_requests_received(tools, engines) == 1
    gateway = start_gateway({MODEL: engines}, max_upstream_body_bytes=2000)
    r = httpx.post(gateway.url + "/v1/chat/completions", json={**body, "max_tokens": 400}, timeout=30)
    assert r.status_code == 502, r.text
    assert "max_upstream_body_bytes" in r.json()["error"]["message"]
    assert _client_requests_received(tools, engines) == 2
    small = httpx.post(gateway.url + "/v1/chat/completions", json={**body, "max_tokens": 5}, timeout=30)
    assert small.status_code == 200
