"""The autoscaler control loop (asyncio shell around ``core.autoscale``)."""

from fleetgate.autoscaler.loop import (
    AutoscalerLoop,
    AutoscalerMetrics,
    ReplicaCounts,
    ScaleTarget,
    provider_counts,
)

__all__ = ["AutoscalerLoop", "AutoscalerMetrics", "ReplicaCounts", "ScaleTarget", "provider_counts"]
