"""Rate-limit headers read by the real openai SDK: each header speaks its own unit, and a client that paces
itself by ``x-ratelimit-remaining-requests`` / ``-reset-requests`` is never refused.

The gateway runs with ``admission.deadline_s: 0`` so a request sent too early is a 429 at once (not a wait
in the admission queue), and the SDK with ``max_retries=0`` so every 429 reaches the test.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import openai
import yaml

MODEL = "sim-model"
BODY: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def parse_reset(text: str) -> float:
    """OpenAI's reset format (``20ms``, ``1.5s``, ``6m0s``) in seconds."""
    m = re.fullmatch(r"(?:(\d+)m)?(?:([\d.]+)s)?(?:(\d+)ms)?", text)
    assert m is not None and text, text
    minutes, seconds, ms = m.groups()
    return int(minutes or 0) * 60 + float(seconds or 0) + int(ms or 0) / 1000


def gateway(tools: Any, tmp_path: Path, engine_url: str) -> Any:
    cfg = {
        "gateway": {"host": "127.0.0.1", "port": 0},
        "deployments": [{"model": MODEL, "replicas": [{"name": "r0", "url": engine_url}]}],
        "tenants": [
            # 600 requests/min = 10/s with a burst of half a second (5 requests); no tokens-per-minute limit
            {
                "name": "paced",
                "api_keys": ["sk-paced"],
                "reserved_mu_per_min": {MODEL: 100000},
                "requests_per_minute": 600,
                "burst_s": 0.5,
            },
            {
                "name": "tpm",
                "api_keys": ["sk-tpm"],
                "reserved_mu_per_min": {MODEL: 100000},
                "tokens_per_minute": 50000,
            },
        ],
        "admission": {"deadline_s": 0},
    }
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = tools.ServerProcess([tools.PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], name="gw")
    return proc


def test_token_headers_carry_tokens_and_mu_only_mu(start_engine: Any, tools: Any, tmp_path: Path) -> None:
    engine = start_engine(MODEL)
    gw = gateway(tools, tmp_path, engine.url)
    try:
        url = gw.wait_ready()
        paced = openai.OpenAI(base_url=url + "/v1", api_key="sk-paced", max_retries=0, timeout=30)
        h = paced.chat.completions.with_raw_response.create(**BODY).headers
        # no tokens-per-minute limit: nothing claims to count tokens; model units only under -mu
        assert not [k for k in h if k.startswith("x-ratelimit-") and k.endswith("-tokens")], dict(h)
        assert float(h["x-ratelimit-limit-mu"]) == 100000
        assert 0 < float(h["x-ratelimit-remaining-mu"]) < 100000
        assert h["x-ratelimit-limit-requests"] == "600"
        tpm = openai.OpenAI(base_url=url + "/v1", api_key="sk-tpm", max_retries=0, timeout=30)
        raw = tpm.chat.completions.with_raw_response.create(**BODY)
        h, usage = raw.headers, raw.parse().usage
        assert usage is not None
        assert h["x-ratelimit-limit-tokens"] == "50000"
        charged = 50000 - int(h["x-ratelimit-remaining-tokens"])  # prompt + max_tokens, whole tokens
        assert charged == usage.prompt_tokens + BODY["max_tokens"]
        assert float(h["x-ratelimit-limit-mu"]) == 100000
    finally:
        gw.kill()


def test_a_client_pacing_by_the_headers_is_never_refused(
    start_engine: Any, tools: Any, tmp_path: Path
) -> None:
    engine = start_engine(MODEL)
    gw = gateway(tools, tmp_path, engine.url)
    try:
        url = gw.wait_ready()
        total, refused = asyncio.run(paced_client(url, requests=25))
        assert total == 25 and refused == 0
    finally:
        gw.kill()


async def paced_client(url: str, requests: int) -> tuple[int, int]:
    """Send as many requests at once as ``remaining-requests`` allows (at most 8), else wait ``reset``."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-paced", max_retries=0, timeout=30)
    sent = refused = 0
    remaining, reset = 1, 0.0
    deadline = time.monotonic() + 60
    async with client:
        while sent < requests and time.monotonic() < deadline:
            if remaining <= 0:
                await asyncio.sleep(reset)
                remaining = 1  # after the reset at least one passes
            batch = min(remaining, 8, requests - sent)

            async def one() -> tuple[int, float] | None:
                try:
                    h = (await client.chat.completions.with_raw_response.create(**BODY)).headers
                except openai.RateLimitError:
                    return None
                return int(h["x-ratelimit-remaining-requests"]), parse_reset(h["x-ratelimit-reset-requests"])

            results = await asyncio.gather(*(one() for _ in range(batch)))
            sent += batch
            refused += sum(1 for r in results if r is None)
            seen = [r for r in results if r is not None]
            if seen:  # the most cautious reading of the batch (the state only improves as meters drain)
                remaining, reset = min(r[0] for r in seen), max(r[1] for r in seen)
            else:
                remaining, reset = 0, 1.0
    return sent, refused
