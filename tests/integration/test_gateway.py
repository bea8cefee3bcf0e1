"""The gateway (``fleetgate serve``) before two real simulated-engine processes, driven by the openai SDK.

One fleet (two engines at real time, one gateway) is shared by the module; tests that need faults, crashes
or a shutdown start their own processes.
"""

from __future__ import annotations

import concurrent.futures
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from fleetgate.core.sse import parse_all
from fleetgate.core.tokenize import count_tokens, render_chat_prompt

MODEL = "sim-model"
MESSAGES = [{"role": "user", "content": "Tell me about the weather in Paris today, briefly."}]


@pytest.fixture(scope="module")
def fleet(tools: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two engines at real time (short requests are fast; long ones last) behind one gateway."""
    ServerProcess, PY = tools.ServerProcess, tools.PY
    engines = [
        ServerProcess(
            [
                PY,
                "-m",
                "fleetgate.cli",
                "engine",
                "sim",
                "--port",
                "0",
                "--model",
                MODEL,
                "--time-scale",
                "1",
            ],
            name=f"engine-{i}",
        )
        for i in range(2)
    ]
    procs = list(engines)
    try:
        for e in engines:
            e.wait_ready()
        cfg = {
            "gateway": {
                "host": "127.0.0.1",
                "port": 0,
                "max_body_bytes": 65536,
                "scrape_interval_s": 0.5,
                "health_checks": False,  # the tests count engine-side in-flight requests: no probes
            },
            "deployments": [
                {
                    "model": MODEL,
                    "routing": {"policy": "round_robin"},
                    "replicas": [{"name": f"r{i}", "url": e.url} for i, e in enumerate(engines)],
                }
            ],
        }
        path = tmp_path_factory.mktemp("gw") / "gateway.yaml"
        path.write_text(yaml.safe_dump(cfg))
        gateway = ServerProcess([PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], name="gateway")
        procs.append(gateway)
        url = gateway.wait_ready()
        yield {"url": url, "engines": engines, "gateway": gateway, "config": cfg, "tools": tools}
    finally:
        for p in procs:
            p.kill()


def client(url: str, timeout: float = 30.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=timeout, max_retries=0)


def test_models_lists_deployments(fleet: dict[str, Any]) -> None:
    models = client(fleet["url"]).models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_non_stream_passes_body_and_usage(fleet: dict[str, Any]) -> None:
    raw = client(fleet["url"]).chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, extra_headers={"x-request-id": "req-abc.123"}
    )
    assert raw.headers["x-request-id"] == "req-abc.123"
    resp = raw.parse()
    assert resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 8
    # the gateway and the engine count prompt tokens with the same shared tokenizer
    assert resp.usage.prompt_tokens == count_tokens(render_chat_prompt(MESSAGES))


def test_chat_stream_with_and_without_usage(fleet: dict[str, Any]) -> None:
    c = client(fleet["url"])
    chunks = list(
        c.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=6, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    # without include_usage the client sees no usage chunk (the gateway asked for one and keeps it)
    plain = list(c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, stream=True))
    assert all(ch.choices for ch in plain)
    assert all(ch.usage is None for ch in plain)
    assert "".join(ch.choices[0].delta.content or "" for ch in plain)


def test_completions_stream_and_non_stream(fleet: dict[str, Any]) -> None:
    c = client(fleet["url"])
    resp = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5)
    assert resp.choices[0].text and resp.usage is not None and resp.usage.completion_tokens == 5
    chunks = list(
        c.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


def test_stream_is_relayed_byte_for_byte(fleet: dict[str, Any]) -> None:
    """With include_usage set, the client receives exactly the engine's event stream."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    via_gateway = httpx.post(fleet["url"] + "/v1/chat/completions", json=body, timeout=10)
    direct = httpx.post(fleet["engines"][0].url + "/v1/chat/completions", json=body, timeout=10)
    assert via_gateway.status_code == direct.status_code == 200
    assert via_gateway.headers["content-type"].startswith("text/event-stream")
    ours = [e.data for e in parse_all(via_gateway.content)]
    theirs = [e.data for e in parse_all(direct.content)]
    assert len(ours) == len(theirs) and ours[-1] == theirs[-1] == "[DONE]"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"model": "sim-model"}', "messages"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (
            b'{"model": "sim-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}',
            "max_tokens",
        ),
        (
            b'{"model": "sim-model", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
            "stream",
        ),
        (b'{"model": "sim-model", "messages": [{"content": "x"}]}', "messages[0].role"),
    ],
)
def test_malformed_bodies_get_openai_400(fleet: dict[str, Any], body: bytes, param: str | None) -> None:
    r = httpx.post(
        fleet["url"] + "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param
    assert r.headers["x-request-id"]


def test_openai_sdk_sees_400_and_404(fleet: dict[str, Any]) -> None:
    c = client(fleet["url"])
    with pytest.raises(openai.NotFoundError) as nf:
        c.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert nf.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=0)
    assert "max_tokens" in str(bad.value)


