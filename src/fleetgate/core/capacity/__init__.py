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
    CapacityLedger,
    CapacitySnapshot,
    Settlement,
    capacity_of,
)

__all__ = [
    "Allocation",
    "AllocationContext",
    "AllocatorParams",
    "AllocatorState",
    "CapacityLedger",
    "CapacitySnapshot",
    "DeploymentDemand",
    "Settlement",
    "capacity_of",
    "decide",
    "fair_shares",
    "floor_replicas",
]
