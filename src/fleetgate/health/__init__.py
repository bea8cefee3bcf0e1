"""Black-box health checking and recovery (asyncio shell around ``core.health``).

``HealthMonitor`` (``fleetgate.health.monitor``) probes replicas, reads progress, remediates via a provider
and exports metrics; ``build_livez_app`` / ``add_livez_routes`` (``fleetgate.health.livez``) serve ``/livez``
for Kubernetes sidecar mode. Names are loaded lazily so that ``fleetgate --help`` stays fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "PROBE_PRIORITY": "fleetgate.health.monitor",
    "HealthMetrics": "fleetgate.health.monitor",
    "HealthMonitor": "fleetgate.health.monitor",
    "ProbeResult": "fleetgate.health.monitor",
    "Remediator": "fleetgate.health.monitor",
    "add_livez_routes": "fleetgate.health.livez",
    "build_livez_app": "fleetgate.health.livez",
    "run_sidecar": "fleetgate.health.livez",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:  # PEP 562 lazy exports (keeps `fleetgate --help` fast)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fleetgate.health' has no attribute {name!r}")
    return vars(import_module(module))[name]
