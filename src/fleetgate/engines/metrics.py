"""Prometheus text parsing and the engine signals the router and prober read.

Engines name the same facts differently; ``engine_signals`` maps each engine's real metric names (declared
by its dialect in ``engines.dialects``: vLLM ``vllm:``, SGLang ``sglang:``, llama.cpp ``llamacpp:``) onto one
small record. Values summed over label sets
(vLLM labels data-parallel ranks with ``engine``), except KV usage, which takes the fullest rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleetgate.engines.dialects import EngineDialect, detect

Sample = tuple[dict[str, str], float]
Parsed = dict[str, list[Sample]]

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def parse_prometheus_text(text: str) -> Parsed:
    """Parse Prometheus exposition text into ``{metric_name: [(labels, value), ...]}``.

    Comments, ``# HELP``/``# TYPE`` lines and malformed lines are skipped; timestamps are ignored.
    Histogram series keep their own names (``x_bucket``, ``x_sum``, ``x_count``).
    """
    out: Parsed = {}
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line[0] == "#":
            continue
        try:
            name, labels, rest = _split_sample(line)
            value = _parse_value(rest.split()[0])
        except (ValueError, IndexError):
            continue
        out.setdefault(name, []).append((labels, value))
    return out


def _split_sample(line: str) -> tuple[str, dict[str, str], str]:
    brace = line.find("{")
    space = line.find(" ")
    if brace < 0 or (0 <= space < brace):
        if space < 0:
            raise ValueError("no value")
        return line[:space], {}, line[space + 1 :]
    name = line[:brace]
    labels: dict[str, str] = {}
    i = brace + 1
    n = len(line)
    while True:
        while i < n and line[i] in " ,":
            i += 1
        if i >= n:
            raise ValueError("unterminated labels")
        if line[i] == "}":
            return name, labels, line[i + 1 :]
        eq = line.index("=", i)
        key = line[i:eq].strip()
        if eq + 1 >= n or line[eq + 1] != '"':
            raise ValueError("label value not quoted")
        j = eq + 2
        chars: list[str] = []
        while True:
            c = line[j]
            if c == "\\":
                nxt = line[j + 1]
                chars.append(_ESCAPES.get(nxt, "\\" + nxt))
                j += 2
            elif c == '"':
                break
            else:
                chars.append(c)
                j += 1
        labels[key] = "".join(chars)
        i = j + 1


def _parse_value(token: str) -> float:
    lowered = token.lower()
    if lowered in ("+inf", "inf"):
        return math.inf
    if lowered == "-inf":
        return -math.inf
    if lowered == "nan":
        return math.nan
    return float(token)


@dataclass(frozen=True, slots=True)
class EngineSignals:
    """What an engine's /metrics says about its load; ``None`` where the engine does not report it.

    ``prefix_queries``/``prefix_hits`` are cumulative token counters (their deltas give a hit rate);
    ``generation_tokens`` is cumulative (its growth is evidence of progress for the prober).
    ``prefill_tokens``/``prefill_seconds`` and ``decode_tokens``/``decode_seconds`` are the engine's own
    cumulative work counters (prompt tokens it computed and the time it spent on them, summed per request;
    output tokens and their time), read by the online rate learner (``core.engine_rates``).
    """

    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    generation_tokens: float | None = None
    engine: str | None = None
    prefill_tokens: float | None = None
    prefill_seconds: float | None = None
    decode_tokens: float | None = None
    decode_seconds: float | None = None
    #: ``waiting`` counts requests waiting for a sequence slot only (the dialect's ``waiting_for_slots``)
    waiting_for_slots: bool = False


def _total(parsed: Mapping[str, Sequence[Sample]], *names: str) -> float | None:
    for name in names:
        samples = parsed.get(name)
        if samples:
            return float(sum(v for _, v in samples if not math.isnan(v)))
    return None


def _maximum(parsed: Mapping[str, Sequence[Sample]], *names: str) -> float | None:
    for name in names:
        samples = parsed.get(name)
        if samples:
            return float(max(v for _, v in samples))
    return None


def engine_signals(
    parsed: Mapping[str, Sequence[Sample]], dialect: EngineDialect | None = None
) -> EngineSignals:
    """Map one engine's parsed metrics onto ``EngineSignals`` with its dialect's metric names (detected from
    the series' prefix when not given or when the dialect has none; no known prefix: an empty record)."""
    d = dialect if dialect is not None and dialect.metrics.prefix is not None else detect(parsed)
    if d is None or d.metrics.prefix is None:
        return EngineSignals()
    names = d.metrics
    queries = _total(parsed, *names.prefix_queries)
    hits = _total(parsed, *names.prefix_hits)
    if hits is None and queries is not None and names.prefix_hit_rate:
        rate = _maximum(parsed, *names.prefix_hit_rate)
        hits = None if rate is None else rate * queries
    if queries is not None and hits is not None and names.prefix_queries_exclude_hits:
        queries += hits
    prefilled = _total(parsed, *names.prefill_tokens)
    if prefilled is not None and names.prefill_tokens_include_cached:
        prefilled -= hits or 0.0  # computed tokens only: the cached ones cost no prefill
    return EngineSignals(
        waiting=_total(parsed, *names.waiting),
        running=_total(parsed, *names.running),
        kv_usage=_maximum(parsed, *names.kv_usage),
        prefix_queries=queries,
        prefix_hits=hits,
        generation_tokens=_total(parsed, *names.generation_tokens),
        engine=d.name,
        prefill_tokens=prefilled,
        prefill_seconds=_total(parsed, *names.prefill_seconds),
        decode_tokens=_total(parsed, *names.decode_tokens),
        decode_seconds=_total(parsed, *names.decode_seconds),
        waiting_for_slots=names.waiting_for_slots,
    )


def hit_rate(
    previous: EngineSignals | None, current: EngineSignals, min_queries: float = 1.0
) -> float | None:
    """Prefix-cache hit rate between two scrapes (cumulative without an earlier scrape or new traffic)."""
    if current.prefix_queries is None or current.prefix_hits is None:
        return None
    if previous is not None and previous.prefix_queries is not None and previous.prefix_hits is not None:
        dq = current.prefix_queries - previous.prefix_queries
        dh = current.prefix_hits - previous.prefix_hits
        if dq >= min_queries and dh >= 0:
            return min(max(dh / dq, 0.0), 1.0)
    if current.prefix_queries >= min_queries:
        return min(max(current.prefix_hits / current.prefix_queries, 0.0), 1.0)
    return None
