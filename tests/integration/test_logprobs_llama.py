"""Integer completions ``logprobs`` reach a real engine: llama.cpp behind ``fleetgate serve``.

lm-evaluation-harness and other evaluators send ``logprobs: <int>`` on ``/v1/completions``; the gateway used
to reject it as "must be a boolean". Here it passes through to a real engine, which answers with logprobs
(llama.cpp in its own shape: per-token ``content`` entries; it ignores ``echo``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest
import yaml
from engine_http import MODEL

from fleetgate.engines.llama import start_llama_replicas
from real_engines import need_llama


@pytest.fixture(scope="module")
def gateway(tools: ModuleType) -> Iterator[str]:
    need_llama()
    logs = Path(tempfile.mkdtemp(prefix="llama-logprobs-"))
    procs = start_llama_replicas(1, log_dir=logs, parallel=2, ctx_size=2048, threads=1, timeout=60)
    gw = None
    try:
        cfg = {
            "gateway": {"host": "127.0.0.1", "port": 0, "health_checks": False},
            "deployments": [{"model": MODEL, "replicas": [{"name": "r0", "url": procs[0].url}]}],
        }
        path = logs / "gateway.yaml"
        path.write_text(yaml.safe_dump(cfg))
        gw = tools.ServerProcess([tools.PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], name="gw")
        yield gw.wait_ready()
    finally:
        if gw is not None:
            gw.kill()
        for p in procs:
            p.stop()


def test_integer_logprobs_reach_llama_server(gateway: str) -> None:
    body = {"model": MODEL, "prompt": [[5, 6, 7, 8]], "max_tokens": 2, "logprobs": 2, "temperature": 0}
    resp = httpx.post(gateway + "/v1/completions", json=body, timeout=30)
    assert resp.status_code == 200, resp.text
    entries = resp.json()["choices"][0]["logprobs"]["content"]
    assert len(entries) == 2 and all(len(e["top_logprobs"]) == 2 and e["logprob"] < 0 for e in entries)
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "logprobs": True,
        "top_logprobs": 3,
    }
    resp = httpx.post(gateway + "/v1/chat/completions", json=chat, timeout=30)
    assert resp.status_code == 200, resp.text
    assert all(len(e["top_logprobs"]) == 3 for e in resp.json()["choices"][0]["logprobs"]["content"])
