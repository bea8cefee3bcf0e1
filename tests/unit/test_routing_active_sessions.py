"""``active_sessions``: sessions counted from prompt chains alone, continuations followed, ends expiring.

Prompts here are block-hash chains as the gateway hashes a chat: the shared system prompt, the session's
own blocks, and a last block that holds the template's generation prompt (a hash no later turn repeats).
"""

from __future__ import annotations

import itertools
import random

import pytest

from fleetgate.core.routing import build_policy
from fleetgate.core.routing.pipeline import PickContext
from fleetgate.core.routing.scorers.active_sessions import ActiveSessionsParams, ActiveSessionsScorer
from fleetgate.core.tokenize import count_and_hash_chat
from fleetgate.core.types import ReplicaSnapshot, RequestInfo
from fleetgate.profiles import load_profile

REPS = [ReplicaSnapshot("r0"), ReplicaSnapshot("r1"), ReplicaSnapshot("r2")]
SYSTEM = (1, 2, 3)
_TAILS = itertools.count(10_000)


def _prompt(*blocks: int) -> tuple[int, ...]:
    """A prompt's block hashes: the system prompt, ``blocks``, and a fresh generation-prompt block."""
    return (*SYSTEM, *blocks, next(_TAILS))


def _req(rid: str, hashes: tuple[int, ...], tenant: str = "t") -> RequestInfo:
    return RequestInfo(request_id=rid, model="m", tenant=tenant, prefix_hashes=hashes, prefix_block_tokens=16)


def _ctx(now: float) -> PickContext:
    return PickContext(now, None, frozenset())


def test_new_prompts_score_by_sessions_under_way() -> None:
    s = ActiveSessionsScorer(ActiveSessionsParams(by_tenant=False))
    # Three sessions of one tenant's system prompt: two start on r0, one on r1.
    for i, rep in enumerate(("r0", "r0", "r1")):
        req = _req(f"a{i}", _prompt(100 + 2 * i, 101 + 2 * i))
        assert s.parent(req) is None
        s.on_dispatch(req, rep, float(i))
    assert s.active == {"r0": 2, "r1": 1}
    fresh = _req("b", _prompt(200, 201))
    assert s.score(fresh, REPS, _ctx(3.0)) == pytest.approx([1 / 3, 1 / 2, 1.0])


def test_a_next_turn_follows_its_cache_and_moves_its_session() -> None:
    s = ActiveSessionsScorer()
    first = _req("t1", _prompt(100, 101))
    s.on_dispatch(first, "r0", 0.0)
    # The next turn extends the first turn's prompt (without its generation prompt): not a new session, so
    # no replica is preferred.
    second = _req("t2", _prompt(100, 101, 102, 103))
    assert s.parent(second) is not None
    assert s.score(second, REPS, _ctx(5.0)) == [1.0, 1.0, 1.0]
    # Sent elsewhere (a spill), the session goes with it: still one session, now on r2.
    s.on_dispatch(second, "r2", 5.0)
    assert s.active == {"r0": 0, "r2": 1}
    assert [(rep, t) for rep, t, _last, _prev in s.sessions.values()] == [("r2", 5.0)]
    assert s.parent(_req("t3", _prompt(100, 101, 102, 103, 104))) is not None


def test_sessions_expire_after_active_s_from_their_latest_turn() -> None:
    s = ActiveSessionsScorer(ActiveSessionsParams(active_s=10.0, by_tenant=False))
    s.on_dispatch(_req("a", _prompt(100, 101)), "r0", 0.0)
    s.on_dispatch(_req("b", _prompt(200, 201)), "r1", 4.0)
    s.on_dispatch(_req("a2", _prompt(100, 101, 102)), "r0", 8.0)  # a's next turn: active again from 8 s
    probe = _req("c", _prompt(300, 301))
    s.score(probe, REPS, _ctx(12.0))  # 12 s: a (8 s) and b (4 s) are both within 10 s
    assert s.active == {"r0": 1, "r1": 1}
    assert s.score(probe, REPS, _ctx(15.0)) == pytest.approx([0.5, 1.0, 1.0])  # b expired at 14 s
    assert s.active == {"r0": 1, "r1": 0}
    s.score(probe, REPS, _ctx(18.5))
    assert s.active == {"r0": 0, "r1": 0} and not s.sessions


