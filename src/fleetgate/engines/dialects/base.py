"""What fleetgate knows about one engine dialect: metric names, request priority, probe, health path, cache.

One frozen :class:`EngineDialect` per engine family lives in its own module (``vllm.py``, ``sglang.py``,
``llamacpp.py``, ``sim.py``, ``openai.py``); ``__init__`` lists them. Everything engine-specific that the
gateway, the scraper, the prober and the providers need is read from here, never sniffed with if-chains.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetgate.core.openai import Endpoint
from fleetgate.core.types import Priority
from fleetgate.engines.continuation import ChatContinuation, continuation_body

#: Tenant class -> request ``priority`` with vLLM's semantics (lower runs first, default 0).
LOW_FIRST: Mapping[Priority, int] = {
    Priority.PROBE: -20,
    Priority.INTERACTIVE: -10,
    Priority.BATCH: 0,
    Priority.BEST_EFFORT: 10,
}

#: vLLM's priority scheduling serves the lowest value first; probes go ahead of everything.
PROBE_PRIORITY_LOW_FIRST = -100


@dataclass(frozen=True, slots=True)
class MetricNames:
    """Which /metrics series mean what; the first name present wins (newest engine versions first)."""

    prefix: str | None = None  #: every series of this engine starts with it (detection); None: never detected
    waiting: tuple[str, ...] = ()
    #: the waiting requests wait for a free sequence slot only, never for KV memory (llama.cpp splits its
    #: context over the slots up front), so a finished request always admits the next (``core.engine_rates``)
    waiting_for_slots: bool = False
    running: tuple[str, ...] = ()
    kv_usage: tuple[str, ...] = ()  #: the fullest rank is taken (vLLM labels data-parallel ranks)
    prefix_queries: tuple[str, ...] = ()  #: cumulative prompt tokens looked up in the prefix cache
    prefix_hits: tuple[str, ...] = ()  #: cumulative prompt tokens found there
    prefix_queries_exclude_hits: bool = False  #: the query counter leaves the hits out (llama.cpp)
    prefix_hit_rate: tuple[str, ...] = ()  #: a ratio gauge, used for hits when no hit counter exists
    generation_tokens: tuple[str, ...] = ()  #: cumulative generated tokens (progress for the prober)
    #: the engine's own work counters, read by the online rate learner (``core.engine_rates``): prompt
    #: tokens it prefilled and the seconds it spent on them (summed per request), output tokens and theirs
    prefill_tokens: tuple[str, ...] = ()
    prefill_tokens_include_cached: bool = False  #: the counter also counts prefix-cache hits (vLLM)
    prefill_seconds: tuple[str, ...] = ()
    decode_tokens: tuple[str, ...] = ()
    decode_seconds: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PriorityField:
    """How an engine takes a request priority: the body field ``priority`` with these values per class."""

    values: Mapping[Priority, int] = field(default_factory=lambda: LOW_FIRST)
    probe: int = PROBE_PRIORITY_LOW_FIRST
    #: the engine rejects or ignores the field unless started for it (vLLM ``--scheduling-policy priority``,
    #: SGLang ``--enable-priority-scheduling``): sent only where the deployment says ``engine_priority``
    needs_flag: bool = True

    def accepted(self, engine_priority: bool) -> bool:
        return engine_priority or not self.needs_flag


@dataclass(frozen=True, slots=True)
class EngineDialect:
    """One engine family as fleetgate speaks to it."""

    name: str
    metrics: MetricNames = MetricNames()
    #: None: the engine takes no request priority (never sent)
    priority: PriorityField | None = None
    health_path: str = "/health"  #: readiness (200 when it serves) for providers starting replicas
    probe_path: str = "/v1/completions"  #: the minimal request the prober sends
    #: where a response reports prompt tokens served from the prefix cache (OpenAI's usage field)
    cached_tokens_path: tuple[str, ...] = ("usage", "prompt_tokens_details", "cached_tokens")
    #: how the engine goes on with a final assistant message (mid-stream failover, ``engines.continuation``);
    #: None: it cannot, so broken chat streams end with an SSE error (completions continue on any engine)
    chat_continuation: ChatContinuation | None = "continue_final_message"
    #: tokens per KV-cache block (prefix caching reuses whole blocks); with a real tokenizer the gateway's
    #: prefix-block hashes use this size. None: not known or token-granular (the gateway's default, 16)
    kv_block_tokens: int | None = None

    def continuation_body(
        self, body: Mapping[str, Any], endpoint: Endpoint, text: str, produced_tokens: int
    ) -> dict[str, Any] | None:
        """The request that continues ``body`` after ``text`` on this engine (``None``: it cannot)."""
        if endpoint == "chat" and self.chat_continuation is None:
            return None
        return continuation_body(body, endpoint, text, produced_tokens)

    def request_priority(self, priority: Priority, engine_priority: bool) -> int | None:
        """The ``priority`` field for a request of this tenant class (``None``: send none)."""
        if self.priority is None or not self.priority.accepted(engine_priority):
            return None
        return self.priority.values[priority]

    def probe_body(self, model: str, engine_priority: bool, path: str | None = None) -> dict[str, Any]:
        """The prober's request: 1 output token, greedy, not streamed, ahead of everything where it can."""
        body: dict[str, Any] = {"model": model, "max_tokens": 1, "temperature": 0.0, "stream": False}
        if (path or self.probe_path).endswith("/chat/completions"):
            body["messages"] = [{"role": "user", "content": "ping"}]
        else:
            body["prompt"] = "ping"
        if self.priority is not None and self.priority.accepted(engine_priority):
            body["priority"] = self.priority.probe
        return body

    def cached_tokens(self, response: Mapping[str, Any]) -> int | None:
        """Prompt tokens the engine served from its prefix cache, as its response reports them."""
        node: Any = response
        for key in self.cached_tokens_path:
            if not isinstance(node, Mapping):
                return None
            node = node.get(key)
        return node if isinstance(node, int) else None
