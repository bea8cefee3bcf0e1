"""``fleetgate up`` end to end: replicas + gateway start, the openai SDK is served, SIGTERM leaves nothing."""

from __future__ import annotations

import re
import signal
import socket
import time
from pathlib import Path
from typing import Any

import openai
import yaml


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_up_serves_and_stops_without_orphans(tools: Any, tmp_path: Path) -> None:
    port = _free_port()
    config = tmp_path / "up.yaml"
    config.write_text(yaml.safe_dump({"local": {"engine_args": ["--time-scale", "0.1"]}}))
    up = tools.ServerProcess(
        [
            tools.PY,
            "-m",
            "fleetgate.cli",
            "up",
            "--replicas",
            "2",
            "--port",
            str(port),
            "--config",
            str(config),
        ],
        name="fleetgate-up",
    )
    try:
        url = up.wait_ready(60)
        assert url == f"http://127.0.0.1:{port}"
        replica_lines = [ln for ln in up.lines if ln.startswith("replica ")]
        assert len(replica_lines) == 2
        assert all(re.fullmatch(r"replica sim-\d+ http://127\.0\.0\.1:\d+", ln) for ln in replica_lines)
        up.wait_line(r"curl .*/v1/chat/completions")
        children = tools.children_of(up.pid)
        assert len(children) == 2

        c = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=30, max_retries=0)
        resp = c.chat.completions.create(
            model="fleetgate-sim", messages=[{"role": "user", "content": "Hello!"}], max_tokens=5
        )
        assert resp.choices[0].message.content and resp.usage is not None

        up.signal(signal.SIGTERM)
        assert up.wait(20) == 0
        deadline = time.monotonic() + 5
        while any(tools.pid_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(tools.pid_alive(pid) for pid in children), "replica processes outlived fleetgate up"
    finally:
        up.kill()
