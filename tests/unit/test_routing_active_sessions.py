"""``active_sessions``: sessions counted from prompt chains alone, continuations followed, ends expiring."""

from __future__ import annotations

import random

import pytest

from fleetgate.core.routing import build_policy
from fleetgate.core.routing.pipeline import PickContext
from fleetgate.core.routing.scorers.active_sessions import ActiveSessionsParams, ActiveSessionsScorer
from fleetgate.core.types import ReplicaSnapshot, RequestInfo
from fleetgate.profiles import load_profile

REPS = [ReplicaSnapshot("r0"), ReplicaSnapshot("r1"), ReplicaSnapshot("r2")]


def _req(rid: str, hashes: tuple[int, ...]) -> RequestInfo:
    return RequestInfo(request_id=rid, model="m", prefix_hashes=hashes, prefix_block_tokens=16)


def _ctx(now: float) -> PickContext:
    return PickContext(now, None, frozenset())


def test_new_prompts_score_by_sessions_under_way() -> None:
    s = ActiveSessionsScorer(ActiveSessionsParams(by_tenant=False))
    system = (1, 2, 3)
    # Three sessions of one tenant's system prompt: two start on r0, one on r1.
    for i, rep in enumerate(("r0", "r0", "r1")):
        req = _req(f"a{i}", (*system, 100 + i))
        assert s.score(req, REPS, _ctx(float(i))) == pytest.approx(
            [(1 + min(s.active.get(r.name, 0) for r in REPS)) / (1 + s.active.get(r.name, 0)) for r in REPS]
        )
        s.on_dispatch(req, rep, float(i))
    assert s.active == {"r0": 2, "r1": 1}
    fresh = _req("b", (*system, 200))
    assert s.score(fresh, REPS, _ctx(3.0)) == pytest.approx([1 / 3, 1 / 2, 1.0])


def test_a_next_turn_follows_its_cache_and_moves_its_session() -> None:
    s = ActiveSessionsScorer()
    first = _req("t1", (1, 2, 3, 100))
    s.on_dispatch(first, "r0", 0.0)
    # The next turn extends the first turn's prompt: it is not a new session, so no replica is preferred.
    second = _req("t2", (1, 2, 3, 100, 101, 102))
    assert s.parent(second) == 100
    assert s.score(second, REPS, _ctx(5.0)) == [1.0, 1.0, 1.0]
    # Sent elsewhere (a spill), the session goes with it: still one session, now on r2.
    s.on_dispatch(second, "r2", 5.0)
    assert s.active == {"r0": 0, "r2": 1}
    assert s.ends == {102: ("r2", 5.0)}


def test_sessions_expire_after_active_s_from_their_latest_turn() -> None:
    s = ActiveSessionsScorer(ActiveSessionsParams(active_s=10.0, by_tenant=False))
    s.on_dispatch(_req("a", (1, 100)), "r0", 0.0)
    s.on_dispatch(_req("b", (1, 200)), "r1", 4.0)
    s.on_dispatch(_req("a2", (1, 100, 101)), "r0", 8.0)  # session a's next turn: active again from 8 s
    probe = _req("c", (1, 300))
    s.score(probe, REPS, _ctx(12.0))  # 12 s: a (8 s) and b (4 s) are both within 10 s
    assert s.active == {"r0": 1, "r1": 1}
    assert s.score(probe, REPS, _ctx(15.0)) == pytest.approx([0.5, 1.0, 1.0])  # b expired at 14 s
    assert s.active == {"r0": 1, "r1": 0}
    s.score(probe, REPS, _ctx(18.5))
    assert s.active == {"r0": 0, "r1": 0} and not s.ends


def test_by_tenant_leaves_single_shot_tenants_to_the_estimate() -> None:
    """A tenant whose prompts never extend one another (RAG, batch) gets no preference; a tenant whose
    requests are mostly next turns gets nearly the whole one."""
    s = ActiveSessionsScorer(ActiveSessionsParams(by_tenant=True, share_smoothing=0.5))
    rag = [
        RequestInfo(request_id=f"q{i}", model="m", tenant="rag", prefix_hashes=(7, 8, 900 + i))
        for i in range(4)
    ]
    for i, req in enumerate(rag):
        s.on_dispatch(req, "r0", float(i))
    assert s.next_turn_share["rag"] == 0.0
    probe = RequestInfo(request_id="p", model="m", tenant="rag", prefix_hashes=(7, 8, 999))
    assert s.score(probe, REPS, _ctx(5.0)) == [1.0, 1.0, 1.0]
    chain: tuple[int, ...] = (1, 2)
    for i in range(4):  # one agent session of four turns on r1
        chain = (*chain, 50 + i)
        s.on_dispatch(
            RequestInfo(request_id=f"a{i}", model="m", tenant="agent", prefix_hashes=chain), "r1", 6.0
        )
    share = s.next_turn_share["agent"]
    assert share == pytest.approx(0.875)  # three next turns after a first, each weighing half
    fresh = RequestInfo(request_id="f", model="m", tenant="agent", prefix_hashes=(1, 2, 77))
    # r0 carries the four RAG prompts, r1 the agent's session, r2 nothing.
    assert s.score(fresh, REPS, _ctx(7.0)) == pytest.approx([1 - share * (1 - 1 / 5), 1 - share * 0.5, 1.0])


def test_fleetgate_starts_a_new_session_beside_fewer_sessions() -> None:
    """Two idle replicas that both hold the tenant's system prompt: the estimate ties, and with the scorer
    the new session goes to the replica carrying fewer sessions, whichever that is."""
    profile = load_profile("llama2-70b-h100-tp4")
    system = (1, 2, 3, 4)
    params = {"gate": "off", "scorers": [{"type": "active_sessions", "weight": 10.0, "by_tenant": False}]}
    for busy, free in (("r0", "r1"), ("r1", "r0")):
        policy = build_policy("fleetgate", params, profile=profile)
        reps = [ReplicaSnapshot("r0"), ReplicaSnapshot("r1")]
        prompts = [(*system, 100), (*system, 101), (*system, 102)]
        for i, (hashes, rep) in enumerate(zip(prompts, (busy, busy, free), strict=True)):
            req = RequestInfo(
                request_id=f"s{i}",
                model="m",
                input_tokens=16 * len(hashes),
                cost_mu=0.1,
                prefix_hashes=hashes,
                prefix_block_tokens=16,
            )
            policy.on_dispatch(req, rep, float(i))
            policy.on_complete(req, rep, float(i) + 0.5, 0.1, True)
        new = RequestInfo(
            request_id="n",
            model="m",
            input_tokens=80,
            cost_mu=0.1,
            prefix_hashes=(*system, 200),
            prefix_block_tokens=16,
        )
        assert policy.pick(new, reps, 10.0, random.Random(0)).replica == free
