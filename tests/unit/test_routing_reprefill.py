"""Opt-in re-prefill-seconds rules (session 14): the load guard's exemption (``guard_exempt_s``) and the
leader/spill picker's bound (``spill_max_reprefill_s``) in seconds of prefill a move would add, instead of
the share of the prompt the holder holds."""

from __future__ import annotations

import random

import pytest

from fleetgate.core.routing import build_policy
from fleetgate.core.routing.fleetgate import FleetgatePolicy
from fleetgate.core.routing.pickers.leader_spill import LeaderSpillParams, LeaderSpillPicker
from fleetgate.core.types import ReplicaSnapshot, RequestInfo
from fleetgate.profiles import load_profile

PROFILE = load_profile("llama2-70b-h100-tp4")  # 100 MU/min; about 8.5e-5 s of prefill per cached token


def request(i: int, hashes: tuple[int, ...] | range, **kw: object) -> RequestInfo:
    base: dict[str, object] = {
        "input_tokens": max(len(hashes), 1) * 512,
        "prefix_hashes": tuple(hashes),
        "prefix_block_tokens": 512,
        "cost_mu": 0.0,  # the profile's own prefill MU
    }
    base.update(kw)
    return RequestInfo(request_id=f"q{i}", model="m", **base)  # type: ignore[arg-type]


def policy(**params: object) -> FleetgatePolicy:
    p = build_policy("fleetgate", params, profile=PROFILE)
    assert isinstance(p, FleetgatePolicy)
    return p


def loaded_holder(p: FleetgatePolicy, held: int) -> None:
    """r0 holds a session's ``held`` blocks and carries 39 MU of recent load, r1-r3 30 MU each: r0 is
    above the load bound (1.15x the mean) and below the cached bound (1.5x)."""
    p.on_dispatch(request(1, range(1, held + 1)), "r0", 0.0)
    for j in (1, 2, 3):
        p.on_dispatch(request(10 + j, (900 + j,), cost_mu=30.0), f"r{j}", 0.0)
    so_far = p.loads.reps["r0"][0] * p.loads.scale(0.0) * p.loads.tau_s
    p.on_dispatch(request(20, (800,), cost_mu=39.0 - so_far), "r0", 0.0)


@pytest.mark.parametrize(
    ("params", "held", "new", "stays"),
    [
        ({}, 30, 10, False),  # the holder has 75% of the prompt: below `guard_exempt_ratio` 0.8, moved
        ({"guard_exempt_s": 1.0}, 30, 10, True),  # 30 blocks = 1.3 s to prefill again: kept
        ({}, 6, 2, False),
        ({"guard_exempt_s": 1.0}, 6, 2, False),  # 6 blocks = 0.26 s: a small context is moved
        ({"guard_exempt_s": 0.2}, 6, 2, True),
    ],
)
def test_guard_exemption_in_reprefill_seconds(
    params: dict[str, object], held: int, new: int, stays: bool
) -> None:
    p = policy(spill_factor=100.0, **params)  # the picker never spills: only the guard decides
    loaded_holder(p, held)
    nxt = request(2, range(1, held + new + 1))
    k, _, lim, lim_cached, _ = p.guard.limits(p.estimate.prefill_mu(nxt), 4, 0.0)
    v0 = p.loads.reps["r0"][0] * k
    assert lim < v0 < lim_cached  # the case the exemption decides
    d = p.pick(nxt, [ReplicaSnapshot(f"r{i}") for i in range(4)], 0.0, random.Random(0))
    assert (d.replica == "r0") is stays


