"""Gateway fixes: slow-client timeouts, keep-alive connections across SIGTERM, the embedded fleet's cost
profile, health checks on by default (labelled by deployment), and the ``engine_priority`` switch."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fleetgate.config import DeploymentConfig, FleetgateConfig, GatewayConfig, load_config
from fleetgate.control import up_config
from fleetgate.core.units import DEFAULT_PROFILE
from fleetgate.gateway.fleet import build_deployment, sends_priority
from fleetgate.profiles import load_profile, replica_capacity_mu_per_min
from fleetgate.providers.base import ReplicaInfo
from fleetgate.runtime import SIM_COST_PROFILE, build_gateway

ROOT = Path(__file__).resolve().parents[2]
MODEL = "fix-model"


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body (status, lower-case headers, body)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed mid-response: {buf!r}")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed mid-body")
        body += chunk
    return status, headers, body


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(4096) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


# -- slow clients --------------------------------------------------------------------------------------------


def test_partial_request_head_is_closed_after_header_timeout(start_engine: Any, start_gateway: Any) -> None:
    engine = start_engine(MODEL)
    gw = start_gateway({MODEL: [engine]}, client_header_timeout_s=1.0, client_keepalive_timeout_s=30.0)
    sock = socket.create_connection(("127.0.0.1", _port(gw.url)), timeout=5)
    try:
        t0 = time.monotonic()
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        assert _closed_within(sock, 6.0), "a stalled request head kept its connection open"
        assert time.monotonic() - t0 < 4.0
    finally:
        sock.close()


def test_idle_keepalive_connection_is_closed(start_engine: Any, start_gateway: Any) -> None:
    engine = start_engine(MODEL)
    gw = start_gateway({MODEL: [engine]}, client_header_timeout_s=30.0, client_keepalive_timeout_s=1.0)
    sock = socket.create_connection(("127.0.0.1", _port(gw.url)), timeout=5)
    try:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status, headers, _ = _read_response(sock)
        assert status == 200 and headers.get("connection", "").lower() != "close"
        t0 = time.monotonic()
        assert _closed_within(sock, 6.0), "an idle keep-alive connection stayed open"
        assert time.monotonic() - t0 < 4.0
    finally:
        sock.close()


def test_complete_slow_head_is_served(start_engine: Any, start_gateway: Any) -> None:
    """The header deadline only closes heads that never complete: a head sent in pieces is served."""
    engine = start_engine(MODEL)
    gw = start_gateway({MODEL: [engine]}, client_header_timeout_s=2.0)
    sock = socket.create_connection(("127.0.0.1", _port(gw.url)), timeout=5)
    try:
        for part in (b"GET /v1/models HTTP/1.1\r\n", b"Host: 127.0.0.1\r\n", b"\r\n"):
            sock.sendall(part)
            time.sleep(0.3)
        status, _, body = _read_response(sock)
        assert status == 200 and MODEL.encode() in body
        # the connection is reusable, and a second slow head gets a fresh deadline
        for part in (b"GET /v1/models HTTP/1.1\r\n", b"Host: 127.0.0.1\r\n", b"\r\n"):
            sock.sendall(part)
            time.sleep(0.6)
        assert _read_response(sock)[0] == 200
    finally:
        sock.close()


# -- SIGTERM with keep-alive clients ------------------------------------------------------------------------


def test_sigterm_never_resets_keepalive_requests(start_engine: Any, start_gateway: Any) -> None:
    """Clients hammering keep-alive connections across SIGTERM: every request the gateway read gets a
    complete response; while draining responses say ``Connection: close``; the process exits cleanly."""
    engine = start_engine(MODEL)
    gw = start_gateway({MODEL: [engine]}, shutdown_linger_s=2.0, shutdown_grace_s=10.0)
    port = _port(gw.url)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s"
    )
    body = (
        b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}' % MODEL.encode()
    )
    payload = request % (len(body), body)
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    signalled = threading.Event()

    def client(idle_pause: float) -> None:
        out: dict[str, Any] = {"ok": 0, "ok_after_signal": 0, "closed_by_header": False, "error": None}
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            while True:
                after = signalled.is_set()
                sock.sendall(payload)
                try:
                    status, headers, _ = _read_response(sock)
                except (ConnectionError, OSError) as exc:
                    out["error"] = f"{type(exc).__name__}: {exc} (after signal: {after})"
                    break
                assert status == 200, status
                out["ok"] += 1
                out["ok_after_signal"] += int(after)
                if headers.get("connection", "").lower() == "close":
                    out["closed_by_header"] = True
                    out["eof"] = _closed_within(sock, 5.0)
                    break
                time.sleep(idle_pause)
        finally:
            sock.close()
            with lock:
                results.append(out)

    threads = [threading.Thread(target=client, args=(pause,)) for pause in (0.0, 0.0, 0.05, 0.3)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    gw.signal(signal.SIGTERM)
    signalled.set()
    for t in threads:
        t.join(20)
    assert len(results) == len(threads)
    for out in results:
        assert out["error"] is None, results
        assert out["closed_by_header"] and out["eof"], results
        assert out["ok"] > 0
    assert sum(out["ok_after_signal"] for out in results) > 0, results
    # the listener is closed: new connections are refused
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert gw.wait(15) == 0


def test_requests_cut_by_the_shutdown_grace_get_an_answer(start_engine: Any, start_gateway: Any) -> None:
    """Requests still waiting for their replica when the shutdown grace runs out get an explicit 503 with an
    OpenAI error body, never a connection closed without an answer, which a client cannot tell from a
    request that never arrived (the chaos run saw it: a request on the SIGSTOPped llama.cpp replica was cut
    at gateway A's SIGTERM, reset, retried on gateway B, and the ledger flagged it as run twice)."""
    engine = start_engine(MODEL)
    gw = start_gateway(
        {MODEL: [engine]}, shutdown_linger_s=0.0, shutdown_grace_s=0.5, first_byte_timeout_s=30.0
    )
    httpx.post(engine.url + "/admin/fault", json={"kind": "hang"}, timeout=5).raise_for_status()
    answers: dict[bool, Any] = {}

    def send(stream: bool) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        try:
            r = httpx.post(gw.url + "/v1/chat/completions", json={**body, "stream": stream}, timeout=20)
            answers[stream] = (r.status_code, r.json()["error"]["type"], r.headers.get("retry-after"))
        except httpx.HTTPError as exc:
            answers[stream] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=send, args=(stream,)) for stream in (False, True)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # both wait on the hung replica
    gw.signal(signal.SIGTERM)
    for t in threads:
        t.join(20)
    assert answers == {
        False: (503, "server_error", "1"),
        True: (503, "server_error", "1"),
    }, answers
    assert gw.wait(15) == 0
    assert '"status":503,"error_kind":"shutdown"' in gw.output, gw.output[-2000:]


