"""The clients and tools users bring, end to end through ``fleetgate serve`` in front of the simulated engine.

Real clients where they exist (openai SDK, LangChain, litellm); lm-evaluation-harness is not installed (it
pulls torch and datasets): its completion request and response parsing are reproduced from lm-eval 0.4.13
(``lm_eval/models/openai_completions.py``), as said at that test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any, Literal

import httpx
import openai
import pytest
import yaml
from pydantic import BaseModel

MODEL = "sim-eco"
KEY = "sk-eco-test-key"
ORIGIN = "https://playground.example"
AUTH = {"Authorization": f"Bearer {KEY}"}
ADMIN_KEY = "sk-eco-admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time in a timezone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    },
}


class Step(BaseModel):
    explanation: str
    output: str


class MathAnswer(BaseModel):
    steps: list[Step]
    final_answer: str
    confidence: float
    kind: Literal["exact", "approximate"]


@pytest.fixture(scope="module")
def gateway(tools: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One simulated engine behind one gateway for the whole module; yields the gateway URL."""
    py = tools.PY
    engine = tools.ServerProcess(
        [py, "-m", "fleetgate.cli", "engine", "sim", "--port", "0", "--model", MODEL, "--time-scale", "0.01"],
        name="engine",
    )
    gw = None
    try:
        engine.wait_ready()
        cfg = {
            "gateway": {"host": "127.0.0.1", "port": 0, "cors_allowed_origins": [ORIGIN]},
            "deployments": [
                {
                    "model": MODEL,
                    "replicas": [{"name": "r0", "url": engine.url}],
                    "capacity_mu_per_min": 1_000_000,
                }
            ],
            # The whole replica reserved for the one tenant: MU are scaled to capacity_mu_per_min, and a tool
            # call settles ~0.25 % of it, so a 10 % reservation paced each request after the burst to ~1.5 s
            # (the clients here test compatibility, not admission: test_gateway_admission.py does that).
            "tenants": [{"name": "eco", "api_keys": [KEY], "reserved_mu_per_min": {MODEL: 1_000_000}}],
            "admission": {"burst_s": 10, "admin_api_keys": [ADMIN_KEY]},
        }
        path = tmp_path_factory.mktemp("eco") / "gateway.yaml"
        path.write_text(yaml.safe_dump(cfg))
        gw = tools.ServerProcess([py, "-m", "fleetgate.cli", "serve", "--config", str(path)], name="gateway")
        yield gw.wait_ready()
    finally:
        if gw is not None:
            gw.kill()
        engine.kill()


@pytest.fixture(scope="module")
def client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway + "/v1", api_key=KEY, max_retries=0, timeout=30)


# -- item 1: completions logprobs -------------------------------------------------------------------------


def test_completions_integer_logprobs_with_openai_sdk(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="The river runs", max_tokens=5, logprobs=2)
    lp = out.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert len(lp.tokens) == 5 == len(lp.token_logprobs)
    assert "".join(lp.tokens) == out.choices[0].text
    assert lp.top_logprobs is not None and all(len(top) == 2 for top in lp.top_logprobs)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x", max_tokens=1, logprobs=True)  # type: ignore[arg-type]
    assert "logprobs" in str(info.value)
    with pytest.raises(openai.BadRequestError, match="max allowed: 20"):  # the engine's bound, as vLLM's
        client.completions.create(model=MODEL, prompt="x", max_tokens=1, logprobs=546474)


def test_lm_eval_harness_loglikelihood_request(gateway: str) -> None:
    """lm-eval's ``local-completions`` loglikelihood request, reproduced (lm-eval itself is not installed):
    ``_create_payload(generate=False)`` and ``parse_logprobs`` of lm-eval 0.4.13, on token-id prompts
    (``tokenized_requests=True``, its default), two requests in one batch."""
    contexts = [[11, 22, 33, 44], [5, 6, 7]]
    continuations = [[55, 66], [8]]
    payload = {
        "model": MODEL,
        "prompt": [c + k for c, k in zip(contexts, continuations, strict=True)],
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    resp = httpx.post(gateway + "/v1/completions", json=payload, headers=AUTH, timeout=30)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert len(out["choices"]) == 2
    ordered = sorted(out["choices"], key=lambda c: c["index"])
    for choice, ctx, cont in zip(ordered, contexts, continuations, strict=True):
        ctxlen = len(ctx)
        token_logprobs = choice["logprobs"]["token_logprobs"]
        assert len(token_logprobs) == ctxlen + len(cont) + 1  # echoed prompt + the one generated token
        logprobs = token_logprobs[ctxlen:-1]
        top = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        assert len(logprobs) == len(cont) and sum(logprobs) < 0
        assert all(tok == max(t.values()) for tok, t in zip(logprobs, top, strict=True))  # is_greedy
    assert out["usage"]["prompt_tokens"] == sum(
        len(c) + len(k) for c, k in zip(contexts, continuations, strict=True)
    )


# -- item 7: what SDK demos need ---------------------------------------------------------------------------


def test_chat_completions_parse_with_openai_sdk(client: openai.OpenAI) -> None:
    done = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Solve 8x + 7 = -23 step by step."}],
        response_format=MathAnswer,
        max_tokens=500,
    )
    parsed = done.choices[0].message.parsed
    assert isinstance(parsed, MathAnswer) and parsed.steps and parsed.kind in ("exact", "approximate")
    plain = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "answer in JSON"}],
        response_format={"type": "json_object"},
        max_tokens=100,
    )
    assert isinstance(json.loads(plain.choices[0].message.content or ""), dict)


