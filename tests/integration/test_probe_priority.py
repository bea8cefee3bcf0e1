"""Health probes go ahead of every tenant's queue, even at saturation.

How probes travel (``fleetgate.health.monitor``): the prober posts a 1-token ``/v1/completions`` request
*straight to the engine* with ``priority: -100`` where its dialect takes one (here the simulated engine; vLLM
with ``engine_priority``: lowest value first), so it never
enters the gateway's admission queue, and inside the engine it is the head of the waiting queue. Admission
itself (``core.admission``) also has a probe class that is never queued nor limited, for probes that do come
through an ``AdmissionService``.

The live test saturates everything at once: the gateway's admission queue holds waiting ``gold``
(reserved, over its reservation) and ``free`` (best-effort, fleet full) requests, and the single engine
(2 sequence slots, ~1 s per request) has a waiting queue of admitted requests. A probe sent then must come
back within about one request's service time (the time until a slot frees), while requests queued before
it — in the engine and in the gateway — are still waiting when it returns.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import yaml

from fleetgate.admission.service import AdmissionService
from fleetgate.config import FleetgateConfig
from fleetgate.core.errors import FleetgateError
from fleetgate.core.types import Priority, RequestInfo
from fleetgate.engines.dialects import dialect
from fleetgate.health.monitor import HealthMonitor

MODEL = "probe-model"
GOLD = "sk-gold-probe"
FREE = "sk-free-probe"
ADMIN = "sk-admin-probe"
OUT_TOKENS = 100  # 100 steps of ~10 ms: ~1 s per tenant request
STEP_S = 0.01
#: Sent at once: the fleet meter (100 MU/min, 1 MU each) admits ~1.7 requests/s, so most of them wait in the
#: gateway's queue while the engine's 2 slots are busy and 3+ admitted ones wait there (all done in ~12 s).
GOLD_REQUESTS = 12
FREE_REQUESTS = 6


def _write_fleet_files(tmp_path: Path, engine_url: str) -> Path:
    (tmp_path / "cost.json").write_text(
        json.dumps(
            {"name": "probe-test", "alpha": 0.0, "beta": 0.01, "gamma": 0.0, "capacity_mu_per_min": 100}
        )
    )
    cfg = {
        "gateway": {"host": "127.0.0.1", "port": 0, "health_checks": False},
        "deployments": [
            {
                "model": MODEL,
                "capacity_mu_per_min": 100,
                "cost_profile": str(tmp_path / "cost.json"),
                "replicas": [{"name": "r0", "url": engine_url}],
            }
        ],
        "tenants": [
            # 1 MU per request: 240 MU/min lets 4 requests/s through, twice what the engine serves (2/s).
            {
                "name": "gold",
                "api_keys": [GOLD],
                "priority": "interactive",
                "reserved_mu_per_min": {MODEL: 240},
            },
            {"name": "free", "api_keys": [FREE], "priority": "best_effort", "best_effort_mu_per_min": None},
        ],
        "admission": {"admin_api_keys": [ADMIN], "queue_max": 40, "deadline_s": 30},
    }
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


async def _tenant_request(
    session: aiohttp.ClientSession, url: str, key: str, sent: list[float], first: list[float | None]
) -> int:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "tell me"}],
        "max_tokens": OUT_TOKENS,
        "stream": True,
    }
    idx = len(sent)
    sent.append(time.monotonic())
    first.append(None)
    async with session.post(
        url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as resp:
        if resp.status != 200:
            await resp.read()
            return resp.status
        async for line in resp.content:
            if first[idx] is None and b'"content"' in line:
                first[idx] = time.monotonic()
        return resp.status


async def test_probe_goes_ahead_of_saturated_queues(start_engine: Any, tools: Any, tmp_path: Path) -> None:
    (tmp_path / "engine.yaml").write_text(
        yaml.safe_dump({"perf": {"max_num_seqs": 2, "step_overhead_s": STEP_S, "decode_s_per_seq": 0.0}})
    )
    engine = start_engine(MODEL, "--profile", str(tmp_path / "engine.yaml"), time_scale="1")
    gateway = tools.ServerProcess(
        [tools.PY, "-m", "fleetgate.cli", "serve", "--config", str(_write_fleet_files(tmp_path, engine.url))],
        name="gateway",
    )
    try:
        url = gateway.wait_ready()
        sent: list[float] = []
        first: list[float | None] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            tasks = [
                asyncio.ensure_future(_tenant_request(session, url, GOLD, sent, first))
                for _ in range(GOLD_REQUESTS)
            ]
            tasks += [
                asyncio.ensure_future(_tenant_request(session, url, FREE, sent, first))
                for _ in range(FREE_REQUESTS)
            ]
            # Wait until both queues are non-empty: engine waiting (slots full) and gateway admission queue.
            async with httpx.AsyncClient(timeout=5) as http:
                deadline = time.monotonic() + 15
                while True:
                    stats = (await http.get(engine.url + "/admin/stats")).json()["engine"]
                    usage = (
                        await http.get(url + "/admin/usage", headers={"Authorization": f"Bearer {ADMIN}"})
                    ).json()
                    if stats["num_waiting"] >= 3 and stats["num_running"] == 2 and usage["queue_depth"] >= 3:
                        print(f"engine waiting {stats['num_waiting']}, queued {usage['queue_depth']}")
                        break
                    assert time.monotonic() < deadline, (stats, usage["queue_depth"])
                    await asyncio.sleep(0.05)
                waiting_before = stats["num_waiting"]
                queued_before = usage["queue_depth"]

                monitor = HealthMonitor(model=MODEL, dialect=dialect("sim"))  # priority: -100
                monitor.set_replicas({"r0": engine.url})
                try:
                    t0 = time.monotonic()
                    result = await monitor.probe("r0")
                    t1 = time.monotonic()
                finally:
                    await monitor.stop()

                stats_after = (await http.get(engine.url + "/admin/stats")).json()["engine"]
                usage_after = (
                    await http.get(url + "/admin/usage", headers={"Authorization": f"Bearer {ADMIN}"})
                ).json()
            statuses = await asyncio.gather(*tasks)

        assert result.ok, result
        # One slot frees within one request's service time (~1 s); the probe is at the head of the engine's
        # waiting queue, so it needs at most that plus one step. Generous margin for a loaded CI machine.
        assert result.latency_s < 2.0, result
        # Everything queued before the probe is still queued when it is back: it jumped both queues.
        assert stats_after["num_waiting"] >= 1, (waiting_before, stats_after)
        assert usage_after["queue_depth"] >= 1, (queued_before, usage_after["queue_depth"])
        # Requests sent before the probe that got their first token only after it: at least the engine's
        # waiting queue at probe time minus the slots that could free during the probe.
        overtaken = sum(1 for s, f in zip(sent, first, strict=True) if s < t0 and f is not None and f > t1)
        assert overtaken >= max(1, waiting_before - 2), (overtaken, waiting_before)
        # No tenant request was lost: gold is admitted (reserved, within the queue deadline), free is
        # either admitted from idle capacity or shed with 503.
        assert all(s == 200 for s in statuses[:GOLD_REQUESTS]), statuses
        assert all(s in (200, 503) for s in statuses[GOLD_REQUESTS:]), statuses
    finally:
        gateway.kill()


async def test_admission_probe_class_skips_a_full_queue() -> None:
    """Through an ``AdmissionService`` a probe is admitted at once while tenants wait in a full queue."""
    cfg = FleetgateConfig.model_validate(
        {
            "deployments": [
                {
                    "model": MODEL,
                    "capacity_mu_per_min": 60,
                    "replicas": [{"name": "r0", "url": "http://127.0.0.1:9"}],
                }
            ],
            "tenants": [
                {
                    "name": "gold",
                    "api_keys": [GOLD],
                    "priority": "interactive",
                    "reserved_mu_per_min": {MODEL: 60},
                },
                {
                    "name": "free",
                    "api_keys": [FREE],
                    "priority": "best_effort",
                    "best_effort_mu_per_min": None,
                },
            ],
            "admission": {"queue_max": 4, "deadline_s": 30},
        }
    )
    service = AdmissionService.from_config(cfg)
    gold = service.authenticate(f"Bearer {GOLD}")
    free = service.authenticate(f"Bearer {FREE}")

    def info(i: int, tenant: str, priority: Priority, cost: float = 5.0) -> RequestInfo:
        return RequestInfo(
            request_id=f"{tenant}-{i}", model=MODEL, tenant=tenant, cost_mu=cost, priority=priority
        )

    order: list[str] = []

    async def admit(tenant: Any, req: RequestInfo) -> None:
        try:
            await service.admit(tenant, req, service.clock())
            order.append(req.request_id)
        except FleetgateError:
            order.append(f"rejected:{req.request_id}")

    try:
        # gold's meter (1 MU/s) is busy for 5 s after the first request; the next ones queue.
        tasks = [asyncio.ensure_future(admit(gold, info(i, "gold", Priority.INTERACTIVE))) for i in range(3)]
        tasks += [asyncio.ensure_future(admit(free, info(i, "free", Priority.BEST_EFFORT))) for i in range(3)]
        await asyncio.sleep(0.05)
        assert len(service.core.queue) >= 3
        t0 = time.monotonic()
        ticket = await service.admit(gold, info(0, "probe", Priority.PROBE, cost=0.01), service.clock())
        assert time.monotonic() - t0 < 0.05
        assert ticket.tier is not None and str(ticket.tier) == "probe"
        # Nothing queued before it was admitted in the meantime.
        assert [o for o in order if not o.startswith("rejected")] == ["gold-0"], order
        assert len(service.core.queue) >= 3
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await service.aclose()
