"""Tail bound: no new request for a replica whose oldest unanswered request is long past its first token.

The TTFT estimate is a model (a fluid prefill queue at a learned rate); when the engine stops following it
(KV memory full and a long prompt at the head of its queue, a replica that slowed while its learned rate
stayed stale because it never ran a request alone again) the estimate keeps promising seconds while the
replica's queue waits minutes, and first-token feedback corrects it only when a first token finally comes
back. The one fact that contradicts the model as it happens is a request that is *overdue*: dispatched,
expected to have its first token by time ``e`` (the estimate's fluid queue end on that replica after its
dispatch), and still without one at ``now > e``. Engines prefill in arrival order, so every request sent
there now waits behind it.

The filter keeps a candidate only while its oldest unanswered request is overdue by at most
``tail_bound_factor`` x the candidates' median overdue + ``tail_bound_s``: usually every replica is on time
(overdue 0) and nothing is dropped; a stuck replica loses new requests, its key's affinity subset and
its cache pull until its queue moves again, and a fleet where most replicas are late keeps them (the
median, not the least overdue: with the least, one replica that had just answered drew every request of an
overloaded fleet onto itself: docs/benchmarks.md, "Session 9"). It acts
before the load guard, which would otherwise send requests *to* a stuck replica: it serves little, so its
recent MU looks light against the others'.

A first token answers its request and every request dispatched to that replica before it (first come,
first served); a completion answers its own. Only streamed requests (``RequestInfo.stream``) are waited
for: the gateway reports no first token for the others, which would look unanswered until they complete.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from statistics import median

from pydantic import Field

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.pipeline import PickContext, StageBase
from fleetgate.core.routing.rates import ReplicaLoads
from fleetgate.core.types import ReplicaSnapshot, RequestInfo


class TailBoundParams(PluginParams):
    """The tail bound (see ``core.routing.filters.tail_bound``); off unless ``tail_bound_s`` is set."""

    tail_bound_s: float | None = Field(
        default=None,
        ge=0,
        description="Drop a replica whose oldest unanswered request is more than this many seconds (plus "
        "`tail_bound_factor` x the candidates' median overdue) past its estimated first token. Unset: off.",
    )
    tail_bound_factor: float = Field(
        default=2.0, ge=1.0, description="How far past the candidates' median overdue a replica may be, x."
    )
    tail_bound_keep_share: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="A replica expected to hold at least this share of the prompt is kept however late (a "
        "session's context: moving it re-prefills it). Unset: none kept.",
    )


class TailBound(StageBase):
    """The filter plus its bookkeeping: per replica, the unanswered requests in dispatch order with the time
    each was expected to have its first token."""

    name = "tail_bound"

    def __init__(self, params: TailBoundParams, loads: ReplicaLoads | None = None) -> None:
        if params.tail_bound_s is None:
            raise ValueError("tail_bound needs tail_bound_s")
        self.params = params
        self.slack_s = params.tail_bound_s
        self.factor = params.tail_bound_factor
        self.keep_share = params.tail_bound_keep_share
        self.loads = loads
        self._pending: dict[str, dict[str, float]] = {}  # replica -> request id -> expected first token
        self._replica_of: dict[str, str] = {}
        # (expected first token, request id) of every expectation, a min-heap: entries answered since are
        # dropped when they reach the top. Its least unanswered entry bounds every replica's overdue.
        self._due: list[tuple[float, str]] = []
        self.dropped = 0  # candidates dropped (all picks)

    # -- the rule ------------------------------------------------------------------------------------

    def overdue_s(self, replica: str, now: float) -> float:
        """Seconds the replica's oldest unanswered request is past its expected first token (0 if none)."""
        pending = self._pending.get(replica)
        if not pending:
            return 0.0
        late = now - next(iter(pending.values()))
        return late if late > 0.0 else 0.0

    def _all_within_slack(self, now: float) -> bool:
        """No unanswered request on any replica is more than ``tail_bound_s`` overdue, so every candidate is
        within the bound (the usual case, answered without a pass over the candidates)."""
        due = self._due
        pending = self._pending
        replica_of = self._replica_of
        slack = self.slack_s
        while due:
            expected, rid = due[0]
            if now - expected <= slack:  # (the least expected time: the largest overdue)
                return True
            replica = replica_of.get(rid)
            if replica is not None and pending[replica].get(rid) == expected:
                return False
            heapq.heappop(due)  # answered (or re-expected) since
        return True

    def keep(
        self,
        candidates: list[ReplicaSnapshot],
        now: float,
        request: RequestInfo | None = None,
        depths: Callable[[RequestInfo], tuple[Mapping[str, int] | None, object]] | None = None,
    ) -> list[ReplicaSnapshot]:
        """The candidates within the bound (the input list itself when all are). With
        ``tail_bound_keep_share``, ``depths(request)`` (the TTFT estimate's expected cached blocks per
        replica) names the replicas that hold that share of the prompt, kept whatever their overdue."""
        if not self._replica_of or self._all_within_slack(now):
            return candidates
        late = [self.overdue_s(r.name, now) for r in candidates]
        top = max(late)
        if top <= self.slack_s:
            return candidates
        limit = self.factor * median(late) + self.slack_s
        if top <= limit:
            return candidates
        share = self.keep_share
        held: Mapping[str, int] | None = None
        need = 0
        if share is not None and request is not None and depths is not None and request.input_tokens > 0:
            held = depths(request)[0]
            need = math.ceil(share * request.input_tokens / max(request.prefix_block_tokens, 1))
        if held:
            kept = [
                r for r, x in zip(candidates, late, strict=True) if x <= limit or held.get(r.name, 0) >= need
            ]
        else:
            kept = [r for r, x in zip(candidates, late, strict=True) if x <= limit]
        self.dropped += len(candidates) - len(kept)
        return kept

    def filter(
        self, request: RequestInfo, candidates: list[ReplicaSnapshot], ctx: PickContext
    ) -> list[ReplicaSnapshot]:
        return self.keep(candidates, ctx.now)

    # -- hooks ---------------------------------------------------------------------------------------

    def expect(self, request: RequestInfo, replica: str, expected_s: float) -> None:
        """Record a dispatch expected to have its first token at ``expected_s`` (streamed requests only)."""
        rid = request.request_id
        if not rid or not request.stream:
            return  # only a streamed request reports its first token (the gateway's ``first_token``)
        if rid in self._replica_of:
            self._answer(rid)  # a retry: the earlier attempt is no longer waited for
        if len(self._replica_of) > 100_000:  # outcomes that never came back: forget them
            self._pending.clear()
            self._replica_of.clear()
            self._due.clear()
        elif len(self._due) > 4 * len(self._replica_of) + 4096:  # answered entries held behind a late one
            self._due = [(e, r) for p in self._pending.values() for r, e in p.items()]
            heapq.heapify(self._due)
        pending = self._pending.get(replica)
        if pending is None:
            pending = self._pending[replica] = {}
        pending[rid] = expected_s
        self._replica_of[rid] = replica
        heapq.heappush(self._due, (expected_s, rid))

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        """As a plain pipeline filter: expect the first token at the replica's fluid queue end (the TTFT
        estimate's, which a pipeline's ``ttft`` scorer feeds) or now."""
        st = self.loads.reps.get(replica) if self.loads is not None else None
        self.expect(request, replica, st[1] if st is not None and st[1] > now else now)

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        pending = self._pending.get(replica)
        rid = request.request_id
        if pending is None or rid not in pending:
            return
        drop = self._replica_of.pop
        for key in list(pending):  # first come, first served: everything dispatched before it has started
            del pending[key]
            drop(key, None)
            if key == rid:
                break

    def on_complete(self, request: RequestInfo, replica: str, now: float, cost_mu: float, ok: bool) -> None:
        self._answer(request.request_id)

    def _answer(self, rid: str) -> None:
        replica = self._replica_of.pop(rid, None)
        if replica is not None:
            self._pending[replica].pop(rid, None)
