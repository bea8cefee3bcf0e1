"""Medium #5 and #6 of issue 22: what the gateway shows to whom.

- ``GET /metrics`` names every tenant, its reservation, usage, rejections and latency: with tenants it
  needs the admin key (or a separate metrics-only listen address, for Prometheus).
- A request aiohttp cannot parse used to be logged with its raw bytes (bearer key and prompt) at error
  level with a traceback, and echoed back in a text/plain 400. Now: an OpenAI-shaped JSON 400 that echoes
  nothing, and one short log line without the bytes.
"""

from __future__ import annotations

import re
import socket
import time
from typing import Any

import httpx
from sec_env import KEYS, tenants_config

SECRET_PROMPT = "zebra-quartz-secret-prompt-4471"


def _metrics(url: str, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(url + "/metrics", headers=headers, timeout=10)


def test_metrics_need_the_admin_key(gateway: Any) -> None:
    url = gateway.url
    anonymous = _metrics(url)
    assert anonymous.status_code == 401, anonymous.text[:200]
    assert "gold" not in anonymous.text and "fleetgate_" not in anonymous.text
    assert anonymous.json()["error"]["type"] == "authentication_error"
    tenant = _metrics(url, KEYS["free"])
    assert tenant.status_code == 403 and tenant.json()["error"]["type"] == "permission_error"
    admin = _metrics(url, KEYS["admin"])
    assert admin.status_code == 200 and "fleetgate_requests_total" in admin.text


def test_metrics_only_port_for_prometheus(engine: Any, start_gateway: Any) -> None:
    gw = start_gateway(tenants_config(engine.url, metrics_port=0))
    deadline = time.monotonic() + 10
    found = None
    while found is None and time.monotonic() < deadline:
        found = re.search(r"metrics on (http://127\.0\.0\.1:\d+)/metrics", gw.output)
        time.sleep(0.05)
    assert found is not None, gw.output[-2000:]
    scraped = httpx.get(found.group(1) + "/metrics", timeout=10)
    assert scraped.status_code == 200 and "fleetgate_requests_total" in scraped.text
    assert httpx.get(found.group(1) + "/v1/models", timeout=10).status_code == 404  # metrics only
    assert _metrics(gw.url).status_code == 401  # the API port still needs the key


def _raw_request(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def test_malformed_requests_answer_json_and_log_no_secrets(gateway: Any) -> None:
    port = int(gateway.url.rsplit(":", 1)[1])
    key = KEYS["gold"]
    body = b'{"model":"sec-model","messages":[{"role":"user","content":"' + SECRET_PROMPT.encode() + b'"}]}'
    auth = f"Authorization: Bearer {key}".encode()
    junk = {
        "bare LF": b"POST /v1/chat/completions HTTP/1.1\nHost: x\n"
        + auth
        + b"\nContent-Length: "
        + str(len(body)).encode()
        + b"\n\n"
        + body,
        "bad header byte": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + auth
        + b"\r\nX-Bad: a\x01b "
        + SECRET_PROMPT.encode()
        + b"\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body,
        "too many headers": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + auth
        + b"\r\n"
        + b"".join(b"X-H%d: %s\r\n" % (i, SECRET_PROMPT.encode()) for i in range(300))
        + b"\r\n",
        "HTTP/1.0 junk": b"GET /healthz HTTP/1.0\r\nX: \x00" + key.encode() + b"\r\n\r\n",
    }
    before = len(gateway.lines)
    for name, data in junk.items():
        answer = _raw_request(port, data)
        assert re.match(rb"HTTP/1\.[01] 4\d\d ", answer), (name, answer[:200])
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert b"application/json" in head.lower(), (name, head)
        assert b'"error"' in payload and b"invalid_request_error" in payload, (name, payload[:300])
        assert key.encode() not in answer and SECRET_PROMPT.encode() not in answer, name
    time.sleep(0.3)  # let the log lines arrive
    logs = "\n".join(gateway.lines[before:])
    assert key not in logs and key[3:] not in logs, "the bearer key reached the log"
    assert SECRET_PROMPT not in logs, "the prompt reached the log"
    assert "Traceback" not in logs
    assert len([line for line in logs.splitlines() if line.strip()]) <= 2 * len(junk), logs[-3000:]