def test_tool_call_streamed_as_deltas(client: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[TIME_TOOL, WEATHER_TOOL], stream=True, max_tokens=200
    )
    name, args, pieces, finish = "", "", 0, None
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                assert call.function is not None
                name += call.function.name or ""
                if call.function.arguments:
                    args += call.function.arguments
                    pieces += 1
            finish = choice.finish_reason or finish
    assert name == "get_weather" and finish == "tool_calls" and pieces > 3  # several argument deltas
    assert set(json.loads(args)) == {"city", "unit"}
    full = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], max_tokens=200
    )
    call = full.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.arguments == args  # type: ignore[union-attr]
    # After the tool's answer, ``auto`` replies in text (agent loops end).
    messages += [
        {"role": "assistant", "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL], max_tokens=8)
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "length"


def test_n_logprobs_seed_and_list_prompt(client: openai.OpenAI) -> None:
    msgs: list[Any] = [{"role": "user", "content": "Tell me a story."}]
    out = client.chat.completions.create(
        model=MODEL, messages=msgs, n=3, max_tokens=6, logprobs=True, top_logprobs=3, seed=7
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert len({c.message.content for c in out.choices}) == 3  # different samples
    assert out.usage is not None and out.usage.completion_tokens == 18
    for c in out.choices:
        assert c.logprobs is not None and c.logprobs.content is not None and len(c.logprobs.content) == 6
        assert all(
            len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token for e in c.logprobs.content
        )
    again = client.chat.completions.create(model=MODEL, messages=msgs, n=3, max_tokens=6, seed=7)
    assert [c.message.content for c in again.choices] == [c.message.content for c in out.choices]
    other = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, seed=8)
    assert other.choices[0].message.content != out.choices[0].message.content
    # n > 1, streamed: every choice's chunks carry its index.
    texts = ["", ""]
    for chunk in client.chat.completions.create(model=MODEL, messages=msgs, n=2, max_tokens=4, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert all(texts) and texts[0] != texts[1]
    # Logprobs streamed: each content chunk carries its token's entry; completions echo the prompt first.
    stream = client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=4, stream=True, logprobs=True, top_logprobs=2
    )
    entries = [
        (c.delta.content, c.logprobs.content[0])
        for chunk in stream
        for c in chunk.choices
        if c.delta.content and c.logprobs and c.logprobs.content
    ]
    assert len(entries) == 4 and all(text == e.token and len(e.top_logprobs) == 2 for text, e in entries)
    pieces = list(
        client.completions.create(model=MODEL, prompt="a b", max_tokens=2, stream=True, echo=True, logprobs=1)
    )
    first = pieces[0].choices[0]
    assert (
        first.text == "a b"
        and first.logprobs is not None
        and first.logprobs.token_logprobs == [None, first.logprobs.token_logprobs[1]]
    )
    assert sum(1 for p in pieces if p.choices and p.choices[0].logprobs and p.choices[0].logprobs.tokens) == 3
    # One choice per prompt of a list prompt.
    many = client.completions.create(model=MODEL, prompt=["a b c", "d e f", "g h i"], max_tokens=3)
    assert sorted(c.index for c in many.choices) == [0, 1, 2]
    assert many.usage is not None and many.usage.completion_tokens == 9


# -- item 2: /health, /v1/models/{model}, /version ----------------------------------------------------------


def test_models_retrieve_version_and_health(client: openai.OpenAI, gateway: str) -> None:
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    assert [m.id for m in client.models.list()] == [MODEL]
    version = httpx.get(gateway + "/version", timeout=5).json()
    assert version["version"] and version["name"] == "fleetgate"


def test_guidellm_backend_check(gateway: str) -> None:
    """guidellm 0.8.1's ``OpenAIHTTPBackend.validate()``, reproduced: guidellm pulls torch and CUDA wheels,
    so it is not installed in the test environment (docs/benchmarking.md runs the real one). It sends
    ``GET {target}/health`` with the bearer key (when one is given) and calls ``raise_for_status()``;
    then lists ``/v1/models`` to pick the default model."""
    with httpx.Client(follow_redirects=True, verify=False, timeout=10) as http:
        http.request(method="GET", url=f"{gateway}/health", headers=AUTH).raise_for_status()
        http.request(method="GET", url=f"{gateway}/health").raise_for_status()  # no key: still healthy
        models = http.get(f"{gateway}/v1/models", headers=AUTH)
        models.raise_for_status()
        assert models.json()["data"][0]["id"] == MODEL


# -- item 6: HTTP details ---------------------------------------------------------------------------------


def test_models_need_a_key_when_tenants_are_configured(gateway: str) -> None:
    for path in ("/v1/models", f"/v1/models/{MODEL}"):
        resp = httpx.get(gateway + path, timeout=5)
        assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"
        assert httpx.get(gateway + path, headers=AUTH, timeout=5).status_code == 200


def test_method_not_allowed_carries_allow(gateway: str) -> None:
    resp = httpx.get(gateway + "/v1/chat/completions", timeout=5)
    assert resp.status_code == 405 and resp.headers["Allow"] == "POST"
    assert resp.json()["error"]["code"] == "method_not_allowed"
    resp = httpx.delete(gateway + "/v1/models", timeout=5)
    assert resp.status_code == 405 and "GET" in resp.headers["Allow"]


def test_cors_preflight_and_stream_headers(gateway: str) -> None:
    pre = httpx.options(
        gateway + "/v1/chat/completions",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
        timeout=5,
    )
    assert pre.status_code == 204
    assert pre.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    assert pre.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    with httpx.stream(
        "POST", gateway + "/v1/chat/completions", json=body, headers={**AUTH, "Origin": ORIGIN}, timeout=10
    ) as resp:
        assert resp.status_code == 200 and resp.headers["Access-Control-Allow-Origin"] == ORIGIN
        assert "x-request-id" in resp.headers["Access-Control-Expose-Headers"]
        assert b"[DONE]" in resp.read()
    other = httpx.get(gateway + "/health", headers={"Origin": "https://evil.example"}, timeout=5)
    assert "Access-Control-Allow-Origin" not in other.headers


def test_metrics_without_created_and_openmetrics(client: openai.OpenAI, gateway: str) -> None:
    client.completions.create(model=MODEL, prompt="count me", max_tokens=2)
    text = httpx.get(gateway + "/metrics", headers=ADMIN, timeout=5)  # with tenants: the admin key
    assert text.headers["Content-Type"].startswith("text/plain")
    assert "fleetgate_requests_total" in text.text and "_created" not in text.text
    om = httpx.get(
        gateway + "/metrics", headers={**ADMIN, "Accept": "application/openmetrics-text"}, timeout=5
    )
    assert om.headers["Content-Type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF") and "_created" not in om.text
    assert "fleetgate_requests_total" in om.text


# -- item 7 with the frameworks users bring -----------------------------------------------------------------


class Weather(BaseModel):
    """Weather report for a city."""

    city: str
    temperature_c: float
    conditions: Literal["sunny", "cloudy", "rain"]


def test_langchain_structured_output_and_bind_tools(gateway: str) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return f"sunny in {city}"

    llm = ChatOpenAI(model=MODEL, base_url=gateway + "/v1", api_key=KEY, max_retries=0, timeout=30)  # type: ignore[arg-type]
    report = llm.with_structured_output(Weather).invoke("What is the weather in Oslo?")
    assert isinstance(report, Weather) and report.conditions in ("sunny", "cloudy", "rain")
    with_tools = llm.bind_tools([get_weather])
    first = with_tools.invoke([HumanMessage("What is the weather in Oslo?")])
    assert first.tool_calls and first.tool_calls[0]["name"] == "get_weather"  # type: ignore[attr-defined]
    call = first.tool_calls[0]  # type: ignore[attr-defined]
    assert set(call["args"]) == {"city"}
    answer = with_tools.invoke(
        [
            HumanMessage("What is the weather in Oslo?"),
            first,
            ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]),
        ]
    )
    assert isinstance(answer.content, str) and answer.content and not answer.tool_calls  # type: ignore[attr-defined]


def test_litellm_function_calling(gateway: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of litellm's cost map
    import litellm

    resp = litellm.completion(
        model=f"openai/{MODEL}",
        api_base=gateway + "/v1",
        api_key=KEY,
        messages=[{"role": "user", "content": "What is the weather in Lima?"}],
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        max_tokens=200,
    )
    message = resp.choices[0].message
    assert resp.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls[0].function.name == "get_weather"
    args = json.loads(message.tool_calls[0].function.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")


def test_examples_sdk_demos_run(gateway: str, capsys: pytest.CaptureFixture[str]) -> None:
    """examples/sdk_demos.py (what README points `fleetgate up` users to) runs as written (in-process: the
    clients are already imported)."""
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "sdk_demos.py"
    runpy.run_path(str(script))["main"](gateway, KEY)
    out = capsys.readouterr().out
    assert "parse: name=" in out and "tool call: get_weather {'city':" in out
    assert "langchain tools: [{'name': 'get_weather'" in out
