"""Outlier ejection / circuit breaking: a pure object fed with outcomes and ``now``."""

from __future__ import annotations

import random

import pytest

from fleetgate.core.routing import build_policy
from fleetgate.core.routing.outlier import BreakerState, OutlierDetector, OutlierParams
from fleetgate.core.types import ReplicaSnapshot, RequestInfo

FLEET = ["a", "b", "c", "d"]


def detector(**kw: object) -> OutlierDetector:
    det = OutlierDetector(OutlierParams(**kw))  # type: ignore[arg-type]
    for name in FLEET:
        det.record(name, True, 0.0)
    return det


def test_consecutive_failures_eject() -> None:
    det = detector(consecutive_failures=3)
    det.record("a", False, 1.0)
    det.record("a", False, 1.1)
    assert det.allows("a", 1.2)
    det.record("a", False, 1.2)
    assert det.state("a", 1.3) is BreakerState.OPEN
    assert not det.allows("a", 1.3)
    assert det.allows("b", 1.3)


def test_success_resets_the_consecutive_count() -> None:
    det = detector(consecutive_failures=3, error_rate_min_requests=100)
    for t in range(10):
        det.record("a", False, float(t))
        det.record("a", False, t + 0.1)
        det.record("a", True, t + 0.2)
    assert det.state("a", 11.0) is BreakerState.CLOSED


def test_error_rate_over_window_ejects() -> None:
    det = detector(
        consecutive_failures=100, error_rate_threshold=0.5, error_rate_min_requests=10, error_rate_window_s=10
    )
    for i in range(10):
        det.record("a", i % 3 == 2, 1.0 + i * 0.1)  # two in three fail, never three in a row
    assert det.state("a", 3.0) is BreakerState.OPEN


def test_error_rate_window_forgets_old_outcomes() -> None:
    det = detector(consecutive_failures=100, error_rate_min_requests=10, error_rate_window_s=10)
    for i in range(9):
        det.record("a", i >= 4, float(i))
    for i in range(10):
        det.record("a", True, 30.0 + i)  # the old failures left the window
    det.record("a", False, 41.0)
    assert det.state("a", 41.0) is BreakerState.CLOSED


def test_half_open_lets_one_trial_through_and_closes_on_success() -> None:
    det = detector(consecutive_failures=1, base_ejection_s=10)
    det.record("a", False, 0.0)
    assert not det.allows("a", 9.9)
    assert det.allows("a", 10.0)
    assert det.state("a", 10.0) is BreakerState.HALF_OPEN
    det.on_dispatch("a", 10.0)  # the trial request
    assert not det.allows("a", 10.1)  # only one trial at a time
    det.record("a", True, 10.5)
    assert det.state("a", 10.5) is BreakerState.CLOSED
    assert det.allows("a", 10.6)
    assert "a" not in det.blocking


@pytest.mark.parametrize(
    ("failures", "expected_s"),
    [(1, 10.0), (2, 20.0), (3, 40.0), (4, 60.0), (5, 60.0)],
)
def test_ejection_time_backs_off_and_is_capped(failures: int, expected_s: float) -> None:
    det = detector(consecutive_failures=1, base_ejection_s=10, backoff=2.0, max_ejection_s=60)
    now = 0.0
    det.record("a", False, now)
    for _ in range(failures - 1):
        now = det._replicas["a"].ejected_until
        assert det.allows("a", now)
        det.on_dispatch("a", now)
        det.record("a", False, now)  # the half-open trial fails: eject again, longer
    assert det._replicas["a"].ejected_until - now == pytest.approx(expected_s)


def test_backoff_resets_after_staying_healthy() -> None:
    det = detector(consecutive_failures=1, base_ejection_s=10, max_ejection_s=60)
    det.record("a", False, 0.0)
    det.record("a", False, 10.0)  # trial fails: 20 s
    det.record("a", True, 30.0)  # trial succeeds
    det.record("a", False, 200.0)  # long after: back to the base time
    assert det._replicas["a"].ejected_until == pytest.approx(210.0)


def test_never_ejects_more_than_the_allowed_fraction() -> None:
    det = detector(consecutive_failures=1, max_ejected_fraction=0.5)
    for name in FLEET:
        det.record(name, False, 1.0)
    assert len(det.blocking) == 2
    assert sum(det.allows(n, 1.5) for n in FLEET) == 2


def test_disabled_detector_records_nothing() -> None:
    det = OutlierDetector(OutlierParams(enabled=False, consecutive_failures=1))
    det.record("a", False, 0.0)
    assert det.allows("a", 0.1)


def test_policies_eject_from_on_complete_outcomes() -> None:
    """The gateway and the simulator only call on_complete(ok=...): ejection needs no extra wiring."""
    for name in ("round_robin", "least_requests", "cache_aware", "fleetgate", "p2c", "random"):
        policy = build_policy(name, {"outlier": {"consecutive_failures": 2, "base_ejection_s": 30}})
        replicas = [ReplicaSnapshot(n) for n in FLEET]
        req = RequestInfo(request_id="x", model="m", input_tokens=10)
        for n in FLEET:
            policy.on_complete(req, n, 0.0, 0.1, True)
        policy.on_complete(req, "a", 1.0, 0.0, False)
        policy.on_complete(req, "a", 1.1, 0.0, False)
        rng = random.Random(0)
        picks = set()
        for i in range(40):
            r = RequestInfo(request_id=f"q{i}", model="m", input_tokens=10, prefix_hashes=(1, i))
            d = policy.pick(r, replicas, 2.0, rng)
            policy.on_dispatch(r, d.replica, 2.0)
            picks.add(d.replica)
        assert picks and picks <= {"b", "c", "d"}, name
        # After the ejection time, one trial request reaches "a" again.
        assert any(
            policy.pick(RequestInfo(request_id=f"z{i}", model="m"), replicas, 31.5, random.Random(i)).replica
            == "a"
            for i in range(60)
        ), name


def test_outlier_detection_can_be_switched_off() -> None:
    policy = build_policy("round_robin", {"outlier": {"enabled": False}})
    req = RequestInfo(request_id="x", model="m")
    for _ in range(10):
        policy.on_complete(req, "r0", 0.0, 0.0, False)
    picks = {
        policy.pick(req, [ReplicaSnapshot("r0"), ReplicaSnapshot("r1")], 1.0, random.Random(0)).replica
        for _ in range(4)
    }
    assert picks == {"r0", "r1"}
