"""Gateway hot-path helpers: engine priority forwarding, lazy prefix hashes, routing-latency histogram."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
from prometheus_client import generate_latest

from fleetgate.config import DeploymentConfig
from fleetgate.core.openai import parse_request
from fleetgate.core.routing.registry import build_policy
from fleetgate.core.types import Priority
from fleetgate.engines.dialects import dialect
from fleetgate.gateway.fleet import Fleet, engine_kind, sends_priority
from fleetgate.gateway.metrics import GatewayMetrics
from fleetgate.gateway.proxy import ENGINE_PRIORITY, Proxy, _uses_prefix_hashes

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi " * 40}], "stream": True, "priority": -99}


def _upstream(
    engine_priority: bool | None,
    priority: Priority,
    engine: str | None = None,
    provider: dict[str, Any] | None = None,
) -> tuple[dict[str, Any] | None, bool]:
    config = DeploymentConfig.model_validate(
        {"model": "m", "engine": engine}
        | ({} if engine_priority is None else {"engine_priority": engine_priority})
        | ({} if provider is None else {"provider": provider})
    )
    deployment: Any = SimpleNamespace(
        upstream_model="m",
        config=config,
        sends_priority=sends_priority(config),
        dialect=dialect(engine_kind(config)),
    )
    proxy: Any = SimpleNamespace(images=None, config=SimpleNamespace(stream_usage=False))
    parsed = parse_request(BODY, "chat")
    info = parsed.request_info("r1", priority=priority)
    raw, strip = Proxy._upstream_body(proxy, parsed, deployment, info)
    return (orjson.loads(raw) if raw is not None else None), strip


def test_engine_priority_off_forwards_client_bytes() -> None:
    assert _upstream(None, Priority.BATCH) == (None, False)  # field absent (older config)
    assert _upstream(False, Priority.BATCH) == (None, False)


def test_engine_priority_maps_tenant_class_vllm_semantics() -> None:
    body, _ = _upstream(True, Priority.INTERACTIVE)
    assert body is not None and body["priority"] == -10  # the client's own -99 is overridden
    body, _ = _upstream(True, Priority.BEST_EFFORT)
    assert body is not None and body["priority"] == 10
    order = [Priority.PROBE, Priority.INTERACTIVE, Priority.BATCH, Priority.BEST_EFFORT]
    assert [ENGINE_PRIORITY[p] for p in order] == sorted(ENGINE_PRIORITY[p] for p in order)


def test_engine_priority_in_each_dialects_order() -> None:
    """SGLang serves higher values first; llama.cpp takes no priority (the client's bytes are forwarded)."""
    hi, _ = _upstream(True, Priority.INTERACTIVE, "sglang")
    lo, _ = _upstream(True, Priority.BEST_EFFORT, "sglang")
    assert hi is not None and lo is not None and hi["priority"] > lo["priority"]
    assert _upstream(True, Priority.INTERACTIVE, "llamacpp") == (None, False)
    sim, _ = _upstream(True, Priority.INTERACTIVE, "sim")
    assert sim is not None and sim["priority"] == -10


def test_engine_priority_default_on_where_no_launch_flag_is_needed() -> None:
    """Unset ``engine_priority``: on for the simulated engine (``engine: sim``, or the local provider's
    default engine), off where the engine needs a launch flag (vLLM, SGLang, unknown) or takes none."""
    sim, _ = _upstream(None, Priority.BEST_EFFORT, "sim")
    assert sim is not None and sim["priority"] == 10
    local, _ = _upstream(None, Priority.INTERACTIVE, provider={"kind": "local", "replicas": 1})
    assert local is not None and local["priority"] == -10
    custom = {"kind": "local", "replicas": 1, "command": ["vllm", "serve", "{model}", "--port", "{port}"]}
    assert _upstream(None, Priority.INTERACTIVE, provider=custom) == (None, False)
    for engine in ("vllm", "sglang", "llamacpp", None):
        assert _upstream(None, Priority.INTERACTIVE, engine) == (None, False)
    assert _upstream(False, Priority.INTERACTIVE, "sim") == (None, False)  # an explicit false wins


def test_prefix_hashes_only_for_policies_that_read_them() -> None:
    def dep(name: str) -> Any:
        return SimpleNamespace(
            policy=build_policy(name), config=SimpleNamespace(routing=SimpleNamespace(policy=name))
        )

    assert not _uses_prefix_hashes(dep("round_robin"))
    assert not _uses_prefix_hashes(dep("least_requests"))
    assert _uses_prefix_hashes(dep("cache_aware"))
    assert _uses_prefix_hashes(dep("fleetgate"))
    parsed = parse_request(BODY, "chat", hashes=False)
    full = parse_request(BODY, "chat")
    assert parsed.prefix_hashes == () and full.prefix_hashes
    assert parsed.input_tokens == full.input_tokens


def test_routing_histogram_is_exported() -> None:
    metrics = GatewayMetrics(Fleet())
    child = metrics.routing_child("m")
    assert metrics.routing_child("m") is child
    child.observe(0.00002)
    text = generate_latest(metrics.registry).decode()
    assert 'fleetgate_routing_seconds_count{deployment="m"} 1.0' in text
