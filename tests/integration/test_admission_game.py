"""The overshoot game of issue 22 (finding 4), end to end through `fleetgate serve` and the simulated engine.

A tenant with a 100 MU/min reservation sends 20 one-token requests (its output p90 becomes 1, so the gateway
estimates every later request at about one token), then 37 concurrent requests with ``max_tokens: 3000``
that run to 3,000 tokens. On 8468188 all 37 were admitted on a few MU of estimates and settled at about
1,100 MU. Now the MU settled for what was admitted in the run (shorter than one 60 s window) stays within
the limit plus one request.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from fleetgate.core.types import Usage
from fleetgate.core.units import DEFAULT_PROFILE

MODEL = "sim-model"
LIMIT = 100


def test_teach_a_short_p90_then_send_long_requests_concurrently(
    start_engine: Any, tools: Any, tmp_path: Path
) -> None:
    engine = start_engine(MODEL)  # 3,000 tokens take a few seconds: all 37 are in flight together
    cfg = {
        "gateway": {"host": "127.0.0.1", "port": 0},
        "deployments": [{"model": MODEL, "replicas": [{"name": "r0", "url": engine.url}]}],
        "tenants": [{"name": "acme", "api_keys": ["sk-acme"], "reserved_mu_per_min": {MODEL: LIMIT}}],
        "admission": {"admin_api_keys": ["sk-admin"], "deadline_s": 5},
    }
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    gw = tools.ServerProcess([tools.PY, "-m", "fleetgate.cli", "serve", "--config", str(path)], name="gw")
    try:
        url = gw.wait_ready()
        results = asyncio.run(game(url))
        admitted = [u for u in results if u is not None]
        usage = httpx.get(url + "/admin/usage/acme", headers={"Authorization": "Bearer sk-admin"}).json()
        settled = usage["usage"]["settled_mu"]
        one = max(DEFAULT_PROFILE.settle(u) for u in admitted)
        assert one > 25  # they really ran long
        assert settled <= LIMIT + one + 1.0, (settled, len(admitted))
        assert len(admitted) >= 1 and len(results) - len(admitted) > 30  # the rest was refused (429)
    finally:
        gw.kill()


async def game(url: str) -> list[Usage | None]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-acme", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "tell me a story"}]
    async with client:
        for _ in range(20):  # teach the gateway that this tenant's answers are one token long
            await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)  # type: ignore[arg-type]

        async def long() -> Usage | None:
            try:
                r = await client.chat.completions.create(
                    model=MODEL,
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=3000,
                    extra_body={"ignore_eos": True},
                )
            except openai.RateLimitError:
                return None
            assert r.usage is not None
            return Usage(r.usage.prompt_tokens, r.usage.completion_tokens)

        return list(await asyncio.gather(*(long() for _ in range(37))))
