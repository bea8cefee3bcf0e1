"""``spill_by_share``: a cache leader's spill margin scales with the share of the prompt it holds.

Batch jobs put a short shared template (a few per cent of each prompt) in front of long unique documents;
the template's holder saves a fraction of a second of prefill but, with the unscaled margin (1.5x + 0.5 s),
kept requests that waited seconds longer there than elsewhere: that was the batch tail at light load
(docs/benchmarks.md, "Session 7: tail objective"). A leader holding a session's whole context keeps its
margin."""

from __future__ import annotations

import random

import pytest

from fleetgate.core.routing import build_policy
from fleetgate.core.routing.fleetgate import FleetgatePolicy
from fleetgate.core.routing.pickers.leader_spill import LeaderSpillParams, LeaderSpillPicker
from fleetgate.core.types import ReplicaSnapshot, RequestInfo
from fleetgate.profiles import load_profile

PROFILE = load_profile("llama2-70b-h100-tp4")
#: keeps the load guard out of the two-replica picture (as in test_routing_fleetgate's spill test)
LOOSE_GUARD = {"cached_load_bound": 10.0, "guard_exempt_ratio": 0.1}


@pytest.mark.parametrize(
    ("by_share", "share", "spills"),
    [(False, 0.1, False), (True, 0.1, True), (True, 0.95, False), (True, 1.0, False)],
)
def test_margin_scales_with_the_held_share(by_share: bool, share: float, spills: bool) -> None:
    """Leader 4 s, fastest 3 s: inside 1.5 x 3 + 0.5 = 5 s; with a tenth of the prompt held the margin is
    1.05 x 3 + 0.05 = 3.2 s (spill), with 95% it is 1.475 x 3 + 0.475 = 4.9 s (stay)."""
    picker = LeaderSpillPicker(LeaderSpillParams(spill_by_share=by_share))
    i, t, reason = picker.choose(-1, 9.0, 0, 3, 4.0, 1, 3.0, 0.0, share)
    assert (i, t, reason) == ((1, 3.0, "fleetgate:spill") if spills else (0, 4.0, "fleetgate:affinity"))
    assert picker.spills == int(spills)


def test_no_cache_leader_is_unchanged() -> None:
    """Without a cache holder the subset leader's tight rule applies either way (1.05 x best)."""
    for by_share in (False, True):
        picker = LeaderSpillPicker(LeaderSpillParams(spill_by_share=by_share))
        assert picker.choose(2, 3.1, -1, 0, 0.0, 1, 3.0, 0.0, 0.0)[0] == 2
        assert picker.choose(2, 3.3, -1, 0, 0.0, 1, 3.0, 0.0, 0.0)[0] == 1


def _req(i: int, hashes: tuple[int, ...]) -> RequestInfo:
    return RequestInfo(request_id=f"q{i}", model="m", input_tokens=len(hashes) * 512, prefix_hashes=hashes,
                       prefix_block_tokens=512, cost_mu=len(hashes) * 0.1)  # fmt: skip


@pytest.mark.parametrize(("held", "queued", "by_share", "to_holder"), [
    (2, 12, False, True), (2, 12, True, False), (36, 40, False, True), (36, 40, True, True),
])  # fmt: skip
def test_policy_spills_a_template_request_but_keeps_a_session(
    held: int, queued: int, by_share: bool, to_holder: bool
) -> None:
    """r0 holds the first ``held`` blocks of a 40-block prompt, learned from one earlier request of
    ``queued`` blocks whose prefill is still queued there; r1 is idle. Holding 2 blocks (a template) saves
    5% of the prefill: the unscaled margin keeps the request waiting behind the queued prefill (about a
    third of its own), the scaled one sends it to r1. Holding 36 blocks (a session's context) saves most
    of it: it stays with r0 either way, behind a whole 40-block prefill."""
    p = build_policy("fleetgate", {"spill_by_share": by_share, "gate": "off", **LOOSE_GUARD}, profile=PROFILE)
    assert isinstance(p, FleetgatePolicy)
    replicas = [
        ReplicaSnapshot("r0", capacity_mu_per_min=60.0),
        ReplicaSnapshot("r1", capacity_mu_per_min=60.0),
    ]
    prefix = tuple(range(held))
    p.on_dispatch(_req(1, prefix + tuple(range(1000, 1000 + queued - held))), "r0", 0.0)
    d = p.pick(_req(2, prefix + tuple(range(2000, 2040 - held))), replicas, 0.0, random.Random(0))
    assert (d.replica == "r0") == to_holder
