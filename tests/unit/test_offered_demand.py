"""The autoscaler's demand is what was offered (issue 18): a request admission sheds for lack of capacity
counts (``DemandMeter.refused``, ``Lifecycle.shed``, an admission error's ``offered_demand``); one refused
for the tenant's own limits does not. Without it a deployment that sheds reads as needing what it holds."""

from __future__ import annotations

from typing import Any

import pytest

from fleetgate.admission.service import AdmissionService
from fleetgate.config import parse_config
from fleetgate.core.autoscale import AutoscaleContext, DemandMeter, build_autoscaler
from fleetgate.core.errors import RateLimitError, ServiceUnavailableError
from fleetgate.core.lifecycle import Lifecycle
from fleetgate.core.routing.registry import build_policy
from fleetgate.core.types import RequestInfo
from fleetgate.core.units import DEFAULT_PROFILE


def test_refused_joins_the_window_not_the_inflight_sum_and_leaves_it() -> None:
    m = DemandMeter(window_s=60.0)
    m.start(10.0)
    m.refused(6.0, now_s=100.0)
    m.refused(-1.0, now_s=100.0)  # nothing negative counts
    assert m.inflight_mu == 10.0 and m.inflight_requests == 1
    assert m.settled_mu_per_min(100.0) == pytest.approx(6.0)
    m.finish(10.0, 4.0, now_s=120.0)
    assert m.settled_mu_per_min(120.0) == pytest.approx(10.0)  # served 4 + offered-and-shed 6
    assert m.settled_mu_per_min(161.0) == pytest.approx(4.0)  # the refusal left the window


def test_lifecycle_shed_counts_the_estimate_as_demand() -> None:
    lc: Lifecycle[Any] = Lifecycle(
        build_policy("least_requests"), DEFAULT_PROFILE, snapshots=list, demand=DemandMeter()
    )
    info = RequestInfo(request_id="r", model="m", tenant="t", input_tokens=100, cost_mu=3.5)
    lc.shed(info, 5.0)
    assert lc.demand is not None
    assert lc.demand.inflight_mu == 0.0 and lc.demand.settled_mu_per_min(5.0) == pytest.approx(3.5)
    Lifecycle(build_policy("least_requests"), DEFAULT_PROFILE, snapshots=list).shed(info, 5.0)  # no meter


def _desired_after_a_minute(count_shed: bool) -> int:
    """Two ready replicas of 100 MU/min each; 600 MU/min offered, admission lets through what two replicas
    at the target utilisation serve (140 MU/min) and sheds the rest. One decision per second."""
    scaler = build_autoscaler("fleetgate", {"max_replicas": 20, "min_replicas": 1})
    meter = DemandMeter(window_s=60.0)
    state: Any = None
    desired = 2
    for second in range(60):
        now = float(second)
        meter.finish(0.0, 140.0 / 60.0, now)  # admitted and settled
        if count_shed:
            meter.refused(
                460.0 / 60.0, now
            )  # what the gateway does on an admission error with offered_demand
        ctx = AutoscaleContext(
            now_s=now,
            current_replicas=2,
            ready_replicas=2,
            capacity_mu_per_min=100.0,
            settled_mu_per_min=meter.settled_mu_per_min(now),
            inflight_mu=meter.inflight_mu,
            inflight_requests=meter.inflight_requests,
            policy_state=state,
        )
        desired, state = scaler.decide(ctx)
    return int(desired)


def test_a_shedding_deployment_scales_to_its_offered_demand() -> None:
    assert _desired_after_a_minute(count_shed=False) == 2  # the bug: it never scales out of shedding
    assert _desired_after_a_minute(count_shed=True) >= 600 // 70  # ceil(600 / (100 x 0.7)) = 9


def _service() -> AdmissionService:
    cfg = {
        "deployments": [
            {
                "model": "m",
                "capacity_mu_per_min": 60,
                "replicas": [{"name": "r0", "url": "http://127.0.0.1:1"}],
            }
        ],
        "tenants": [
            {
                "name": "capped",
                "api_keys": ["sk-capped"],
                "priority": "best_effort",
                "best_effort_mu_per_min": 6,
            },
            {
                "name": "free",
                "api_keys": ["sk-free"],
                "priority": "best_effort",
                "best_effort_mu_per_min": None,
            },
            {  # a reservation and no own cap on its best-effort excess
                "name": "gold",
                "api_keys": ["sk-gold"],
                "reserved_mu_per_min": {"m": 6},
                "best_effort_mu_per_min": None,
            },
            {
                "name": "strict",
                "api_keys": ["sk-strict"],
                "reserved_mu_per_min": {"m": 6},
            },  # no excess at all
        ],
        "admission": {"deadline_s": 0, "fleet_burst_s": 0},
    }
    return AdmissionService.from_config(parse_config(cfg), clock=lambda: 1000.0)


async def test_only_refusals_for_lack_of_capacity_are_offered_demand() -> None:
    svc = _service()
    key = {n: svc.authenticate(f"Bearer sk-{n}") for n in ("capped", "free", "gold", "strict")}

    async def refused(tenant: str, rid: str, cost: float) -> RateLimitError | ServiceUnavailableError:
        with pytest.raises((RateLimitError, ServiceUnavailableError)) as e:
            await svc.admit(key[tenant], RequestInfo(request_id=rid, model="m", cost_mu=cost))
        assert isinstance(e.value, (RateLimitError, ServiceUnavailableError))
        return e.value

    # the tenant's own limits: over its best-effort allowance, over a reservation with no excess allowed
    await svc.admit(key["capped"], RequestInfo(request_id="c1", model="m", cost_mu=5.0))
    own = await refused("capped", "c2", 5.0)
    await svc.admit(key["strict"], RequestInfo(request_id="s1", model="m", cost_mu=5.0))
    strict = await refused("strict", "s2", 5.0)
    assert own.status == strict.status == 429 and not own.offered_demand and not strict.offered_demand
    # fill the fleet with an unlimited best-effort tenant: only the fleet's capacity refuses it (503)
    for n in range(10):
        try:
            await svc.admit(key["free"], RequestInfo(request_id=f"f{n}", model="m", cost_mu=20.0))
        except ServiceUnavailableError as shed:
            assert shed.status == 503 and shed.offered_demand
            break
    else:
        raise AssertionError("the fleet never filled up")
    # gold's reservation is used up; its excess is best-effort, refused because the fleet is full: the
    # reservation's 429 names the verdict, but the request is demand the fleet did not serve
    await svc.admit(key["gold"], RequestInfo(request_id="g1", model="m", cost_mu=5.0))
    excess = await refused("gold", "g2", 5.0)
    assert excess.status == 429 and excess.offered_demand
