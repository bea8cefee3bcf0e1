"""The request lifecycle shared by the gateway and the simulator (``flow.Lifecycle``), its observers and the
output-length history behind the estimate."""

from fleetgate.core.lifecycle.flow import Lifecycle, ReplicaLoad
from fleetgate.core.lifecycle.history import SortedOutputHistory
from fleetgate.core.lifecycle.observers import LifecycleObserver, ObserverBase

__all__ = ["Lifecycle", "LifecycleObserver", "ObserverBase", "ReplicaLoad", "SortedOutputHistory"]
