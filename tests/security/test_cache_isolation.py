"""High #3 of issue 22: the prefix cache must not be a cross-tenant oracle.

Tenant ``free`` resent ``gold``'s secret prompt and got ``cached_tokens`` 912 and a 9 ms first token
(0 and 147 ms for a wrong guess). Now each tenant's prompts carry the tenant's own cache salt to the engine
(vLLM ``cache_salt``; the simulated engine honours it) and its own prefix hashes in routing, so a guess
never hits another tenant's entries; ``prefix_cache_scope: shared`` opts a deployment into sharing.
"""

from __future__ import annotations

from typing import Any

import httpx
from sec_env import KEYS, MODEL, tenants_config

SECRET = " ".join(f"gold-only-fact-{i} is confidential" for i in range(200))  # about 1,000 tokens


def _cached(url: str, tenant: str, content: str, *, salt: str | None = None) -> int:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1,
    }
    if salt is not None:
        body["cache_salt"] = salt
    r = httpx.post(
        url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEYS[tenant]}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def _config(engine_url: str, **deployment: Any) -> dict[str, Any]:
    cfg = tenants_config(engine_url)
    cfg["deployments"][0].update(deployment)
    for tenant in cfg["tenants"]:  # enough for these few long prompts, back to back
        tenant["reserved_mu_per_min"][MODEL] = 1.0e6
    cfg["deployments"][0]["capacity_mu_per_min"] = 1.0e7
    cfg["admission"]["burst_s"] = 60.0
    return cfg


def test_a_guess_never_hits_another_tenants_cache(engine: Any, start_gateway: Any) -> None:
    gw = start_gateway(_config(engine.url))
    assert _cached(gw.url, "gold", SECRET) == 0
    assert _cached(gw.url, "gold", SECRET) > 500  # a tenant's own cache still works
    assert _cached(gw.url, "free", SECRET) == 0  # the right guess looks exactly like a wrong one
    # a client cannot name another tenant's salt either: the gateway sets the field itself
    from fleetgate.gateway.parsing import tenant_cache_salt

    other = SECRET.replace("fact", "figure")
    assert _cached(gw.url, "gold", other) == 0
    assert _cached(gw.url, "free", other, salt=tenant_cache_salt("gold")) == 0


def test_shared_scope_is_an_explicit_opt_in(engine: Any, start_gateway: Any) -> None:
    gw = start_gateway(_config(engine.url, prefix_cache_scope="shared"))
    shared_prompt = SECRET.replace("gold-only", "common-system")
    assert _cached(gw.url, "gold", shared_prompt) == 0
    assert _cached(gw.url, "free", shared_prompt) > 500  # a shared system prompt hits across tenants
