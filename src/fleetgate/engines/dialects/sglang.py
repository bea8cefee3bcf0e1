"""SGLang: ``sglang:`` metrics; ``priority`` with ``--enable-priority-scheduling`` (higher runs first unless
``--schedule-low-priority-values-first``; without the flag the field is ignored)."""

from fleetgate.core.types import Priority
from fleetgate.engines.dialects.base import EngineDialect, MetricNames, PriorityField

SGLANG = EngineDialect(
    name="sglang",
    metrics=MetricNames(
        prefix="sglang:",
        waiting=("sglang:num_queue_reqs",),
        running=("sglang:num_running_reqs",),
        kv_usage=("sglang:token_usage",),
        prefix_queries=("sglang:prompt_tokens_total",),
        prefix_hits=("sglang:cached_tokens_total",),
        prefix_hit_rate=("sglang:cache_hit_rate",),
        generation_tokens=("sglang:generation_tokens_total",),
    ),
    priority=PriorityField(
        values={Priority.PROBE: 20, Priority.INTERACTIVE: 10, Priority.BATCH: 0, Priority.BEST_EFFORT: -10},
        probe=100,
        needs_flag=True,
    ),
)
