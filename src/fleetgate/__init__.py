"""fleetgate: a platform layer that makes LLM inference reliable at scale for many tenants."""

__version__ = "0.1.0"
