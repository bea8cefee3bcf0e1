"""Authentication, tenant isolation and secrecy of API keys, against a real gateway process."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
from sec_env import KEYS, MODEL

WRONG = "sk-sec-wrong-0f0f0f0f"


def chat(url: str, key: str | None, *, n: int = 8, auth: str | None = None, **extra: Any) -> httpx.Response:
    headers = {}
    if auth is not None:
        headers["Authorization"] = auth
    elif key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": n, **extra}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=10)


def get(url: str, path: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(url + path, headers=headers, timeout=10)


def test_missing_or_wrong_key_rejected(gateway: Any) -> None:
    url = gateway.url
    cases = {
        "none": chat(url, None),
        "wrong": chat(url, WRONG),
        "bare scheme": chat(url, None, auth="Bearer"),
        "basic scheme": chat(url, None, auth=f"Basic {KEYS['gold']}"),
        "key with suffix": chat(url, KEYS["gold"] + "x"),
        "key prefix": chat(url, KEYS["gold"][:-1]),
        "hash instead of key": chat(url, "sha256:" + hashlib.sha256(KEYS["gold"].encode()).hexdigest()),
    }
    for name, r in cases.items():
        assert r.status_code == 401, (name, r.status_code, r.text)
        err = r.json()["error"]
        assert err["type"] == "authentication_error" or err["code"] in (
            "invalid_api_key",
            "missing_api_key",
        ), (
            name,
            err,
        )
        assert KEYS["gold"] not in r.text and WRONG not in r.text
    assert chat(url, KEYS["gold"]).status_code == 200  # the right key works
    for path in ("/admin/usage", "/admin/tenants", "/admin/capacity", "/admin/status"):
        assert get(url, path, None).status_code == 401, path
        assert get(url, path, WRONG).status_code == 401, path


def test_tenant_cannot_use_another_tenants_reservation(gateway: Any) -> None:
    url = gateway.url
    statuses = [chat(url, KEYS["free"]).status_code for _ in range(6)]
    assert statuses[0] == 200
    assert 429 in statuses, statuses  # free's tiny reservation is spent
    # neither naming the other tenant in the body/headers nor its name as session moves the charge
    r = chat(url, KEYS["free"], user="gold")
    assert r.status_code == 429, r.text
    r = httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"Authorization": f"Bearer {KEYS['free']}", "x-tenant": "gold", "x-fleetgate-tenant": "gold"},
        timeout=10,
    )
    assert r.status_code == 429, r.text
    # gold's reservation is untouched by free's exhaustion
    assert [chat(url, KEYS["gold"]).status_code for _ in range(5)] == [200] * 5
    usage = get(url, "/admin/usage", KEYS["admin"]).json()
    text = str(usage)
    assert "gold" in text and "free" in text


def test_tenant_cannot_read_other_usage_or_admin_api(gateway: Any) -> None:
    url = gateway.url
    assert chat(url, KEYS["gold"]).status_code == 200
    assert chat(url, KEYS["free"]).status_code == 200
    own = get(url, "/admin/usage", KEYS["free"])
    assert own.status_code == 200
    assert "gold" not in own.text  # a tenant's overview shows itself only
    assert get(url, "/admin/usage/free", KEYS["free"]).status_code == 200
    assert get(url, "/admin/usage/gold", KEYS["free"]).status_code == 403
    # a name that does not exist answers the same 403: names cannot be probed
    assert get(url, "/admin/usage/nobody", KEYS["free"]).status_code == 403
    for path in ("/admin/tenants", "/admin/capacity", "/admin/status"):
        r = get(url, path, KEYS["free"])
        assert r.status_code == 403, (path, r.status_code, r.text)
        assert "gold" not in r.text
    for path in ("/admin/tenants", "/admin/capacity", "/admin/status", "/admin/usage/gold"):
        assert get(url, path, KEYS["admin"]).status_code == 200, path


def test_keys_never_in_logs_or_metrics(gateway: Any) -> None:
    url = gateway.url
    for key in (*KEYS.values(), WRONG):
        chat(url, key)
        chat(url, key, stream=True)
        chat(url, key, model="no-such-model")  # an error path too
        get(url, "/admin/usage", key)
    metrics = get(url, "/metrics", KEYS["admin"]).text
    status = get(url, "/admin/status", KEYS["admin"]).text
    tenants = get(url, "/admin/tenants", KEYS["admin"]).text
    logs = gateway.output
    assert "request finished" in logs or logs  # the log is captured (not empty)
    for key in (*KEYS.values(), WRONG):
        for where, text in (("log", logs), ("metrics", metrics), ("status", status), ("tenants", tenants)):
            assert key not in text, f"{key} leaked into {where}"
            assert key[3:] not in text, f"part of {key} leaked into {where}"
