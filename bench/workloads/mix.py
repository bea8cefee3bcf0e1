"""A mix of the generators on one fleet: agentic sessions, RAG and batch at once.

Each part is generated with its own seed-derived stream and disjoint block ids (so no two parts share KV by
accident), tenants are prefixed by the part's name, and the requests are merged by arrival time. ``load``
scales every part's rate; the request counts follow ``load`` too, so each part spans about ``duration_s``
whatever the load. Seeded.

    trace = mix_trace(replicas=8, load=1.0, seed=0, duration_s=600)
"""

from __future__ import annotations

from dataclasses import replace

from fleetgate.sim.traces import Trace, TraceRequest

from .agentic import agentic_trace
from .batch import batch_trace
from .rag import rag_trace


def mix_trace(*, replicas: int, load: float = 1.0, seed: int = 0, duration_s: float = 600.0) -> Trace:
    """About ``duration_s`` of each part at ``load`` x its nominal per-replica rate: agentic session starts
    0.005/s, RAG 0.2 requests/s and batch 0.1 requests/s per replica."""
    n = replicas
    agentic = agentic_trace(
        sessions=max(1, int(0.005 * load * n * duration_s)), session_rate=0.005 * load * n, seed=seed
    )
    first = 1 + max((h for r in agentic.requests for h in r.hash_ids), default=0)
    rag = rag_trace(
        requests=max(1, int(0.2 * load * n * duration_s)),
        rate=0.2 * load * n,
        seed=seed + 1,
        first_block=first,
    )
    first = 1 + max((h for r in rag.requests for h in r.hash_ids), default=first)
    batch = batch_trace(
        requests=max(1, int(0.1 * load * n * duration_s)),
        rate=0.1 * load * n,
        seed=seed + 2,
        first_block=first,
    )
    parts = [("agentic", agentic), ("rag", rag), ("batch", batch)]
    reqs: list[TraceRequest] = []
    for name, tr in parts:
        reqs += [replace(r, tenant=f"{name}-{r.tenant}", session=f"{name}-{r.session}") for r in tr.requests]
    reqs.sort(key=lambda r: r.arrival_s)
    meta = {"replicas": replicas, "load": load, "seed": seed, "parts": [n for n, _ in parts]}
    return Trace(f"mix-{len(reqs)}", reqs, "synthetic", meta)