def test_by_tenant_leaves_single_shot_tenants_to_the_estimate() -> None:
    """A tenant whose prompts never extend one another (RAG, batch) gets no preference; a tenant whose
    requests are mostly next turns gets nearly the whole one."""
    s = ActiveSessionsScorer(ActiveSessionsParams(by_tenant=True, share_smoothing=0.5))
    for i in range(4):
        s.on_dispatch(_req(f"q{i}", (7, 8, 900 + 2 * i, 901 + 2 * i, next(_TAILS)), "rag"), "r0", float(i))
    assert s.next_turn_share["rag"] == 0.0
    probe = _req("p", (7, 8, 990, 991, next(_TAILS)), "rag")
    assert s.score(probe, REPS, _ctx(5.0)) == [1.0, 1.0, 1.0]
    own: tuple[int, ...] = (50,)
    for i in range(4):  # one agent session of four turns on r1
        own = (*own, 51 + i)
        s.on_dispatch(_req(f"a{i}", _prompt(*own), "agent"), "r1", 6.0)
    share = s.next_turn_share["agent"]
    assert share == pytest.approx(0.875)  # three next turns after a first, each weighing half
    fresh = _req("f", _prompt(77, 78), "agent")
    # r0 carries the four RAG prompts, r1 the agent's session, r2 nothing.
    assert s.score(fresh, REPS, _ctx(7.0)) == pytest.approx([1 - share * (1 - 1 / 5), 1 - share * 0.5, 1.0])


def test_fleetgate_starts_a_new_session_beside_fewer_sessions() -> None:
    """Two idle replicas that both hold the tenant's system prompt: the estimate ties, and with the scorer
    the new session goes to the replica carrying fewer sessions, whichever that is."""
    profile = load_profile("llama2-70b-h100-tp4")
    params = {"gate": "off", "scorers": [{"type": "active_sessions", "weight": 10.0, "by_tenant": False}]}
    for busy, free in (("r0", "r1"), ("r1", "r0")):
        policy = build_policy("fleetgate", params, profile=profile)
        reps = [ReplicaSnapshot("r0"), ReplicaSnapshot("r1")]
        prompts = [_prompt(100, 101), _prompt(102, 103), _prompt(104, 105)]
        for i, (hashes, rep) in enumerate(zip(prompts, (busy, busy, free), strict=True)):
            req = RequestInfo(
                request_id=f"s{i}", model="m", input_tokens=16 * len(hashes), cost_mu=0.1,
                prefix_hashes=hashes, prefix_block_tokens=16,
            )  # fmt: skip
            policy.on_dispatch(req, rep, float(i))
            policy.on_complete(req, rep, float(i) + 0.5, 0.1, True)
        new = RequestInfo(
            request_id="n", model="m", input_tokens=96, cost_mu=0.1, prefix_hashes=_prompt(200, 201),
            prefix_block_tokens=16,
        )  # fmt: skip
        assert policy.pick(new, reps, 10.0, random.Random(0)).replica == free


@pytest.mark.parametrize("one_message", [False, True], ids=["messages", "one-growing-message"])
def test_next_turns_of_a_chat_are_found_in_the_gateway_s_own_hashes(one_message: bool) -> None:
    """The shipped path: the gateway hashes the rendered chat. A client may send each turn as new messages
    or (as bench/replay's synthesised prompts do) as one user message that grows; then the last block of a
    turn holds the message's end and the generation prompt, which the next turn does not repeat, and each
    next turn must still find its session."""
    s = ActiveSessionsScorer(ActiveSessionsParams(by_tenant=False))
    words = " ".join(f"word{i}" for i in range(120))
    system = {"role": "system", "content": "You are a coding agent. " + words}
    turns = ["Fix the failing test in module one, " + words]
    for turn in range(4):
        if one_message:
            messages = [system, {"role": "user", "content": " ".join(turns)}]
        else:
            messages = [system] + [
                {"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(turns)
            ]
        _text, _n, hashes = count_and_hash_chat(messages, 16)
        req = _req(f"turn{turn}", hashes)
        assert (s.parent(req) is None) == (turn == 0)
        s.on_dispatch(req, "r0", float(turn))
        assert s.active == {"r0": 1}
        turns += [f"Answer {turn}: " + words, f"Tool result {turn}: " + words]


def test_a_one_block_session_start_is_not_taken_for_another_session_s_next_turn() -> None:
    """Two sessions of one system prompt whose own parts are one block each: the second is new, although
    its prompt holds the first's second-to-last block (the system prompt's end)."""
    s = ActiveSessionsScorer(ActiveSessionsParams(by_tenant=False))
    s.on_dispatch(_req("a", (*SYSTEM, 100)), "r0", 0.0)
    b = _req("b", (*SYSTEM, 200))
    assert s.parent(b) is None
    s.on_dispatch(b, "r1", 1.0)
    assert s.active == {"r0": 1, "r1": 1}