def test_exempt_tokens_count_the_blocks_beyond_the_deepest_replica_under_the_bound() -> None:
    """The exemption's tokens: those beyond what the deepest candidate under the bound holds (where the
    request can go instead), enough to take ``guard_exempt_s`` to prefill again."""
    p = policy(guard_exempt_s=1.0)
    loaded_holder(p, 30)  # r0 over the bound, r1-r3 under it
    reps = [ReplicaSnapshot(f"r{i}") for i in range(4)]
    r = request(2, range(1, 41))
    per_token = PROFILE.alpha * (1 - PROFILE.cache_discount) / (100 / 60)  # no learned rate: the MU rate
    assert p.estimate.reprefill_s(r, reps[0], 30 * 512) == pytest.approx(30 * 512 * per_token)
    own = p.estimate.prefill_mu(r)
    k, mean, lim, _, slack = p.guard.limits(own, 4, 0.0)
    bounds = (k, mean, lim, slack, own)
    guard = p.guard
    one_s = 1.0 / per_token  # about 11.8k tokens
    # r1 (under the bound) holds a 4-block system prompt: r0's 26 blocks beyond it take 1.13 s
    got = guard.exempt_tokens(r, False, {"r0": 30, "r1": 4}, reps, bounds)
    assert got == pytest.approx(4 * 512 + one_s)
    assert got <= 30 * 512
    # r1 holds 10 blocks: r0's 20 beyond them take 0.87 s, under `guard_exempt_s`
    assert guard.exempt_tokens(r, False, {"r0": 30, "r1": 10}, reps, bounds) > 30 * 512
    # r1 holds as much as r0: a move costs nothing, nobody over the bound is deeper
    assert guard.exempt_tokens(r, False, {"r0": 30, "r1": 30}, reps, bounds) == float("inf")
    # a hot key gets no exemption; a holder that is not a candidate does not count
    assert guard.exempt_tokens(r, True, {"r0": 30}, reps, bounds) == float("inf")
    assert guard.exempt_tokens(r, False, {"r0": 30, "r9": 30}, reps, bounds) == pytest.approx(one_s)
    # without the option: the share of the prompt
    assert policy().guard.exempt_tokens(r, False, {"r0": 30}, reps) == pytest.approx(0.8 * 40 * 512)


@pytest.mark.parametrize(
    ("bound", "best_wait", "move_s", "spills"),
    [
        (None, 5.0, 9.0, True),  # no bound: the factor rule
        (1.0, 5.0, 2.0, False),  # the spill would prefill 2 s of context again onto a queued replica
        (1.0, 5.0, 0.5, True),  # a small context spills
        (1.0, 0.0, 2.0, True),  # onto a replica with nothing queued it spills as before
    ],
)
def test_spill_bound_in_reprefill_seconds(
    bound: float | None, best_wait: float, move_s: float, spills: bool
) -> None:
    picker = LeaderSpillPicker(LeaderSpillParams(spill_max_reprefill_s=bound))
    got, _, reason = picker.choose("sub", 20.0, "deep", 30, 20.0, "best", 6.0, best_wait, 0.75, move_s)
    assert (got, reason) == (("best", "fleetgate:spill") if spills else ("deep", "fleetgate:affinity"))


@pytest.mark.parametrize(("bound", "held", "spills"), [(None, 24, True), (1.0, 24, False), (1.0, 6, True)])
def test_policy_keeps_a_large_context_on_its_leader(bound: float | None, held: int, spills: bool) -> None:
    """The leader r0 has a long queue; r1 (a short queue, more than 1.5x + 0.5 s faster) would take a
    spill. With the seconds bound a 24-block context (about 1 s to prefill again on r1) stays; a 6-block
    one spills. No load guard, no wait bound: only the picker decides."""
    p = policy(spill_max_reprefill_s=bound, spill_max_wait_s=None, load_bound=100.0, cached_load_bound=100.0)
    p.on_dispatch(request(1, range(1, held + 1)), "r0", 0.0)
    for i in range(12):
        p.on_dispatch(request(100 + i, (5000 + i,), input_tokens=16000), "r0", 0.0)
    for j in (1, 2, 3):
        p.on_dispatch(request(10 + j, (900 + j,), input_tokens=4000), f"r{j}", 0.0)
    d = p.pick(
        request(2, range(1, held + 3)), [ReplicaSnapshot(f"r{i}") for i in range(4)], 0.0, random.Random(0)
    )
    assert (d.replica != "r0") is spills
