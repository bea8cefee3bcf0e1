"""Local engine replicas: ``process`` starts and stops child processes (the one place that does), ``provider``
is the asyncio replica provider on top of it."""

from fleetgate.providers.local.process import EngineProcess, free_port
from fleetgate.providers.local.provider import READY_LINE, LocalProcessProvider, sim_engine_command

__all__ = ["READY_LINE", "EngineProcess", "LocalProcessProvider", "free_port", "sim_engine_command"]
