"""Capacity management, pure.

Layout: ``ledger`` (settled MU per deployment over a sliding window, :class:`CapacitySnapshot` for
``/admin/capacity``).
"""

from fleetgate.core.capacity.ledger import (
    CapacityLedger,
    CapacitySnapshot,
    Settlement,
    capacity_of,
)

__all__ = [
    "CapacityLedger",
    "CapacitySnapshot",
    "Settlement",
    "capacity_of",
]
