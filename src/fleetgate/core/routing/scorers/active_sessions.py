"""Active sessions: place a new session where fewer sessions are under way (issue 20).

A session's later turns follow its first to the replica holding its context, so where a session starts
decides where its next turns' load lands. The TTFT estimate sees only the prefill queued now; sessions that
are thinking between turns are invisible to it, so a burst of new sessions can all start on the replica
that looks fastest at that instant and come back there together (docs/benchmarks.md, "Session 17: the
default's agentic tail on vLLM").

This scorer counts the sessions each replica is carrying without any session header: every dispatched
prompt leaves its session's *ends* on its replica, the hashes of its last and second-to-last full blocks; a
request whose prompt holds a live end is that session's next turn and moves the session to its own replica;
a session expires ``active_s`` after its latest turn. (Both ends, because a client that grows one message
turn by turn leaves the message's end and the generation prompt in the last block, which the next turn does
not repeat: in session 18's live replay 0 of 311 next turns held their previous turn's last block, all 311
its second-to-last. A second-to-last end counts only with two blocks after it, or a new session whose own
part is one block would find the shared system prompt's end of another.) A continuation scores 1
everywhere (it follows its cache); a new prompt scores ``(1 + least) / (1 + active)`` per candidate, so
inside the ``fleetgate`` policy a replica carrying twice the least-loaded one's sessions costs about half the
weight (seconds) in the estimate. With ``by_tenant`` (the default) that preference is scaled by the share of
the tenant's recent requests that were next turns, so single-shot traffic (RAG, batch) is left to the
estimate: unscaled, the scorer balanced RAG prompts by count and lost their shared-document hits.

Opt-in (``scorers: [{type: active_sessions, weight: 16}]`` on ``fleetgate``): in the simulator matrix it took
3.5% off the agentic p95 and cost 3 of 117 bar cells elsewhere; live on llama-server it won on two workload
seeds and lost on one, inside the spread of the default against itself; the weight is seconds of the
simulator's overloaded cells (docs/benchmarks.md, "Session 18: new sessions placed by the sessions under
way").
"""

from __future__ import annotations

from collections import deque

from pydantic import Field

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.pipeline import PickContext, StageBase
from fleetgate.core.types import ReplicaSnapshot, RequestInfo


class ActiveSessionsParams(PluginParams):
    """Fewer sessions under way scores higher for a new session (see ``scorers.active_sessions``)."""

    active_s: float = Field(
        default=60.0, gt=0, description="Seconds a session stays active after its latest turn's dispatch."
    )
    by_tenant: bool = Field(
        default=True,
        description="Scale the preference by the tenant's recent share of next turns (0 for a tenant whose "
        "prompts never continue one another: single-shot RAG or batch traffic is left to the estimate).",
    )
    share_smoothing: float = Field(
        default=0.05, gt=0, le=1, description="Weight of each request in the tenant's next-turn share."
    )


class ActiveSessionsScorer(StageBase):
    """Sessions per replica, found by their prompts' ends; see the module docstring. Time comes in through
    ``now`` (sans-IO)."""

    name = "active_sessions"
    uses_prefix_hashes = True

    def __init__(self, params: ActiveSessionsParams | None = None) -> None:
        self.params = params or ActiveSessionsParams()
        self.active_s = self.params.active_s
        #: live session id -> (replica, dispatch time of its latest turn, that turn's last and second-to-last
        #: block hashes)
        self.sessions: dict[int, tuple[str, float, int, int | None]] = {}
        #: a live session's latest prompt's last / second-to-last block hash -> its id
        self.last_ends: dict[int, int] = {}
        self.prev_ends: dict[int, int] = {}
        #: live sessions per replica
        self.active: dict[str, int] = {}
        self._order: deque[tuple[float, int]] = deque()
        self._ids = 0
        self._last: tuple[RequestInfo | None, int | None] = (None, None)
        #: tenant -> exponentially smoothed share of its dispatched requests that were next turns
        self.next_turn_share: dict[str, float] = {}

    def parent(self, request: RequestInfo) -> int | None:
        """The live session this prompt continues (the deepest end it holds), or None for a new session.

        A second-to-last block counts only with two or more blocks after it: a new session whose own part
        is one block would otherwise find the shared system prompt's last block of a session that began
        the same way."""
        last_req, last_parent = self._last
        if last_req is request:
            return last_parent
        found = None
        if self.sessions:
            hashes = request.prefix_hashes
            last, prev = self.last_ends, self.prev_ends
            n = len(hashes)
            for i in range(n - 1, -1, -1):
                h = hashes[i]
                sid = last.get(h)
                if sid is None and i <= n - 3:
                    sid = prev.get(h)
                if sid is not None:
                    found = sid
                    break
        self._last = (request, found)
        return found

    def _end(self, sid: int) -> None:
        replica, _t, last, prev = self.sessions.pop(sid)
        self.active[replica] -= 1
        if self.last_ends.get(last) == sid:
            del self.last_ends[last]
        if prev is not None and self.prev_ends.get(prev) == sid:
            del self.prev_ends[prev]

    def _expire(self, now: float) -> None:
        edge = now - self.active_s
        order, sessions = self._order, self.sessions
        while order and order[0][0] < edge:
            t, sid = order.popleft()
            got = sessions.get(sid)
            if got is not None and got[1] == t:
                self._end(sid)

    def score(self, request: RequestInfo, candidates: list[ReplicaSnapshot], ctx: PickContext) -> list[float]:
        self._expire(ctx.now)
        if self.parent(request) is not None:
            return [1.0] * len(candidates)
        get = self.active.get
        loads = [1.0 + get(r.name, 0) for r in candidates]
        least = min(loads)
        if not self.params.by_tenant:
            return [least / v for v in loads]
        share = self.next_turn_share.get(request.tenant, 0.0)
        return [1.0 - share * (1.0 - least / v) for v in loads]

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        hashes = request.prefix_hashes
        if not hashes:
            return
        parent = self.parent(request)
        if self.params.by_tenant:
            shares = self.next_turn_share
            old_share = shares.get(request.tenant, 0.0)
            hit = 1.0 if parent is not None else 0.0
            shares[request.tenant] = old_share + (hit - old_share) * self.params.share_smoothing
        # (a prompt sent again holds its own last block, the deepest end there is: its session is the
        # parent, so a retry stays one session)
        if parent in self.sessions:
            self._end(parent)
        last = hashes[-1]
        prev = hashes[-2] if len(hashes) > 1 else None
        self._ids += 1
        sid = self._ids
        self.sessions[sid] = (replica, now, last, prev)
        self.last_ends[last] = sid
        if prev is not None:
            self.prev_ends[prev] = sid
        self.active[replica] = self.active.get(replica, 0) + 1
        self._order.append((now, sid))
        self._last = (None, None)