# -- configuration ------------------------------------------------------------------------------------------


def test_up_uses_the_simulated_engine_cost_profile() -> None:
    infos = [ReplicaInfo(name=f"r{i}", url=f"http://127.0.0.1:{9000 + i}") for i in range(2)]
    cfg = up_config(FleetgateConfig(), "fleetgate-sim", len(infos))
    deployment = cfg.deployment("fleetgate-sim")
    assert deployment is not None and deployment.cost_profile == SIM_COST_PROFILE
    assert build_deployment(deployment).profile.name == "fleetgate-sim"
    # an explicit profile is kept
    own = FleetgateConfig.model_validate(
        {"deployments": [{"model": "fleetgate-sim", "cost_profile": "llama2-70b-a100"}]}
    )
    kept = up_config(own, "fleetgate-sim", len(infos)).deployment("fleetgate-sim")
    assert kept is not None and kept.cost_profile == "llama2-70b-a100"
    # the simulated profile is far cheaper than the generic default for the same request
    sim = load_profile(SIM_COST_PROFILE)
    assert sim.estimate(200, 256) * 5 < DEFAULT_PROFILE.estimate(200, 256)


def test_example_tenants_reserve_half_the_embedded_fleet() -> None:
    cfg = load_config(ROOT / "examples" / "tenants.yaml")
    infos = [ReplicaInfo(name=f"r{i}", url=f"http://127.0.0.1:{9000 + i}") for i in range(2)]
    full = up_config(cfg, "fleetgate-sim", len(infos))
    deployment = full.deployment("fleetgate-sim")
    assert deployment is not None and deployment.cost_profile == SIM_COST_PROFILE
    fleet_capacity = replica_capacity_mu_per_min(deployment) * len(infos)
    gold = next(t for t in full.tenants if t.name == "gold")
    assert gold.reserved_mu_per_min["fleetgate-sim"] == pytest.approx(fleet_capacity / 2)
    # a replica's MU budget matches what the profile says one simulated replica serves
    assert load_profile(SIM_COST_PROFILE).capacity_mu_per_min == replica_capacity_mu_per_min(deployment)


def test_health_checks_default_on_and_engine_priority_by_dialect() -> None:
    """Unset `engine_priority` means the dialect's default: on where the engine honours `priority` without a
    launch flag (the simulated engine, also as the local provider's default engine), off where vLLM/SGLang
    need theirs and for llama.cpp (which takes none); an explicit value wins where the dialect
    has priority."""
    assert GatewayConfig().health_checks is True
    assert DeploymentConfig(model="m").engine_priority is None
    assert DeploymentConfig(model="m", engine_priority=True).engine_priority is True
    assert sends_priority(DeploymentConfig(model="m", engine="sim")) is True
    assert sends_priority(DeploymentConfig(model="m", engine="sim", engine_priority=False)) is False
    assert sends_priority(DeploymentConfig(model="m", engine="vllm")) is False
    assert sends_priority(DeploymentConfig(model="m", engine="vllm", engine_priority=True)) is True
    assert sends_priority(DeploymentConfig(model="m", engine="llamacpp", engine_priority=True)) is False


def test_health_series_carry_a_deployment_label() -> None:
    cfg = FleetgateConfig.model_validate(
        {
            "gateway": {"port": 0},
            "deployments": [
                {"model": "a", "replicas": [{"name": "r0", "url": "http://127.0.0.1:9"}]},
                {"model": "b", "replicas": [{"name": "r0", "url": "http://127.0.0.1:10"}]},
            ],
        }
    )
    server = build_gateway(cfg, health=True)
    monitors = server.monitors
    assert set(monitors) == {"a", "b"}
    registry = server.proxy.metrics.registry
    for model in ("a", "b"):
        value = registry.get_sample_value(
            "fleetgate_health_state", {"deployment": model, "replica": "r0", "state": "healthy"}
        )
        assert value == 1.0, model


def test_bench_overhead_config_turns_health_checks_off() -> None:
    script = (ROOT / "bench" / "gateway_overhead.sh").read_text()
    assert "health_checks: false" in script


def test_serve_config_roundtrip(tmp_path: Path) -> None:
    """The new gateway settings load from YAML."""
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "gateway": {"client_keepalive_timeout_s": 5, "shutdown_linger_s": 0.5},
                "deployments": [{"model": "m", "engine_priority": True}],
            }
        )
    )
    cfg = load_config(path)
    assert cfg.gateway.client_keepalive_timeout_s == 5 and cfg.gateway.shutdown_linger_s == 0.5
    assert cfg.deployments[0].engine_priority is True
