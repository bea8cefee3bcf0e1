"""Admission leases in Redis (issue 22, finding 9): a gateway killed with -9 before it settles must not leave
its tenant blocked by an estimate nobody will ever settle.

Against the real redis-server of ``FLEETGATE_TEST_REDIS_URL`` (skipped without it). The gateway is a child
process running an ``AdmissionService`` exactly as ``fleetgate serve`` builds it from the config.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import uuid

import pytest

from fleetgate.admission.service import AdmissionService
from fleetgate.config import parse_config
from fleetgate.core.errors import RateLimitError
from fleetgate.core.types import RequestInfo

REDIS_URL = os.environ.get("FLEETGATE_TEST_REDIS_URL")
pytestmark = pytest.mark.skipif(not REDIS_URL, reason="FLEETGATE_TEST_REDIS_URL not set")

LEASE_TTL_S = 1.0


def cfg(ns: str, lease_ttl_s: float = LEASE_TTL_S) -> dict[str, object]:
    return {
        "deployments": [
            {"model": "m", "capacity_mu_per_min": 6000, "replicas": [{"name": "r", "url": "http://x"}]}
        ],
        "tenants": [{"name": "gold", "api_keys": ["sk-gold"], "reserved_mu_per_min": {"m": 60}}],
        "admission": {
            "deadline_s": 0,
            "store": {"kind": "redis", "url": REDIS_URL, "namespace": ns, "lease_ttl_s": lease_ttl_s},
        },
    }


CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from fleetgate.admission.service import AdmissionService
    from fleetgate.config import parse_config
    from fleetgate.core.types import RequestInfo

    async def main():
        svc = AdmissionService.from_config(parse_config(json.loads(sys.argv[1])))
        gold = svc.authenticate("Bearer sk-gold")
        # a long stream: estimated at 50 MU of a 60 MU/min reservation, still running when we are killed
        await svc.admit(gold, RequestInfo("stream-1", "m", tenant="gold", cost_mu=50.0))
        print("admitted", flush=True)
        await asyncio.sleep(120)

    asyncio.run(main())
    """
)


def req(rid: str, cost: float) -> RequestInfo:
    return RequestInfo(rid, "m", tenant="gold", cost_mu=cost)


def admit_then_kill_9(ns: str) -> None:
    """A gateway process admits a long stream, then is killed with SIGKILL (no settle, release or hook)."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(cfg(ns))], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stderr is not None
        line = child.stdout.readline()
        assert line.strip() == b"admitted", child.stderr.read().decode()
    finally:
        child.kill()
        child.wait(5)


async def test_kill_9_before_settle_leaves_no_tenant_blocked() -> None:
    ns = f"lease-{uuid.uuid4().hex}"
    await asyncio.to_thread(admit_then_kill_9, ns)
    svc = AdmissionService.from_config(parse_config(cfg(ns)))  # "the restarted gateway"
    gold = svc.authenticate("Bearer sk-gold")
    try:
        with pytest.raises(RateLimitError) as e:  # the dead gateway's lease has not lapsed yet
            await svc.admit(gold, req("a", 1.0))
        assert e.value.retry_after_s > 30
        await asyncio.sleep(LEASE_TTL_S + 0.3)
        ticket = await svc.admit(gold, req("b", 1.0))  # lapsed and refunded: admitted
        assert ticket.decision.allowed
        await svc.settle(ticket, 1.0)
    finally:
        await svc.aclose()


async def test_a_running_request_keeps_its_lease_and_a_late_settle_charges_in_full() -> None:
    ns = f"lease-{uuid.uuid4().hex}"
    svc = AdmissionService.from_config(parse_config(cfg(ns, lease_ttl_s=0.6)))
    gold = svc.authenticate("Bearer sk-gold")
    store = svc.store
    try:
        long = await svc.admit(gold, req("long", 50.0))  # 60 MU/min = 1 MU/s
        await asyncio.sleep(1.5)  # 2.5 lease lifetimes: the service renews it while the request runs
        with pytest.raises(RateLimitError):
            await svc.admit(gold, req("a", 1.0))
        await svc.settle(long, 2.0)  # ran cheaper: 48 MU refunded at once (level about 0.5)
        await asyncio.sleep(0.7)
        other = await svc.admit(gold, req("c", 20.0))
        meter = [other.decision.charges[0]]
        # its gateway stops renewing (as if it hung): the lease lapses and the next script run refunds it
        assert svc._renewer is not None
        svc._renewer.cancel()
        await asyncio.sleep(0.9)
        await store.take([], svc.clock())
        assert (await store.peek(meter, svc.clock()))[meter[0].key].level == pytest.approx(0.0, abs=1e-6)
        # settling it afterwards charges the actual cost in full (not actual - estimate on top of a refund)
        await svc.settle(other, 12.0)
        level = (await store.peek(meter, svc.clock()))[meter[0].key].level
        assert level == pytest.approx(12.0, abs=0.1)
    finally:
        await svc.aclose()
