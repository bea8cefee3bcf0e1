"""llama.cpp's ``llama-server``: ``llamacpp:`` metrics (with ``--metrics``); no request priority (its slots
are served first come, first served); cached prompt tokens in OpenAI's usage field."""

from fleetgate.engines.dialects.base import EngineDialect, MetricNames

LLAMACPP = EngineDialect(
    name="llamacpp",
    metrics=MetricNames(
        prefix="llamacpp:",
        waiting=("llamacpp:requests_deferred",),
        waiting_for_slots=True,  # a deferred request waits for a slot (each has --ctx-size / --parallel)
        running=("llamacpp:requests_processing",),
        kv_usage=("llamacpp:kv_cache_usage_ratio",),
        # prompt_tokens_total counts the evaluated prompt tokens only ("excluding cached tokens"): the tokens
        # looked up are those plus the cached ones
        prefix_queries=("llamacpp:prompt_tokens_total",),
        prefix_hits=("llamacpp:prompt_tokens_cached_total",),
        prefix_queries_exclude_hits=True,
        generation_tokens=("llamacpp:tokens_predicted_total",),
        prefill_tokens=("llamacpp:prompt_tokens_total",),  # evaluated tokens (cached ones apart)
        prefill_seconds=("llamacpp:prompt_seconds_total",),
        decode_tokens=("llamacpp:tokens_predicted_total",),
        decode_seconds=("llamacpp:tokens_predicted_seconds_total",),
    ),
    priority=None,
)
