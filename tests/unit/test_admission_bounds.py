"""Estimates below the bound cannot be gamed into overshooting a limit (issue 22, finding 4).

The game from the report: a tenant teaches the gateway that its answers are one token long (its output p90),
then sends 37 concurrent requests with ``max_tokens: 3000`` that each run to 3,000 tokens. Each is estimated
at the p90 (a tiny cost) but costs its whole bound. A 100 MU/min reservation must still admit no more than
its limit plus one request in any 60 s window, counted in real (settled) cost.
"""

from __future__ import annotations

from fleetgate.core.admission import AdmissionSettings, Decision, LocalAdmission, TenantLimits
from fleetgate.core.types import RequestInfo
from fleetgate.core.units import DEFAULT_PROFILE

LIMIT = 100.0  # MU/min
RUN_S = 20.0  # how long each 3,000-token answer takes


def play(bound_of: int | None, context: int, concurrent: int = 37) -> list[tuple[float, float]]:
    """Returns (admitted at, settled MU) of every admitted request; time advances in 50 ms steps."""
    la = LocalAdmission(AdmissionSettings(default_deadline_s=10.0))
    acme = TenantLimits("acme", reserved_mu_per_min={"m": LIMIT})
    p = DEFAULT_PROFILE
    estimate = p.cost(200, 1)  # the p90 says one token
    out_max = min(bound_of, context) if bound_of is not None else context
    bound = p.cost(200, out_max)
    actual = p.cost(200, out_max)  # and it really runs to the end of its budget
    admitted: list[tuple[float, float]] = []
    running: list[tuple[float, RequestInfo, Decision]] = []
    t = 0.0
    # the teaching phase: 20 one-token requests, one after the other
    for i in range(20):
        r = RequestInfo(
            f"teach{i}", "m", tenant="acme", cost_mu=estimate, max_output_tokens=1, bound_mu=p.cost(200, 1)
        )
        d = la.submit(acme, r, t)
        while d is None:
            t += 0.05
            done = la.poll(t)
            d = done[0][1] if done else None
        assert d.allowed
        la.settle(acme, r, d, estimate, t)
        admitted.append((t, estimate))
    t += 60.0  # a quiet minute
    requests = [
        RequestInfo(
            f"big{i}", "m", tenant="acme", cost_mu=estimate, max_output_tokens=bound_of, bound_mu=bound
        )
        for i in range(concurrent)
    ]
    retry: list[tuple[float, RequestInfo]] = [
        (t, r) for r in requests
    ]  # refused ones retry after Retry-After
    end = t + 180.0
    while t < end:
        for item in [x for x in retry if x[0] <= t]:
            retry.remove(item)
            d = la.submit(acme, item[1], t)
            if d is not None:
                if d.allowed:
                    running.append((t, item[1], d))
                else:
                    retry.append((t + d.retry_after_s, item[1]))
        t = round(t + 0.05, 6)
        for r, d in la.poll(t):
            if d.allowed:
                running.append((t, r, d))
            else:
                retry.append((t + d.retry_after_s, r))
        for item in [x for x in running if x[0] + RUN_S <= t]:
            running.remove(item)
            at, r, d = item
            la.settle(acme, r, d, actual, t)
            admitted.append((at, actual))
    return admitted


def worst_window(admitted: list[tuple[float, float]]) -> float:
    events = sorted(admitted)
    return max(sum(c for t1, c in events if t0 <= t1 < t0 + 60.0) for t0, _ in events)


def test_max_tokens_game_stays_within_limit_plus_one_request() -> None:
    admitted = play(3000, context=131072)
    one = DEFAULT_PROFILE.cost(200, 3000)
    assert worst_window(admitted) <= LIMIT + one + 1e-6
    # ... and the limit is still usable: about LIMIT / one requests a minute get through
    assert sum(1 for _t, c in admitted if c == one) >= 2 * LIMIT / one


def test_no_max_tokens_is_budgeted_at_the_context_length() -> None:
    admitted = play(None, context=3000)
    one = DEFAULT_PROFILE.cost(200, 3000)
    assert worst_window(admitted) <= LIMIT + one + 1e-6


def test_a_lone_request_keeps_its_estimate() -> None:
    """One request at a time (the common case) is charged its estimate, not its bound."""
    la = LocalAdmission()
    acme = TenantLimits("acme", reserved_mu_per_min={"m": LIMIT})
    r = RequestInfo("a", "m", tenant="acme", cost_mu=1.0, max_output_tokens=3000, bound_mu=30.0)
    d = la.submit(acme, r, 0.0)
    assert d is not None and d.allowed
    assert la.buckets.states["fleetgate:res:acme:m"].level == 1.0
    la.settle(acme, r, d, 2.0, 1.0)
    assert la.buckets.states["fleetgate:res:acme:m"].level == 1.0  # 2 charged, 1 s drained (100/60 MU/s)
