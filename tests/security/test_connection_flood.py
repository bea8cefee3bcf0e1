"""High #2 of issue 22: a connection flood must not make the gateway kill its own replicas.

With the descriptor limit reached (320 idle unauthenticated connections under ``ulimit -n 300``), the
gateway's own probes failed with EMFILE, the monitor marked healthy replicas unhealthy (and, under
``fleetgate up``, restarted them, which failed the same way). Now client connections are capped below the
descriptor limit (the excess gets a 503 and is closed), so probes and upstream connections always find a
descriptor, and a probe that fails for a local lack of resources is no evidence against a replica.

The test floods the gateway, then restarts one engine on the same port (the gateway must open new upstream
connections to reach it again), and checks, over a connection opened before the flood, that both replicas
are healthy while the flood is still on.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from sec_env import KEYS, MODEL, PY, ServerProcess, tenants_config

from fleetgate.providers.local import free_port


def _engine(port: int) -> Any:
    proc = ServerProcess(
        [
            PY,
            "-m",
            "fleetgate.cli",
            "engine",
            "sim",
            "--port",
            str(port),
            "--model",
            MODEL,
            "--time-scale",
            "0.01",
        ],
        name=f"engine-{port}",
    )
    proc.wait_ready(30)
    return proc


def _health_states(conn: http.client.HTTPConnection) -> dict[str, str]:
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEYS['admin']}"})
    text = conn.getresponse().read().decode()
    states = {}
    for line in text.splitlines():
        if line.startswith("fleetgate_health_state{") and line.endswith(" 1.0"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1 : line.index("}")].split(","))
            states[labels["replica"].strip('"')] = labels["state"].strip('"')
    return states


def test_connection_flood_does_not_fail_the_replicas(engine: Any, tmp_path: Path) -> None:
    port2 = free_port()
    second = _engine(port2)
    cfg = tenants_config(engine.url)
    cfg["deployments"][0]["replicas"].append({"name": "r1", "url": f"http://127.0.0.1:{port2}"})
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    gw = ServerProcess(
        ["bash", "-c", f"ulimit -n 300 && exec {PY} -m fleetgate.cli serve --config {path}"], name="gateway"
    )
    flood: list[socket.socket] = []
    try:
        gw.wait_ready(30)
        port = int(gw.url.rsplit(":", 1)[1])
        admin = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # opened before the flood
        assert _health_states(admin) == {"r0": "healthy", "r1": "healthy"}

        def connect(n: int) -> None:  # idle, unauthenticated: they never send a byte
            for _ in range(n):
                with contextlib.suppress(OSError):
                    flood.append(socket.create_connection(("127.0.0.1", port), timeout=0.2))

        connect(320)
        second.kill()  # the replica restarts on the same port: reaching it again needs new descriptors
        connect(40)  # and the flood goes on: descriptors the old connections freed are taken again
        second = _engine(port2)
        connect(40)
        # probes: every 0.5 s while restarting, 2 successes to be healthy again; give them 9 s in all
        deadline = time.monotonic() + 9.0
        states = _health_states(admin)
        while states != {"r0": "healthy", "r1": "healthy"} and time.monotonic() < deadline:
            time.sleep(0.5)
            states = _health_states(admin)
        assert states == {"r0": "healthy", "r1": "healthy"}, (states, gw.output[-3000:])
        refused = 0
        for s in flood[-20:]:  # the last ones were over the limit: answered 503 and closed
            s.settimeout(0.5)
            with contextlib.suppress(OSError):
                if s.recv(4096).startswith(b"HTTP/1.1 503"):
                    refused += 1
        assert refused > 0, "connections over the limit were kept open"
        for s in flood:
            s.close()
        flood.clear()
        r = httpx.post(
            gw.url + "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers={"Authorization": f"Bearer {KEYS['gold']}"},
            timeout=10,
        )
        assert r.status_code == 200, r.text
    finally:
        for s in flood:
            s.close()
        gw.kill()
        second.kill()
