"""Prompt-token estimates against a real engine's count: the approximation and the model's own tokenizer.

One ``llama-server`` on the tiny model; English, code, German and Chinese prompts (``fleetgate.bench.
tokenizer_samples``). For each, the engine's ``usage.prompt_tokens`` is the truth; the gateway's estimate is
``parse_request``'s ``input_tokens`` without and with ``deployments[].tokenizer`` (the model's
``tokenizer.json``). The real tokenizer must match the engine exactly (its chat template is ChatML, as
rendered); the approximation's ratios are printed (``-s``) and recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from engine_http import MODEL

from fleetgate.bench.tokenizer_samples import SAMPLES
from fleetgate.config import DeploymentConfig
from fleetgate.core.openai import parse_request
from fleetgate.engines.llama import (
    EngineProcess,
    LlamaServerConfig,
    default_hf_model,
    free_port,
    llama_server,
)
from fleetgate.gateway.fleet import build_deployment
from fleetgate.hf_tokenizer import load_tokenizer
from real_engines import need_llama

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    need_llama()
    log = tmp_path_factory.mktemp("llama-tok") / "llama.log"
    proc = llama_server(LlamaServerConfig(port=free_port(), parallel=1, ctx_size=4096), log_path=log)
    proc.start()
    try:
        proc.wait_ready(timeout=60)
        yield proc
    finally:
        proc.stop()


def test_estimates_against_the_engines_prompt_tokens(replica: EngineProcess) -> None:
    tokenizer = load_tokenizer(default_hf_model())
    rows = {}
    with httpx.Client(base_url=replica.url, timeout=30) as client:
        for language, prompts in SAMPLES.items():
            actual = approx = real = 0
            for text in prompts:
                body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
                resp = client.post("/v1/chat/completions", json=body)
                assert resp.status_code == 200, resp.text
                engine = resp.json()["usage"]["prompt_tokens"]
                mine = parse_request(body, "chat", tokenizer=tokenizer).input_tokens
                assert mine == engine, (language, text, mine, engine)  # exact, prompt by prompt
                actual += engine
                approx += parse_request(body, "chat").input_tokens
                real += mine
            rows[language] = {
                "engine_tokens": actual,
                "approx_ratio": round(approx / actual, 3),
                "tokenizer_ratio": round(real / actual, 3),
            }
    print("\n" + json.dumps(rows, indent=1))
    assert all(r["tokenizer_ratio"] == 1.0 for r in rows.values())


def test_deployment_loads_its_tokenizer_and_keeps_the_default_block_size() -> None:
    need_llama()
    dep = build_deployment(DeploymentConfig(model=MODEL, tokenizer=str(default_hf_model())))
    assert dep.tokenizer is not None and dep.block_tokens == 16  # llama.cpp: no paged KV blocks
    vllm = build_deployment(DeploymentConfig(model=MODEL, engine="vllm", tokenizer=str(default_hf_model())))
    assert vllm.block_tokens == 16  # vLLM's default --block-size
    plain = build_deployment(DeploymentConfig(model=MODEL))
    assert plain.tokenizer is None
