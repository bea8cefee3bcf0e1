"""vLLM: ``vllm:`` metrics (v1 names first, then v0), ``priority`` with ``--scheduling-policy priority``."""

from fleetgate.engines.dialects.base import EngineDialect, MetricNames, PriorityField

VLLM = EngineDialect(
    name="vllm",
    metrics=MetricNames(
        prefix="vllm:",
        waiting=("vllm:num_requests_waiting",),
        running=("vllm:num_requests_running",),
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        prefix_queries=("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        prefix_hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        generation_tokens=("vllm:generation_tokens_total",),
        prefill_tokens=("vllm:prompt_tokens_total",),
        prefill_tokens_include_cached=True,
        prefill_seconds=("vllm:request_prefill_time_seconds_sum",),
        decode_tokens=("vllm:inter_token_latency_seconds_count",),
        decode_seconds=("vllm:inter_token_latency_seconds_sum",),
    ),
    # lower runs first; without --scheduling-policy priority vLLM answers 400 to any non-zero priority
    priority=PriorityField(needs_flag=True),
    kv_block_tokens=16,  # vLLM's default --block-size
)