def test_body_limit_path_and_method_errors(fleet: dict[str, Any]) -> None:
    big = b'{"model": "sim-model", "messages": [{"role": "user", "content": "' + b"x" * 70000 + b'"}]}'
    r = httpx.post(
        fleet["url"] + "/v1/chat/completions", content=big, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.get(fleet["url"] + "/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(fleet["url"] + "/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_health_ready_metrics(fleet: dict[str, Any]) -> None:
    url = fleet["url"]
    assert httpx.get(url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(url + "/readyz").status_code == 200
    c = client(url)
    for _ in range(4):
        list(c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, stream=True))
    time.sleep(1.2)  # at least one scrape of each engine
    text = httpx.get(url + "/metrics").text
    for replica in ("r0", "r1"):
        assert (
            f'fleetgate_requests_total{{deployment="{MODEL}",endpoint="chat",replica="{replica}",status="200"}}'
            in text
        )
        assert (
            f'fleetgate_time_to_first_token_seconds_count{{deployment="{MODEL}",replica="{replica}"}}' in text
        )
        assert f'fleetgate_inflight_requests{{deployment="{MODEL}",replica="{replica}"}} 0.0' in text
        assert f'fleetgate_engine_running{{deployment="{MODEL}",replica="{replica}"}}' in text
    assert "fleetgate_generation_tokens_total" in text
    assert "fleetgate_engine_prefix_cache_hit_rate{" in text  # engine counters were scraped and parsed


def _served(url: str) -> dict[str, float]:
    """Requests each replica answered with 200, from the gateway's own /metrics (probes not included)."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("fleetgate_requests_total{") and 'status="200"' in line:
            replica = line.split('replica="', 1)[1].split('"', 1)[0]
            out[replica] = out.get(replica, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_round_robin_uses_both_replicas(fleet: dict[str, Any]) -> None:
    before = _served(fleet["url"])
    c = client(fleet["url"])
    for _ in range(6):
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    after = _served(fleet["url"])
    assert {r: after[r] - before.get(r, 0.0) for r in ("r0", "r1")} == {"r0": 3.0, "r1": 3.0}


def test_client_disconnect_cancels_upstream(fleet: dict[str, Any]) -> None:
    engine_stats = fleet["tools"].engine_stats
    engines = fleet["engines"]
    before = sum(engine_stats(e)["server"]["requests_cancelled"] for e in engines)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 20000, "stream": True}
    with (
        httpx.Client(timeout=10) as http,
        http.stream("POST", fleet["url"] + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        for received, _ in enumerate(r.iter_bytes(), start=1):
            if received >= 3:
                break
    # the stream was left after a few chunks: the engine must see the request cancelled, and soon
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        stats = [engine_stats(e)["server"] for e in engines]
        if sum(s["requests_cancelled"] for s in stats) > before and all(s["in_flight"] == 0 for s in stats):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"engine never saw the cancellation: {stats}")


def test_sigterm_drains_in_flight_streams(fleet: dict[str, Any], tmp_path: Path) -> None:
    """SIGTERM: streams already running finish normally; new connections are refused; the process exits."""
    tools = fleet["tools"]
    engine_stats, set_fault = tools.engine_stats, tools.set_fault
    ServerProcess, PY = tools.ServerProcess, tools.PY
    cfg = dict(fleet["config"])
    cfg["gateway"] = {**cfg["gateway"], "shutdown_grace_s": 20}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    gateway = ServerProcess([PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], name="gateway-drain")
    try:
        url = gateway.wait_ready()
        c = client(url)
        started = concurrent.futures.ThreadPoolExecutor(4)

        def run_stream() -> tuple[str | None, int]:
            stream = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=300, stream=True)
            finish = None
            n = 0
            for chunk in stream:
                n += 1
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            return finish, n

        # A 300-token stream lasts about 1.3 s at full speed: on a loaded machine the first one could finish
        # before the third starts (CI, load 16: "streams never started"). So the engines run 20x slower until
        # all three are in flight (each then needs ~25 s more), and at full speed again before the SIGTERM.
        for e in fleet["engines"]:
            set_fault(e, "slow", 20)
        try:
            futures = [started.submit(run_stream) for _ in range(3)]
            deadline = time.monotonic() + 60
            while sum(engine_stats(e)["server"]["in_flight"] for e in fleet["engines"]) < 3:
                assert time.monotonic() < deadline, "streams never started"
                time.sleep(0.02)
        finally:
            for e in fleet["engines"]:
                set_fault(e, "none")
        t0 = time.monotonic()
        gateway.signal(signal.SIGTERM)
        refused = False  # the listener closes promptly (polled: the machine may be busy)
        while not refused and time.monotonic() - t0 < 5:
            try:
                httpx.get(url + "/healthz", timeout=2)
                time.sleep(0.05)
            except httpx.ConnectError:
                refused = True
        assert refused, "the gateway still accepted connections after SIGTERM"
        results = [f.result(timeout=30) for f in futures]
        assert all(finish == "length" for finish, _ in results), results
        assert all(n >= 300 for _, n in results)
        assert gateway.wait(15) == 0
        assert time.monotonic() - t0 < 15
        started.shutdown()
    finally:
        gateway.kill()


def test_engine_rejection_is_relayed_not_retried(fleet: dict[str, Any]) -> None:
    """An engine's own 400 (here: longer than its max_model_len) reaches the client as an OpenAI 400."""

    def retries() -> float:
        text = httpx.get(fleet["url"] + "/metrics").text
        return sum(
            float(ln.rsplit(" ", 1)[1])
            for ln in text.splitlines()
            if ln.startswith("fleetgate_upstream_retries_total")
        )

    before = retries()
    with pytest.raises(openai.BadRequestError) as bad:
        client(fleet["url"]).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=99999)
    assert bad.value.status_code == 400
    err = bad.value.body
    assert isinstance(err, dict) and err["type"] == "invalid_request_error" and err["message"]
    direct = httpx.post(
        fleet["engines"][0].url + "/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 99999},
    )
    assert direct.status_code == 400 and direct.json()["error"]["message"] == err["message"]
    assert retries() == before  # judged by the engine once, not retried on the other replica


def test_upstream_model_alias_and_two_deployments(fleet: dict[str, Any], tmp_path: Path) -> None:
    """Clients may use a public model name the engines do not know (``upstream_model``), per deployment."""
    tools = fleet["tools"]
    engines = fleet["engines"]
    cfg = {
        "gateway": {"host": "127.0.0.1", "port": 0},
        "deployments": [
            {"model": "public-name", "upstream_model": MODEL, "routing": {"policy": "least_requests"},
             "replicas": [{"name": "a", "url": engines[0].url}]},
            {"model": MODEL, "replicas": [{"name": "b", "url": engines[1].url}]},
        ],
    }  # fmt: skip
    path = tmp_path / "alias.yaml"
    path.write_text(yaml.safe_dump(cfg))
    gateway = tools.ServerProcess(
        [tools.PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], name="gw-alias"
    )
    try:
        url = gateway.wait_ready()
        c = client(url)
        assert sorted(m.id for m in c.models.list().data) == sorted(["public-name", MODEL])
        resp = c.chat.completions.create(model="public-name", messages=MESSAGES, max_tokens=2)
        assert resp.choices[0].message.content
        chunks = list(c.completions.create(model="public-name", prompt="hi", max_tokens=2, stream=True))
        assert chunks[-1].choices[0].finish_reason == "length"
        assert c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2).choices
    finally:
        gateway.kill()
