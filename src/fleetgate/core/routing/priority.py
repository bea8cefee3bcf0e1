"""Engine priority from the tenant's class and the request's expected uncached prefill (pure).

Engines such as vLLM (``--scheduling-policy priority``) and fleetgate's simulated engine serve their queue in
``(priority, arrival)`` order, lower first. Routing cannot reorder an engine's queue, but the ``priority`` the
gateway sends with each request can: *class first, size second*. Within a class, a request whose uncached
prompt is larger goes into a higher bucket (``log2`` of ``uncached / bucket_tokens``, capped at
``max_bucket``), so short prefills are not stuck behind long ones.

Starvation is bounded by aging expressed as a deadline: with ``age_s > 0`` a request of bucket ``b`` ranks
as if it had arrived ``b * age_s`` seconds later than it did (priority = arrival quantum + ``b`` x
``age_s`` quanta), so a long prompt is overtaken only by shorter requests arriving within ``b * age_s``
seconds after it. ``age_s = 0`` gives static buckets (no aging; the cap alone bounds the reordering).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetgate.core.routing.params import parse_params
from fleetgate.core.types import PRIORITY_ORDER, Priority

#: Distance between two classes' priorities: larger than any arrival quantum the gateway will see, so the
#: class always dominates (1e12 quanta of 50 ms is over a thousand years), yet exact in a JSON double.
CLASS_STRIDE = 10**12


@dataclass(frozen=True, slots=True)
class SizePriorityParams:
    """Knobs of :func:`engine_priority` (``DeploymentConfig.engine_priority_params``)."""

    bucket_tokens: int = 256  # uncached tokens up to this go in bucket 0; each doubling adds a bucket
    max_bucket: int = 4  # cap: at most this many buckets above the shortest
    age_s: float = 1.0  # aging: one bucket = served as if it arrived age_s later; 0 = static buckets
    quantum_s: float = 0.05  # resolution of the arrival time folded into the priority

    @classmethod
    def from_mapping(cls, params: Mapping[str, Any]) -> SizePriorityParams:
        """Build from config; unknown names raise ``ValueError``."""
        p = parse_params(
            "engine_priority",
            params,
            {"bucket_tokens": int, "max_bucket": int, "age_s": float, "quantum_s": float},
        )
        out = cls(**p)
        if out.bucket_tokens < 1 or out.max_bucket < 0 or out.age_s < 0 or out.quantum_s <= 0:
            raise ValueError(
                "engine_priority params: bucket_tokens >= 1, max_bucket >= 0, age_s >= 0, quantum_s > 0"
            )
        return out


def size_bucket(uncached_prefill_tokens: int, params: SizePriorityParams) -> int:
    """0 for prompts up to ``bucket_tokens`` uncached tokens, +1 per doubling, at most ``max_bucket``."""
    if uncached_prefill_tokens <= params.bucket_tokens:
        return 0
    b = math.ceil(math.log2(uncached_prefill_tokens / params.bucket_tokens))
    return min(params.max_bucket, b)


def engine_priority(
    klass: Priority, uncached_prefill_tokens: int, arrival_s: float, params: SizePriorityParams
) -> int:
    """The engine ``priority`` (lower first) for a request of class ``klass`` arriving at ``arrival_s``.

    Non-negative, so health probes (negative priorities) still go first.
    """
    bucket = size_bucket(uncached_prefill_tokens, params)
    base = PRIORITY_ORDER[klass] * CLASS_STRIDE
    if params.age_s <= 0:
        return base + bucket
    q = params.quantum_s
    return base + max(0, math.floor(arrival_s / q)) + bucket * round(params.age_s / q)


def uncached_prefill_tokens(input_tokens: int, cached_blocks: float, block_tokens: int) -> int:
    """Prompt tokens left to prefill when ``cached_blocks`` leading blocks are cached (at least 1)."""
    return max(1, input_tokens - int(cached_blocks) * block_tokens)
