"""Admission in model units (MU): buckets, tiers, priority queue and fairness. Pure: time is passed in.

- ``buckets``: GCRA meters (level, drain, all-or-nothing charges), the arithmetic the stores share.
- ``planning``: tenants' purchases, tiers, and the charges one request makes in each tier.
- ``decisions``: verdicts with their HTTP status and the meters as they stood (no header text: the
  gateway formats ``x-ratelimit-*`` and ``Retry-After``, ``fleetgate.gateway.ratelimit``).
- ``queue``: the bounded priority queue (class, then fair share, then arrival), deadlines, evictions.
- ``pump``: passes over the queue and the decision-making ``AdmissionCore``.
- ``machine``: the one protocol executors speak: rounds of commands (take these charges, adjust these
  meters, resolve this entry, hold the lock, wake the queue) that are told each outcome.
- ``local``: the synchronous executor over in-memory buckets, and the simulator's hook.
"""

from fleetgate.core.admission.buckets import (
    EPS,
    MIN_RETRY_AFTER_S,
    BucketParams,
    BucketState,
    Charge,
    ChargeKind,
    MemoryBuckets,
    TakeOutcome,
    adjust,
    adjust_all,
    available_now,
    charge,
    drain,
    remaining_per_min,
    reset_s,
    take_all,
    threshold,
    wait_s,
)
from fleetgate.core.admission.decisions import (
    MAX_RETRY_AFTER_S,
    SATURATED_RETRY_S,
    Decision,
    MeterReading,
    Reason,
    denial_reason,
    read_meters,
    settle_deltas,
)
from fleetgate.core.admission.local import LocalAdmission, SimAdmission
from fleetgate.core.admission.machine import (
    AdjustCharges,
    AdmissionMachine,
    Command,
    Exclusive,
    Resolve,
    Round,
    TakeCharges,
    Wake,
)
from fleetgate.core.admission.planning import (
    ANONYMOUS,
    AdmissionSettings,
    CapacityView,
    TenantLimits,
    Tier,
    estimated_tokens,
    plan_charges,
    request_priority,
)
from fleetgate.core.admission.pump import AdmissionCore, PumpPass
from fleetgate.core.admission.queue import AdmissionQueue, Attempt, QueueEntry

__all__ = [
    "ANONYMOUS",
    "EPS",
    "MAX_RETRY_AFTER_S",
    "MIN_RETRY_AFTER_S",
    "SATURATED_RETRY_S",
    "AdjustCharges",
    "AdmissionCore",
    "AdmissionMachine",
    "AdmissionQueue",
    "AdmissionSettings",
    "Attempt",
    "BucketParams",
    "BucketState",
    "CapacityView",
    "Charge",
    "ChargeKind",
    "Command",
    "Decision",
    "Exclusive",
    "LocalAdmission",
    "MemoryBuckets",
    "MeterReading",
    "PumpPass",
    "QueueEntry",
    "Reason",
    "Resolve",
    "Round",
    "SimAdmission",
    "TakeCharges",
    "TakeOutcome",
    "TenantLimits",
    "Tier",
    "Wake",
    "adjust",
    "adjust_all",
    "available_now",
    "charge",
    "denial_reason",
    "drain",
    "estimated_tokens",
    "plan_charges",
    "read_meters",
    "remaining_per_min",
    "request_priority",
    "reset_s",
    "settle_deltas",
    "take_all",
    "threshold",
    "wait_s",
]
