"""``fleetgate up`` end to end: replicas + gateway start, the openai SDK is served, SIGTERM leaves nothing."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from fleetgate.providers.local import free_port


def test_up_serves_and_stops_without_orphans(tools: Any, tmp_path: Path) -> None:
    port = free_port()
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


def test_up_restarts_a_crashed_replica_on_the_same_address(tools: Any, tmp_path: Path) -> None:
    """The prober notices a dead replica and the local provider restarts it where it was; traffic goes on."""
    port = free_port()
    up = tools.ServerProcess(
        [tools.PY, "-m", "fleetgate.cli", "up", "--replicas", "2", "--port", str(port)], name="fleetgate-up"
    )
    try:
        url = up.wait_ready(60)
        replicas = dict(ln.split()[1:3] for ln in up.lines if ln.startswith("replica "))
        victim = replicas["sim-0"]
        before = set(tools.children_of(up.pid))
        try:
            httpx.post(victim + "/admin/fault", json={"kind": "crash"}, timeout=2)
        except httpx.HTTPError:
            pass
        c = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=30, max_retries=0)
        deadline = time.monotonic() + 40
        restarted = False
        while time.monotonic() < deadline:
            # requests keep succeeding while one replica is down (retried on the other before any byte)
            c.chat.completions.create(
                model="fleetgate-sim", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            now = set(tools.children_of(up.pid))
            if now - before:
                try:
                    restarted = httpx.get(victim + "/health", timeout=1).status_code == 200
                except httpx.HTTPError:
                    restarted = False
                if restarted:
                    break
            time.sleep(0.5)
        assert restarted, f"replica sim-0 was not restarted at {victim}:\n{up.output[-2000:]}"
        up.signal(signal.SIGTERM)
        assert up.wait(20) == 0
    finally:
        up.kill()
