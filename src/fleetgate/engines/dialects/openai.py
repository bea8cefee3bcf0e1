"""Any other OpenAI-compatible server: no known metrics; ``priority`` (vLLM's semantics) only when the
deployment asks for it with ``engine_priority``."""

from fleetgate.engines.dialects.base import EngineDialect, MetricNames, PriorityField

OPENAI = EngineDialect(name="openai", metrics=MetricNames(), priority=PriorityField(needs_flag=True))
