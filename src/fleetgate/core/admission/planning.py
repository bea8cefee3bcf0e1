"""Tenants, tiers and charge planning: which meters one request charges, and how much.

Tiers
    ``reserved``: the tenant's reservation on the deployment (guaranteed; it also charges the deployment's
    fleet meter without being checked by it). ``best_effort``: the tenant's best-effort allowance *and* the
    fleet meter, whose rate is the capacity the ledger reports times a target utilisation; reserved traffic
    fills that meter first, so best-effort only gets unsold or idle capacity and is shed first (503).
    When every replica reports requests waiting in its own queue (``CapacityView.engines_saturated``), there
    is no idle capacity whatever the meters say: best-effort is held until a scrape shows a free slot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from fleetgate.core.admission.buckets import BucketParams, Charge, ChargeKind
from fleetgate.core.types import PRIORITY_ORDER, Priority, RequestInfo


class Tier(StrEnum):
    """Which meters a request is charged to."""

    PROBE = "probe"  # health probes: never limited
    UNLIMITED = "unlimited"  # no tenants configured (anonymous)
    RESERVED = "reserved"
    BEST_EFFORT = "best_effort"


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """A tenant's purchase, as the core needs it (admission/tenants.py builds it from config).

    ``priority`` is the class of its reserved traffic (interactive or batch; best_effort means it has no
    reservation class at all). ``best_effort_mu_per_min``: 0 = none, ``inf`` = only the fleet limits it.
    """

    name: str
    priority: Priority = Priority.INTERACTIVE
    reserved_mu_per_min: Mapping[str, float] = field(default_factory=dict)
    best_effort_mu_per_min: float = 0.0
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    weight: float = 1.0
    burst_s: float | None = None
    unlimited: bool = False

    def reservation(self, model: str) -> float:
        return (
            0.0 if self.priority == Priority.BEST_EFFORT else float(self.reserved_mu_per_min.get(model, 0.0))
        )

    def tiers(self, model: str) -> tuple[Tier, ...]:
        """Tiers to try, in order: the reservation first, then best-effort use of idle capacity."""
        if self.unlimited:
            return (Tier.UNLIMITED,)
        out: list[Tier] = []
        if self.reservation(model) > 0:
            out.append(Tier.RESERVED)
        if self.best_effort_mu_per_min > 0:
            out.append(Tier.BEST_EFFORT)
        return tuple(out)


ANONYMOUS = TenantLimits(name="anonymous", unlimited=True)


@dataclass(frozen=True, slots=True)
class CapacityView:
    """Capacity ledger numbers for one deployment, passed in (the ledger owns them).

    ``engines_saturated``: every routable replica reports requests waiting in its own queue (scraped), i.e.
    there is no idle capacity whatever the MU meters say (a slow or mis-calibrated engine, a host short of
    CPU). Best-effort is then held (503 or a queue wait) so that the slots that free up go to reserved
    traffic; reserved tenants are never held by it.
    """

    capacity_mu_per_min: float
    sold_mu_per_min: float = 0.0
    engines_saturated: bool = False
    #: best-effort requests that may be in flight on the deployment now (``None``: no limit), from the
    #: replicas' measured latency headroom (``core.admission.headroom``); beyond it best-effort is held
    #: like ``engines_saturated``, reserved tenants never are
    best_effort_limit: int | None = None

    @property
    def unsold_mu_per_min(self) -> float:
        return max(0.0, self.capacity_mu_per_min - self.sold_mu_per_min)


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    """Knobs shared by all tenants (config: ``admission``)."""

    burst_s: float = 0.0
    best_effort_max_utilization: float = 0.8
    fleet_burst_s: float = 2.0
    queue_max: int = 1000
    default_deadline_s: float = 10.0
    namespace: str = "fleetgate"


def _k(settings: AdmissionSettings, *parts: str) -> str:
    return ":".join((settings.namespace, *parts))


def estimated_tokens(request: RequestInfo) -> int:
    """Tokens charged against a tokens-per-minute limit at admission (settled to real usage later)."""
    out = (
        request.max_output_tokens
        if request.max_output_tokens is not None
        else request.estimated_output_tokens
    )
    return max(0, request.input_tokens) + max(0, out or 0)


def plan_charges(
    tenant: TenantLimits,
    request: RequestInfo,
    tier: Tier,
    capacity: CapacityView | None,
    settings: AdmissionSettings,
) -> tuple[Charge, ...]:
    """The meters one request charges in ``tier`` (all-or-nothing)."""
    if tier in (Tier.PROBE, Tier.UNLIMITED):
        return ()
    cost = max(0.0, request.cost_mu)
    burst_s = settings.burst_s if tenant.burst_s is None else tenant.burst_s
    name, model = tenant.name, request.model
    out: list[Charge] = []
    if tenant.requests_per_minute:
        out.append(
            Charge(
                _k(settings, "rpm", name),
                BucketParams.per_minute(tenant.requests_per_minute, burst_s),
                1.0,
                ChargeKind.REQUESTS,
            )
        )
    if tenant.tokens_per_minute:
        out.append(
            Charge(
                _k(settings, "tpm", name),
                BucketParams.per_minute(tenant.tokens_per_minute, burst_s),
                float(estimated_tokens(request)),
                ChargeKind.TOKENS,
            )
        )
    fleet_rate = 0.0
    if capacity is not None and capacity.capacity_mu_per_min > 0:
        fleet_rate = capacity.capacity_mu_per_min * settings.best_effort_max_utilization
    if tier == Tier.RESERVED:
        out.append(
            Charge(
                _k(settings, "res", name, model),
                BucketParams.per_minute(tenant.reservation(model), burst_s),
                cost,
                ChargeKind.MU,
            )
        )
        if fleet_rate > 0:
            out.append(_fleet_charge(settings, model, fleet_rate, cost, enforce=False))
    elif tier == Tier.BEST_EFFORT:
        if math.isfinite(tenant.best_effort_mu_per_min):
            out.append(
                Charge(
                    _k(settings, "be", name, model),
                    BucketParams.per_minute(tenant.best_effort_mu_per_min, burst_s),
                    cost,
                    ChargeKind.MU,
                )
            )
        if capacity is None:
            return tuple(out)  # capacity unknown: only the tenant's own allowance limits it
        if fleet_rate <= 0:
            fleet_rate = 1e-6  # no healthy capacity at all: best-effort is shed
        out.append(_fleet_charge(settings, model, fleet_rate, cost, enforce=True))
    return tuple(out)


def _fleet_charge(
    settings: AdmissionSettings, model: str, rate: float, cost: float, *, enforce: bool
) -> Charge:
    """The deployment's fleet meter: best-effort is refused by it; reserved requests only charge it
    (``enforce=False``), so best-effort gets what reserved traffic leaves."""
    return Charge(
        _k(settings, "fleet", model),
        BucketParams.per_minute(rate, settings.fleet_burst_s),
        cost,
        ChargeKind.FLEET,
        enforce=enforce,
    )


def request_priority(tenant: TenantLimits, request: RequestInfo) -> Priority:
    """Probes are probes; otherwise the tenant's class, or best-effort when it has no reservation here."""
    if request.priority == Priority.PROBE:
        return Priority.PROBE
    tiers = tenant.tiers(request.model)
    if tenant.unlimited:
        return request.priority
    if Tier.RESERVED in tiers:
        # A tenant may mark a request as less urgent than its class, never as more urgent.
        cls = tenant.priority
        return request.priority if PRIORITY_ORDER[request.priority] > PRIORITY_ORDER[cls] else cls
    return Priority.BEST_EFFORT
