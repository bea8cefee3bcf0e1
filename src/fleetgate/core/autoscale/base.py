"""What every autoscaler shares: the context of one decision, the protocol, and the summary the loop exports.

Shaped like Ray Serve's custom autoscaling policies: the caller (the asyncio loop in ``fleetgate.autoscaler``
or the simulator) gathers inputs into an :class:`AutoscaleContext`, calls ``decide(ctx)`` with the previous
state in ``ctx.policy_state``, applies the returned replica count and keeps the returned state for the next
call. Nothing here reads a clock: ``now_s`` comes in. Bounds, delays and cooldowns are one set of rails
(``rails.Rails``) that every policy applies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fleetgate.core.autoscale.fleetgate import AutoscalePolicy

#: Tolerance so that demand exactly at target does not round up to one replica more.
EPS = 1e-9


@dataclass(frozen=True, slots=True)
class AutoscaleContext:
    """Inputs of one decision.

    ``current_replicas`` is the count the provider is currently asked to run (ready + starting, normally);
    ``ready_replicas`` are healthy and serving; ``starting_replicas`` were asked for but are not ready yet
    (including ones being restarted). ``capacity_mu_per_min`` is per replica. ``inflight_requests`` is only
    used by the concurrency baseline (KPA) but every autoscaler gets the same context. ``policy`` is only read
    by fleetgate's :func:`~fleetgate.core.autoscale.fleetgate.decide` (``None``: its defaults).
    """

    now_s: float
    current_replicas: int
    ready_replicas: int
    starting_replicas: int = 0
    capacity_mu_per_min: float = 100.0
    settled_mu_per_min: float = 0.0
    inflight_mu: float = 0.0
    inflight_requests: float = 0.0
    policy: AutoscalePolicy | None = None
    policy_state: Any = None

    @property
    def demand_mu_per_min(self) -> float:
        return max(0.0, self.settled_mu_per_min) + max(0.0, self.inflight_mu)

    @property
    def utilisation(self) -> float:
        """Demand over the capacity of healthy replicas (inf when there is demand and none is ready)."""
        cap = self.ready_replicas * self.capacity_mu_per_min
        if cap <= 0:
            return math.inf if self.demand_mu_per_min > 0 else 0.0
        return self.demand_mu_per_min / cap


@dataclass(frozen=True, slots=True)
class AutoscaleSummary:
    """What the live loop exports after a decision (gauges, log line): the demand the policy scaled on."""

    demand_mu_per_min: float
    utilisation: float
    panic: bool = False
    reason: str = ""


def context_summary(ctx: AutoscaleContext, reason: str = "", panic: bool = False) -> AutoscaleSummary:
    """The summary of a policy that does not measure demand its own way: the context's figures."""
    return AutoscaleSummary(ctx.demand_mu_per_min, ctx.utilisation, panic, reason)


class Autoscaler(Protocol):
    """Anything the simulator and the live loop can drive: fleetgate's policy and the baselines."""

    @property
    def name(self) -> str: ...

    def decide(self, ctx: AutoscaleContext) -> tuple[int, Any]:
        """Desired replica count and the state to pass back (as ``ctx.policy_state``) next time."""
        ...


class ReportingAutoscaler(Autoscaler, Protocol):
    """An autoscaler that also says what it scaled on (every registered one; the live loop needs it)."""

    def summary(self, ctx: AutoscaleContext, state: Any) -> AutoscaleSummary:
        """The demand, utilisation, panic flag and reason behind the decision that returned ``state``."""
        ...


def window_mean(samples: Sequence[tuple[float, float]], now_s: float, window_s: float) -> float:
    """Mean of the samples taken in the last ``window_s`` (0 when none)."""
    vals = [v for t, v in samples if now_s - t < window_s - EPS]
    return sum(vals) / len(vals) if vals else 0.0


def window_slope(samples: Sequence[tuple[float, float]], now_s: float, window_s: float) -> float:
    """Least-squares slope (units per second) of the samples in the window; 0 with fewer than 3 points."""
    pts = [(t, v) for t, v in samples if now_s - t < window_s - EPS]
    if len(pts) < 3:
        return 0.0
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    var = sum((t - mt) ** 2 for t, _ in pts)
    if var <= 0:
        return 0.0
    return sum((t - mt) * (v - mv) for t, v in pts) / var


def replicas_for(
    demand_mu_per_min: float, capacity_mu_per_min: float, target: float, beta: float = 0.0
) -> int:
    """Replicas needed to serve ``demand`` at ``target`` utilisation of each replica's capacity.

    With ``beta`` > 0, square-root staffing adds ``beta * sqrt(R)`` replicas (``R`` = demand in replicas at
    full load): bursts are relatively larger for small deployments, so they get relatively more headroom.
    """
    if demand_mu_per_min <= 0 or capacity_mu_per_min <= 0 or target <= 0:
        return 0
    load = demand_mu_per_min / capacity_mu_per_min
    return max(0, math.ceil(load / target + beta * math.sqrt(load) - EPS))
