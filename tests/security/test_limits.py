"""Request size limits and slow clients (slowloris) against a real gateway process."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
from sec_env import KEYS, MODEL


def ok_request(url: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"Authorization": f"Bearer {KEYS['gold']}"},
        timeout=10,
    )


def test_body_size_limit(gateway: Any) -> None:
    url = gateway.url
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 70_000}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {KEYS['gold']}"}
    r = httpx.post(url + "/v1/chat/completions", json=big, headers=headers, timeout=10)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit must hold while reading too
        yield b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "'
        for _ in range(20):
            yield b"y" * 8192
        yield b'"}]}'

    r = httpx.post(url + "/v1/chat/completions", content=chunks(), headers=headers, timeout=10)
    assert r.status_code == 413, r.text
    assert ok_request(url).status_code == 200


def test_header_size_limits(gateway: Any) -> None:
    url = gateway.url
    headers = {"Authorization": f"Bearer {KEYS['gold']}", "x-big": "a" * 100_000}
    with httpx.Client() as client:
        try:
            r = client.get(url + "/v1/models", headers=headers, timeout=10)
            assert 400 <= r.status_code < 500, r.status_code
        except httpx.RemoteProtocolError:
            pass  # closing the connection on an oversized header is also a rejection
    many = {f"x-h{i}": "v" for i in range(2000)}
    with httpx.Client() as client:
        try:
            r = client.get(url + "/v1/models", headers=many, timeout=10)
            assert r.status_code < 500, r.status_code
        except httpx.RemoteProtocolError:
            pass
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # a request line of 70 kB
        s.sendall(b"GET /v1/models?" + b"q" * 70_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            head = s.recv(64)
        except ConnectionResetError:
            head = b""
        assert head == b"" or head.startswith((b"HTTP/1.1 4", b"HTTP/1.0 4")), head
    assert ok_request(url).status_code == 200


def _slow_socket(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    return s


def test_slowloris_does_not_exhaust_gateway(gateway: Any) -> None:
    """Hundreds of clients trickling headers; normal requests keep being served promptly."""
    url = gateway.url
    port = int(url.rsplit(":", 1)[1])
    slow = [_slow_socket(port) for _ in range(300)]
    try:
        for round_ in range(4):
            for i, s in enumerate(slow):
                try:
                    s.sendall(f"x-slow-{round_}: {i}\r\n".encode())
                except OSError:
                    pass  # the gateway closed it: also fine
            t0 = time.monotonic()
            r = ok_request(url)
            assert r.status_code == 200
            assert time.monotonic() - t0 < 2.0
            time.sleep(0.3)
    finally:
        for s in slow:
            s.close()
    assert ok_request(url).status_code == 200


def test_stalled_header_connection_is_closed(engine: Any, start_gateway: Any) -> None:
    """A client that stops in the middle of its headers is disconnected after client_header_timeout_s."""
    from sec_env import tenants_config

    gw = start_gateway(tenants_config(engine.url, client_header_timeout_s=1.0))
    port = int(gw.url.rsplit(":", 1)[1])
    s = _slow_socket(port)
    s.settimeout(6.0)
    t0 = time.monotonic()
    try:
        data = s.recv(4096)  # b"" (closed) or an error response, then closed
    except TimeoutError:
        data = None
    finally:
        s.close()
    assert data is not None, "the stalled connection was still open after 6 s"
    assert time.monotonic() - t0 < 5.0
