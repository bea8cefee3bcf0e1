"""``core.lifecycle.Lifecycle``: the request lifecycle both drivers share, its observers and demand meter."""

from __future__ import annotations

import random
from typing import Any

import pytest

from fleetgate.core.autoscale.demand import DemandMeter
from fleetgate.core.lifecycle import Lifecycle, ObserverBase, ReplicaLoad
from fleetgate.core.routing.registry import build_policy
from fleetgate.core.types import ReplicaSnapshot, RequestInfo, Usage
from fleetgate.core.units import DEFAULT_PROFILE


class Log(ObserverBase):
    """Overrides two of the three events: the third keeps its no-op default."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        self.events.append(("dispatch", request.request_id, replica, now))

    def on_complete(
        self, request: RequestInfo, replica: str, now: float, usage: Usage | None, cost_mu: float, ok: bool
    ) -> None:
        self.events.append(("complete", request.request_id, replica, now, usage, cost_mu, ok))


def _lifecycle(observers: list[Log]) -> tuple[Lifecycle[Any], dict[str, ReplicaLoad]]:
    loads: dict[str, ReplicaLoad] = {"a": ReplicaLoad(), "b": ReplicaLoad()}

    def snapshots() -> list[ReplicaSnapshot]:
        return [
            ReplicaSnapshot(name=n, inflight_requests=r.inflight_requests, inflight_mu=r.inflight_mu)
            for n, r in loads.items()
        ]

    lc: Lifecycle[Any] = Lifecycle(
        build_policy("least_requests"),
        DEFAULT_PROFILE,
        snapshots=snapshots,
        demand=DemandMeter(),
        observers=observers,
    )
    return lc, loads


def test_one_request_through_the_lifecycle_reaches_counters_demand_history_and_observers() -> None:
    log = Log()
    lc, loads = _lifecycle([log])
    expected, cost = lc.estimate("t", 1000)
    assert expected == DEFAULT_PROFILE.default_output_tokens  # no history yet
    assert cost == pytest.approx(DEFAULT_PROFILE.estimate(1000, None))
    info = RequestInfo(request_id="r1", model="m", tenant="t", input_tokens=1000, cost_mu=cost)
    lc.start(info)
    assert lc.demand is not None and lc.demand.inflight_mu == pytest.approx(cost)
    assert not lc.gated and lc.held() == 0
    decision = lc.route(info, 1.0, random.Random(0))
    load = loads[decision.replica]
    lc.dispatch(info, decision.replica, load, 1.0)
    assert load.inflight_requests == 1 and load.inflight_mu == pytest.approx(cost)
    lc.first_token(info, decision.replica, 1.2)  # the observer keeps the no-op default: nothing logged
    usage = Usage(prompt_tokens=1000, completion_tokens=40)
    settled = lc.complete(info, decision.replica, load, 2.0, usage)
    assert settled == pytest.approx(DEFAULT_PROFILE.settle(usage))
    assert load.inflight_requests == 0 and load.inflight_mu == 0.0 and load.completed == 1
    assert lc.demand.inflight_mu == 0.0 and lc.demand.settled_mu_per_min(2.0) == pytest.approx(settled)
    assert log.events == [
        ("dispatch", "r1", decision.replica, 1.0),
        ("complete", "r1", decision.replica, 2.0, usage, settled, True),
    ]
    assert lc.history.count("t") == 1


def test_failed_attempt_then_release_settles_nothing() -> None:
    log = Log()
    lc, loads = _lifecycle([log])
    info = RequestInfo(request_id="r", model="m", tenant="t", input_tokens=10, cost_mu=3.0)
    lc.start(info)
    lc.dispatch(info, "a", loads["a"], 0.0)
    assert lc.finish(info, "a", loads["a"], 0.5, None, False) == 3.0  # no usage: the estimate
    assert loads["a"].consecutive_failures == 1 and loads["a"].failed == 1
    lc.release_demand(info, 0.5)
    assert lc.demand is not None and lc.demand.inflight_requests == 0
    assert lc.demand.settled_mu_per_min(0.5) == 0.0
    assert lc.history.count("t") == 0
    assert log.events[-1] == ("complete", "r", "a", 0.5, None, 3.0, False)
    # a request that streamed but reported no usage settles what is known to have run
    assert lc.settle(info, None, 1.0, streamed_tokens=5) == pytest.approx(
        DEFAULT_PROFILE.settle(Usage(prompt_tokens=10, completion_tokens=5))
    )


def test_demand_window_is_exact() -> None:
    m = DemandMeter(window_s=60.0)
    m.finish(0.0, 2.0, now_s=10.25)
    m.finish(0.0, 3.0, now_s=10.75)
    assert m.settled_mu_per_min(70.25) == pytest.approx(5.0)  # both inside [now - 60, now]
    assert m.settled_mu_per_min(70.5) == pytest.approx(3.0)  # the first left, to the millisecond
