"""The cheap ones of issue 22's low list: IPv6 transition addresses in the SSRF guard, a declared gzip body
that is not gzip, a stalled request body, and engine HTML served from the gateway's origin."""

from __future__ import annotations

import socket
import time
from typing import Any

import httpx
import pytest
from sec_env import KEYS, MODEL, tenants_config

from fleetgate.multimodal.fetch import AddressPolicy
from fleetgate.multimodal.image import ImageError


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of the cloud metadata address
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:c0a8:101::1",  # 6to4 of 192.168.1.1
        "::7f00:1",  # IPv4-compatible 127.0.0.1
        "::a00:1",  # IPv4-compatible 10.0.0.1
    ],
)
def test_ipv6_transition_addresses_are_judged_by_their_ipv4(address: str) -> None:
    with pytest.raises(ImageError):
        AddressPolicy.from_lists([], [], allow_private=False).check_address(address)


def test_gzip_declared_plain_body_is_a_400(gateway: Any) -> None:
    r = httpx.post(
        gateway.url + "/v1/chat/completions",
        content=b'{"model":"' + MODEL.encode() + b'","messages":[{"role":"user","content":"hi"}]}',
        headers={
            "Authorization": f"Bearer {KEYS['gold']}",
            "Content-Encoding": "gzip",
            "Content-Type": "application/json",
        },
        timeout=10,
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_responses_are_never_sniffed(gateway: Any) -> None:
    for r in (httpx.get(gateway.url + "/healthz"), httpx.get(gateway.url + "/no/such/path")):
        assert r.headers.get("x-content-type-options") == "nosniff"


def test_stalled_body_is_not_held(engine: Any, start_gateway: Any) -> None:
    gw = start_gateway(tenants_config(engine.url, client_body_timeout_s=1.0))
    port = int(gw.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEYS["gold"].encode() + b'\r\nContent-Length: 1000\r\n\r\n{"model":'
        )
        t0 = time.monotonic()
        answer = s.recv(4096)
        took = time.monotonic() - t0
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert took < 5.0
