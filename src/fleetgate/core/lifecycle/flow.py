"""``Lifecycle``: one request's way through one deployment, without I/O.

    estimate -> (admission, the driver's) -> start -> hold/release (dispatch gate) -> route -> dispatch
    -> first_token -> finish (per attempt) -> settle | release

The gateway (``gateway/proxy.py``: sockets, retries, streaming) and the simulator (``sim/des.py``: simulated
clock, engine models) both drive this object, so the counters the router reads, the cost estimate, the
output-length history, the autoscaler's demand meter, the dispatch gate and the routing policy's hooks
change in the same order and by the same rules in both; ``tests/sim/test_parity.py`` compares the two call
traces. The drivers keep only their I/O: when to call, and with which clock reading.

Every method takes the time as an argument; nothing here sleeps, reads a clock or draws randomness of its
own (``route`` is given the driver's random source).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fleetgate.core.autoscale.demand import DemandMeter
from fleetgate.core.lifecycle.history import SortedOutputHistory
from fleetgate.core.lifecycle.observers import LifecycleObserver
from fleetgate.core.routing.base import RoutingPolicy
from fleetgate.core.types import RandomSource, ReplicaSnapshot, RequestInfo, RouteDecision, Usage
from fleetgate.core.units import CostProfile

T = TypeVar("T")


@dataclass(slots=True, kw_only=True)
class ReplicaLoad:
    """The per-replica counters the lifecycle keeps: load the router reads (in flight, never lagging a
    scrape) and the outcome streak the outlier filters read. ``gateway.fleet.ReplicaState`` and
    ``sim.entities.SimReplica`` extend it with their own fields; only ``Lifecycle`` calls
    ``begin``/``end``."""

    inflight_requests: int = 0
    inflight_mu: float = 0.0
    completed: int = 0
    failed: int = 0
    consecutive_failures: int = 0
    last_success_s: float | None = None

    def begin(self, cost_mu: float) -> None:
        self.inflight_requests += 1
        self.inflight_mu += cost_mu

    def end(self, cost_mu: float, ok: bool, now: float) -> None:
        self.inflight_requests -= 1
        # at zero in flight the sum is reset, so float drift never accumulates (``max(left, 0.0)``)
        if self.inflight_requests:
            left = self.inflight_mu - cost_mu
            self.inflight_mu = 0.0 if left < 0.0 else left
        else:
            self.inflight_mu = 0.0
        if ok:
            self.completed += 1
            self.consecutive_failures = 0
            self.last_success_s = now
        else:
            self.failed += 1
            self.consecutive_failures += 1


class Lifecycle(Generic[T]):
    """The request lifecycle of one deployment (see the module docstring).

    ``snapshots`` returns the replicas as the router sees them now (the driver's registry). ``history`` is
    the per-tenant output-length record behind the estimate (the gateway shares one across deployments).
    ``demand`` (optional) is the autoscaler's meter: MU started and settled. ``observers`` are told about
    every dispatch, first token and completion after the policy. ``T`` is what the driver parks in the
    dispatch gate (a future in the gateway, a request index in the simulator).
    """

    __slots__ = (
        "_complete_hooks",
        "_dispatch_hooks",
        "_first_token_hooks",
        "_gate",
        "_settled",
        "demand",
        "gated",
        "history",
        "observers",
        "policy",
        "profile",
        "snapshots",
    )

    def __init__(
        self,
        policy: RoutingPolicy,
        profile: CostProfile,
        *,
        snapshots: Callable[[], Sequence[ReplicaSnapshot]],
        history: SortedOutputHistory | None = None,
        demand: DemandMeter | None = None,
        observers: Sequence[LifecycleObserver] = (),
    ) -> None:
        self.policy = policy
        self.profile = profile
        self.snapshots = snapshots
        self.history = history if history is not None else SortedOutputHistory()
        self.demand = demand
        self.observers = tuple(observers)
        # The hooks each event calls, policy first, bound once (policy and observers are fixed at
        # construction; these run for every request in both drivers).
        self._dispatch_hooks = (policy.on_dispatch, *(o.on_dispatch for o in self.observers))
        self._first_token_hooks = (policy.on_first_token, *(o.on_first_token for o in self.observers))
        self._complete_hooks = tuple(o.on_complete for o in self.observers)
        self._gate: Any = policy.gate
        #: whether the policy has a dispatch gate (``core.routing.gate``)
        self.gated = self._gate is not None
        # (usage, profile, its settled MU) of the last settlement: the gateway's ``finish`` and ``settle`` of
        # one request settle the same (immutable) usage, so the second is a lookup
        self._settled: tuple[Usage | None, CostProfile | None, float] = (None, None, 0.0)

    # -- before routing -------------------------------------------------------------------------------------

    def estimate(
        self, tenant: str, input_tokens: int, max_output_tokens: int | None = None, image_tokens: int = 0
    ) -> tuple[float, float]:
        """(expected output tokens, estimated MU) of a request before it runs: the output budget is
        ``min(max_tokens, the tenant's observed p90)`` (``CostProfile.expected_output_tokens``)."""
        profile = self.profile
        expected = profile.expected_output_tokens(max_output_tokens, self.history.p90(tenant))
        if image_tokens:
            return expected, profile.cost(input_tokens, expected, image_tokens=image_tokens)
        return expected, profile.cost(input_tokens, expected)

    def start(self, request: RequestInfo) -> None:
        """The request was admitted: its estimate counts as demand until ``settle``/``release``."""
        if self.demand is not None:
            self.demand.start(request.cost_mu)

    # -- the dispatch gate ----------------------------------------------------------------------------------

    def held(self) -> int:
        """Requests held in the gate now."""
        return 0 if self._gate is None else len(self._gate)

    def backlog_s(self, now: float) -> float:
        """The policy's seconds until a replica can start a new prefill (what the gate waits on)."""
        return self.policy.backlog_s(self.snapshots(), now)

    def hold(self, item: T, request: RequestInfo, now: float) -> bool:
        """Park ``item`` in the gate when the fleet is saturated (True), else the request routes now."""
        gate = self._gate
        if gate is None or not gate.should_hold(self.policy.backlog_s(self.snapshots(), now)):
            return False
        gate.push(item, self.policy.gate_prefill_s(request), now)
        return True

    def release(self, backlog_s: float, now: float) -> T | None:
        """The next held item to route, or ``None`` while every replica is still busy (``backlog_s``)."""
        item: T | None = self._gate.pop(backlog_s, now)
        return item

    def next_wake(self, backlog_s: float, now: float) -> float | None:
        """When ``release`` may next give something (``None``: nothing held)."""
        wake: float | None = self._gate.next_wake(backlog_s, now)
        return wake

    def forget(self, item: T) -> bool:
        """Drop a held item whose request went away before it was released."""
        return bool(self._gate.remove(item))

    # -- routing and the engine's progress ------------------------------------------------------------------

    def route(
        self, request: RequestInfo, now: float, rng: RandomSource, exclude: frozenset[str] = frozenset()
    ) -> RouteDecision:
        """The policy's pick over the current snapshots (``ServiceUnavailableError`` when none fits)."""
        return self.policy.pick(request, self.snapshots(), now, rng, exclude)

    def dispatch(self, request: RequestInfo, replica: str, load: ReplicaLoad, now: float) -> None:
        """The request goes to ``replica`` (whose counters are ``load``)."""
        load.begin(request.cost_mu)
        for hook in self._dispatch_hooks:  # the policy's, then the observers'
            hook(request, replica, now)

    def first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        """The first output of the request arrived from ``replica``."""
        for hook in self._first_token_hooks:  # the policy's, then the observers'
            hook(request, replica, now)

    def finish(
        self, request: RequestInfo, replica: str, load: ReplicaLoad, now: float, usage: Usage | None, ok: bool
    ) -> float:
        """One attempt on ``replica`` ended (``ok``: the replica behaved). Returns the cost the policy was
        told: settled from ``usage`` when the engine reported it, else the estimate."""
        cost = request.cost_mu if usage is None else self._settle(usage)
        load.end(request.cost_mu, ok, now)
        self.policy.on_complete(request, replica, now, cost, ok)
        for hook in self._complete_hooks:
            hook(request, replica, now, usage, cost, ok)
        return cost

    def _settle(self, usage: Usage) -> float:
        """``profile.settle(usage)``, once per usage: the gateway's ``finish`` (the attempt) and ``settle``
        (the request) are given the same immutable ``Usage``, so the second is a lookup."""
        held = self._settled
        if held[0] is usage and held[1] is self.profile:
            return held[2]
        cost = self.profile.settle(usage)
        self._settled = (usage, self.profile, cost)
        return cost

    # -- after the request ----------------------------------------------------------------------------------

    def settle(
        self, request: RequestInfo, usage: Usage | None, now: float, streamed_tokens: int = 0
    ) -> float:
        """The request ran: its settled MU. From the engine's ``usage`` (which also feeds the tenant's output
        history), else from what is known to have run: the prompt and ``streamed_tokens`` output events."""
        if usage is not None:
            self.history.observe(request.tenant, usage.completion_tokens)
        else:
            usage = Usage(
                prompt_tokens=request.input_tokens,
                completion_tokens=streamed_tokens,
                image_tokens=request.image_tokens,
            )
        actual = self._settle(usage)
        if self.demand is not None:
            self.demand.finish(request.cost_mu, actual, now)
        return actual

    def shed(self, request: RequestInfo, now: float) -> None:
        """Admission refused the request for lack of capacity (not for the tenant's own limits): it never
        started, but it is demand the autoscaler must see (``DemandMeter.refused``)."""
        if self.demand is not None:
            self.demand.refused(request.cost_mu, now)

    def release_demand(self, request: RequestInfo, now: float) -> None:
        """The request never ran (refused, failed before any output): nothing settles."""
        if self.demand is not None:
            self.demand.finish(request.cost_mu, 0.0, now)

    def complete(
        self, request: RequestInfo, replica: str, load: ReplicaLoad, now: float, usage: Usage
    ) -> float:
        """``finish`` (ok) and ``settle`` in one: a request that ran to its end on its only attempt (the
        simulator's case). Returns the settled MU."""
        actual = self.profile.settle(usage)
        load.end(request.cost_mu, True, now)
        self.history.observe(request.tenant, usage.completion_tokens)
        self.policy.on_complete(request, replica, now, actual, True)
        for hook in self._complete_hooks:
            hook(request, replica, now, usage, actual, True)
        if self.demand is not None:
            self.demand.finish(request.cost_mu, actual, now)
        return actual
