"""The Redis admission store against a real redis-server on 127.0.0.1.

``scripts/test.sh`` starts one and exports FLEETGATE_TEST_REDIS_URL; without it these tests skip. The outage
tests start (and stop, and restart) their own redis-server on another free port.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from fleetgate.admission.service import AdmissionService
from fleetgate.config import parse_config
from fleetgate.core.admission import BucketParams, Charge, ChargeKind, MemoryBuckets
from fleetgate.core.errors import RateLimitError, ServiceUnavailableError
from fleetgate.core.types import RequestInfo
from fleetgate.providers.local import free_port
from fleetgate.stores.redis import RedisStore

REDIS_URL = os.environ.get("FLEETGATE_TEST_REDIS_URL")
needs_redis = pytest.mark.skipif(
    not REDIS_URL, reason="FLEETGATE_TEST_REDIS_URL not set (scripts/test.sh starts a redis-server)"
)


class RedisProcess:
    """A private redis-server on 127.0.0.1 that a test may stop and start again on the same port."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.tmp = tmp
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            cwd=self.tmp,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(5)
            self.proc = None


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed (scripts/test.sh installs it)")
    r = RedisProcess(tmp_path)
    r.start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
async def store() -> AsyncIterator[RedisStore]:
    assert REDIS_URL
    s = RedisStore(REDIS_URL, server_time=False)
    try:
        yield s
    finally:
        await s.close()


def cfg(url: str, ns: str, **store: object) -> dict[str, object]:
    return {
        "deployments": [
            {"model": "m", "capacity_mu_per_min": 600, "replicas": [{"name": "r", "url": "http://x"}]}
        ],
        "tenants": [{"name": "gold", "api_keys": ["sk-gold"], "reserved_mu_per_min": {"m": 60}}],
        "admission": {
            "deadline_s": 0,
            "store": {"kind": "redis", "url": url, "namespace": ns, **store},
        },
    }


@needs_redis
async def test_lua_matches_the_pure_bucket_math(store: RedisStore) -> None:
    """Random takes and settles at explicit times: Redis and the pure core agree to 1e-9."""
    rng = random.Random(11)
    ns = f"t{uuid.uuid4().hex}"
    params = [BucketParams(rng.uniform(0.1, 5.0), rng.uniform(0.0, 10.0)) for _ in range(3)]
    mem = MemoryBuckets()
    t = 0.0
    for step in range(300):
        t += rng.choice([0.0, 0.0, rng.uniform(0.0, 3.0)])
        picked = rng.sample(range(3), rng.randint(1, 3))
        if rng.random() < 0.7:
            charges = [
                Charge(f"{ns}:{i}", params[i], rng.uniform(0.0, 8.0), ChargeKind.MU, rng.random() < 0.8)
                for i in picked
            ]
            a, b = mem.take(charges, t), await store.take(charges, t)
            assert a.allowed == b.allowed, step
            assert a.retry_after_s == pytest.approx(b.retry_after_s, abs=1e-9)
            assert set(a.blocked) == set(b.blocked)
            for k in a.states:
                assert a.states[k].level == pytest.approx(b.states[k].level, abs=1e-9)
        else:
            deltas = [Charge(f"{ns}:{i}", params[i], rng.uniform(-8.0, 8.0)) for i in picked]
            mem.adjust(deltas, t)
            await store.adjust(deltas, t)
        peek = await store.peek([Charge(f"{ns}:{i}", params[i], 0.0) for i in range(3)], t)
        for key, st in mem.peek([Charge(f"{ns}:{i}", params[i], 0.0) for i in range(3)], t).items():
            assert st.level == pytest.approx(peek[key].level, abs=1e-9)


@needs_redis
async def test_keys_expire_after_draining_and_server_time_mode() -> None:
    assert REDIS_URL
    s = RedisStore(REDIS_URL, server_time=True)
    try:
        key = f"t{uuid.uuid4().hex}:k"
        p = BucketParams(rate_per_s=2.0, burst=0.0)
        first = await s.take([Charge(key, p, 4.0)], 0.0)
        assert first.allowed and first.now > 1e9  # Redis' clock (epoch seconds), not the caller's
        second = await s.take([Charge(key, p, 1.0)], 0.0)
        assert not second.allowed and 1.5 < second.retry_after_s <= 2.0
        ttl = await s._redis.pttl(key)
        assert 60_000 < ttl <= 62_000  # drained in 2 s, plus a 60 s margin
    finally:
        await s.close()


