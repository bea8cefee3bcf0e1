"""HTTP helpers shared by the real-engine tests (llama.cpp and vLLM CPU serving the tiny model)."""

from __future__ import annotations

import re
from typing import Any

import httpx
import openai

from fleetgate.engines.llama import EngineProcess

#: The served-model alias of the project's tiny random-weight model.
MODEL = "tiny-llama"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", re.MULTILINE)


def openai_client(proc: EngineProcess, timeout: float) -> openai.OpenAI:
    return openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", timeout=timeout, max_retries=0)


def scrape_metrics(proc: EngineProcess, timeout: float) -> dict[str, float]:
    """Sum of every sample per metric name (vLLM labels each by model and engine; llama.cpp has no labels)."""
    out: dict[str, float] = {}
    for m in SAMPLE.finditer(httpx.get(proc.url + "/metrics", timeout=timeout).text):
        out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def chat(
    proc: EngineProcess, content: str, max_tokens: int, *, timeout: float, **extra: object
) -> dict[str, Any]:
    """A greedy, exact-length (``ignore_eos``) chat completion; asserts HTTP 200 and returns the JSON body."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }
    resp = httpx.post(proc.url + "/v1/chat/completions", json=body, timeout=timeout)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()
    return result
