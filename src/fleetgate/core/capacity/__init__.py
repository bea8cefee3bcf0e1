"""Capacity management, pure.

Layout: ``ledger`` (settled MU per deployment over a sliding window, :class:`CapacitySnapshot` for
``/admin/capacity``), ``allocator`` (one finite GPU pool shared by deployments: floors first, weighted
max-min fair water-filling above them, hysteresis, drain never kill; ``decide(ctx) -> (allocation, state)``).
"""

from fleetgate.core.capacity.allocator import (
    Allocation,
    AllocationContext,
    AllocatorParams,
    AllocatorState,
    DeploymentDemand,
    decide,
    fair_shares,
    floor_replicas,
)
from fleetgate.core.capacity.ledger import (
    USED_BUCKET_S,
    CapacityLedger,
    CapacitySnapshot,
    Settlement,
    bucket_of,
    capacity_of,
    window_buckets,
)

__all__ = [
    "USED_BUCKET_S",
    "Allocation",
    "AllocationContext",
    "AllocatorParams",
    "AllocatorState",
    "CapacityLedger",
    "CapacitySnapshot",
    "DeploymentDemand",
    "Settlement",
    "bucket_of",
    "capacity_of",
    "decide",
    "fair_shares",
    "floor_replicas",
    "window_buckets",
]