@needs_redis
async def test_two_gateways_sharing_redis_enforce_one_limit() -> None:
    assert REDIS_URL
    ns = f"t{uuid.uuid4().hex}"
    a = AdmissionService.from_config(parse_config(cfg(REDIS_URL, ns)))
    b = AdmissionService.from_config(parse_config(cfg(REDIS_URL, ns)))
    try:
        gold = a.authenticate("Bearer sk-gold")
        await a.admit(gold, RequestInfo("r1", "m", cost_mu=1.0))
        with pytest.raises(RateLimitError) as e:
            await b.admit(b.authenticate("Bearer sk-gold"), RequestInfo("r2", "m", cost_mu=1.0))
        assert 0 < e.value.retry_after_s <= 1.0
        usage = await b.usage("gold")
        assert usage["usage"]["requests"] == 1 and usage["store_available"]
    finally:
        await a.aclose()
        await b.aclose()


async def test_fail_closed_then_recovers_without_restart(
    own_redis: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    svc = AdmissionService.from_config(parse_config(cfg(own_redis.url, "fc", fail_open=False, timeout_s=0.2)))
    assert isinstance(svc.store, RedisStore)
    svc.store.retry_interval_s = 0.2
    gold = svc.authenticate("Bearer sk-gold")
    try:
        await svc.admit(gold, RequestInfo("a", "m", cost_mu=0.01))
        own_redis.stop()
        with (
            caplog.at_level(logging.WARNING, logger="fleetgate.admission.redis"),
            pytest.raises(ServiceUnavailableError) as e,
        ):
            await svc.admit(gold, RequestInfo("b", "m", cost_mu=0.01))
        assert e.value.status == 503 and e.value.retry_after_s >= 1.0
        assert any("unreachable" in r.message for r in caplog.records)
        assert svc.metrics.registry.get_sample_value(
            "fleetgate_admission_store_errors_total", {"store": "redis"}
        )
        assert svc.metrics.registry.get_sample_value("fleetgate_admission_store_up") == 0.0
        # within the retry interval the store fails fast instead of stalling every request
        t0 = time.monotonic()
        with pytest.raises(ServiceUnavailableError):
            await svc.admit(gold, RequestInfo("c", "m", cost_mu=0.01))
        assert time.monotonic() - t0 < 0.1
        own_redis.start()
        await asyncio.sleep(0.3)
        ticket = await svc.admit(gold, RequestInfo("d", "m", cost_mu=0.01))  # the same service, no restart
        assert ticket.decision.allowed
        assert svc.metrics.registry.get_sample_value("fleetgate_admission_store_up") == 1.0
        await svc.settle(ticket, 0.01)
    finally:
        await svc.aclose()


async def test_fail_open_admits_unmetered_and_counts_it(own_redis: RedisProcess) -> None:
    svc = AdmissionService.from_config(parse_config(cfg(own_redis.url, "fo", fail_open=True, timeout_s=0.2)))
    gold = svc.authenticate("Bearer sk-gold")
    try:
        await svc.admit(gold, RequestInfo("a", "m", cost_mu=1.0))
        with pytest.raises(RateLimitError):  # the limit holds while Redis is up
            await svc.admit(gold, RequestInfo("b", "m", cost_mu=1.0))
        own_redis.stop()
        tickets = [await svc.admit(gold, RequestInfo(f"c{i}", "m", cost_mu=1.0)) for i in range(3)]
        assert all(t.decision.allowed and t.decision.charges == () for t in tickets)
        assert svc.metrics.registry.get_sample_value("fleetgate_admission_fail_open_total") == 3.0
        for t in tickets:
            await svc.settle(t, 1.0)  # settling while down only counts an error
    finally:
        await svc.aclose()
