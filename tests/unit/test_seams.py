"""The architecture step's seams: autoscaler rails and registry, engine dialects, the typed composition root,
and process handling that never blocks the event loop."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

import pytest

from fleetgate.config import parse_config
from fleetgate.core.autoscale import (
    AUTOSCALER_NAMES,
    AutoscaleContext,
    Railed,
    Rails,
    autoscaler_from,
    build_autoscaler,
)
from fleetgate.core.types import Priority
from fleetgate.engines.dialects import DIALECTS, detect, dialect
from fleetgate.engines.metrics import parse_prometheus_text
from fleetgate.providers.base import ChangeListener, DrainHook, ReplicaInfo, ReplicaList
from fleetgate.providers.local.process import EngineProcess, free_port
from fleetgate.runtime import Gateway, build_gateway


def _ctx(now: float, current: int = 1, inflight: float = 0.0) -> AutoscaleContext:
    return AutoscaleContext(
        now_s=now, current_replicas=current, ready_replicas=current, inflight_requests=inflight
    )


def test_rails_hold_a_scale_down_for_the_delay_and_bound() -> None:
    rails = Rails(min_replicas=1, max_replicas=5, scale_down_delay_s=10.0)
    n, hist = rails.apply(0.0, 8, ())
    assert n == 5  # bounded
    n, hist = rails.apply(5.0, 2, hist)
    assert n == 5  # the proposal of 8 at t=0 is still within the delay
    n, hist = rails.apply(11.0, 2, hist)
    assert n == 2
    with pytest.raises(ValueError):
        Rails(min_replicas=3, max_replicas=2)


def test_outer_rails_bound_any_autoscaler_and_take_no_delay() -> None:
    inner = build_autoscaler("static", {"replicas": 9})
    railed = Railed(inner, Rails(0, 4))
    assert railed.name == "static" and railed.decide(_ctx(0.0))[0] == 4
    assert railed.summary(_ctx(0.0), None) == inner.summary(_ctx(0.0), None)
    with pytest.raises(ValueError, match="bounds only"):
        Railed(inner, Rails(0, 4, scale_down_delay_s=1.0))


@pytest.mark.parametrize("name", AUTOSCALER_NAMES)
def test_every_registered_autoscaler_builds_from_config_and_reports(name: str) -> None:
    extra = {"replicas": 2} if name == "static" else {}
    cfg = parse_config({"local": {"autoscaler": {"policy": name, **extra}}})
    assert cfg.local.autoscaler is not None
    scaler = autoscaler_from(cfg.local.autoscaler)
    assert scaler.name == name
    desired, state = scaler.decide(_ctx(0.0, 1, 3.0))
    summary = scaler.summary(_ctx(0.0, 1, 3.0), state)
    assert desired >= 0 and summary.utilisation >= 0
    old = parse_config({"local": {"autoscaler": name, "autoscaler_params": extra}})  # the older form
    assert old.local.autoscaler == cfg.local.autoscaler


def test_dialects_metric_detection_priority_probe_and_cached_tokens() -> None:
    assert {"vllm", "sglang", "llamacpp", "sim", "openai"} <= set(DIALECTS)
    found = detect(parse_prometheus_text("sglang:num_queue_reqs 3\n"))
    assert found is not None and found.name == "sglang"
    assert detect(parse_prometheus_text("foo 1\n")) is None
    sglang, vllm = dialect("sglang"), dialect("vllm")
    assert sglang.request_priority(Priority.INTERACTIVE, True) > sglang.request_priority(  # type: ignore[operator]
        Priority.BEST_EFFORT, True
    )
    assert vllm.request_priority(Priority.INTERACTIVE, True) == -10
    assert vllm.request_priority(Priority.INTERACTIVE, False) is None  # needs the engine's flag
    assert dialect("sim").request_priority(Priority.BATCH, False) == 0  # always honoured
    assert dialect("llamacpp").request_priority(Priority.INTERACTIVE, True) is None
    assert "priority" not in dialect("llamacpp").probe_body("m", True)
    chat = dialect("sim").probe_body("m", False, "/v1/chat/completions")
    assert chat["messages"] and chat["priority"] == -100 and chat["max_tokens"] == 1
    usage = {"usage": {"prompt_tokens_details": {"cached_tokens": 7}}}
    assert all(d.cached_tokens(usage) == 7 for d in DIALECTS.values())
    assert dialect(None).name == "openai"
    with pytest.raises(ValueError, match="unknown engine"):
        dialect("tgi")


class _FakeProvider:
    """Records the callbacks the composition root hands a provider factory."""

    def __init__(self, on_change: ChangeListener, drain_hook: DrainHook) -> None:
        self.on_change = on_change
        self.drain_hook = drain_hook
        self.replicas: ReplicaList = []

    async def list(self) -> ReplicaList:
        return list(self.replicas)

    async def scale_to(self, replicas: int) -> ReplicaList:
        self.replicas = [ReplicaInfo(f"r{i}", f"http://127.0.0.1:{9 + i}") for i in range(replicas)]
        self.on_change(self.replicas)
        return self.replicas

    async def restart(self, name: str) -> ReplicaInfo:
        raise NotImplementedError

    async def drain(self, name: str) -> None:
        await self.drain_hook(name, 0.1)


async def test_build_gateway_wires_everything_at_construction() -> None:
    cfg = parse_config({"gateway": {"port": 0}, "deployments": [{"model": "m"}, {"model": "s"}]})
    made: list[_FakeProvider] = []

    def factory(on_change: ChangeListener, drain_hook: DrainHook) -> _FakeProvider:
        made.append(_FakeProvider(on_change, drain_hook))
        return made[-1]

    gw = build_gateway(
        cfg, health=True, providers={"m": factory}, autoscalers={"m": build_autoscaler("fleetgate")}
    )
    assert isinstance(gw, Gateway) and set(gw.monitors) == {"m", "s"}
    assert gw.providers["m"] is made[0] and gw.monitors["m"].remediator is made[0]
    assert gw.monitors["s"].remediator is None  # static replicas: detection only
    assert set(gw.autoscalers) == {"m"} and gw.ops.autoscalers == gw.autoscalers
    assert gw.proxy.slo is gw.ops and len(gw.proxy.listeners) == 1
    infos: Sequence[ReplicaInfo] = await made[0].scale_to(2)  # the provider's change syncs the fleet
    assert sorted(gw.fleet.get("m").replicas) == [i.name for i in infos]
    assert set(gw.monitors["m"].states()) == {"r0", "r1"}
    await made[0].drain("r0")
    assert gw.fleet.get("m").replicas["r0"].draining
    assert gw.server.scraper is not None
    await gw.server.scraper.stop()
    await gw.server.client.close()


async def test_async_kill_does_not_block_the_event_loop() -> None:
    """A child ignoring SIGTERM is SIGKILLed after the grace; while ``stop_async`` waits, the loop runs."""
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    proc = EngineProcess([sys.executable, "-c", code], host="127.0.0.1", port=free_port(), name="stubborn")
    proc.start()
    await asyncio.sleep(0.3)  # let it install the handler
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        code_ = await proc.stop_async(grace=0.5)
    finally:
        task.cancel()
    assert code_ is not None and not proc.running()
    assert ticks >= 20  # ~0.5 s of grace passed with the loop free
