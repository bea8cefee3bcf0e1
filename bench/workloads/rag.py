"""Retrieval-augmented QA: shared document prefixes across tenants.

A corpus of ``documents`` documents of 2k-12k tokens (Zipf popularity: a few are hot) is shared by every
tenant. A request's prompt is one retrieved document (as its leading blocks, so two requests on the same
document share its KV whatever their tenant), then the tenant's instruction (256-1,024 tokens, one per
tenant), then the question (1-2 blocks, fresh); answers are 50-400 tokens. Arrivals are bursty Poisson
(``burst`` x / 1 / ``burst`` x the mean rate alternating every ``burst_period_s``). A share
``followup_share`` of requests are follow-ups: the same document, instruction and earlier question plus a
new question, a few seconds later. Prompts are chains of ``block_tokens`` hash blocks, as in the Mooncake
trace. Seeded: the same arguments give the same trace.

    trace = rag_trace(requests=2000, rate=10.0, seed=0)
"""

from __future__ import annotations

import numpy as np

from fleetgate.sim.traces import Trace, TraceRequest

from .common import Blocks, bursty_arrivals, zipf_weights


def rag_trace(
    *,
    requests: int = 2000,
    rate: float = 10.0,
    tenants: int = 12,
    documents: int = 64,
    seed: int = 0,
    block_tokens: int = 512,
    doc_tokens: tuple[int, int] = (2048, 12288),
    instruction_tokens: tuple[int, int] = (256, 1024),
    followup_share: float = 0.3,
    burst: float = 2.0,
    burst_period_s: float = 30.0,
    first_block: int = 0,
) -> Trace:
    rng = np.random.default_rng(seed)
    ids = Blocks(first_block)
    docs = [
        ids.take(int(rng.integers(doc_tokens[0], doc_tokens[1] + 1)) // block_tokens)
        for _ in range(documents)
    ]
    # Instructions follow the document in the prompt, so a tenant's instruction blocks are per document:
    # block ids are chained (a block's id stands for the whole prefix up to it).
    instr_len = [
        max(1, int(rng.integers(instruction_tokens[0], instruction_tokens[1] + 1)) // block_tokens)
        for _ in range(tenants)
    ]
    instr: dict[tuple[int, int], list[int]] = {}
    doc_w = zipf_weights(documents)
    tenant_w = zipf_weights(tenants, 0.8)
    reqs: list[TraceRequest] = []
    for k, at in enumerate(bursty_arrivals(rng, requests, rate, burst, burst_period_s)):
        if len(reqs) >= requests:
            break
        tenant = int(rng.choice(tenants, p=tenant_w))
        d = int(rng.choice(documents, p=doc_w))
        key = (d, tenant)
        if key not in instr:
            instr[key] = ids.take(instr_len[tenant])
        context = docs[d] + instr[key] + ids.take(int(rng.integers(1, 3)))
        turns = 2 if rng.random() < followup_share else 1
        t = at
        for _ in range(turns):
            out = int(rng.integers(50, 400))
            reqs.append(
                TraceRequest(
                    arrival_s=t,
                    input_tokens=len(context) * block_tokens,
                    output_tokens=out,
                    tenant=f"t{tenant}",
                    hash_ids=tuple(context),
                    block_tokens=block_tokens,
                    session=f"r{k}",
                )
            )
            context = context + ids.take(max(1, out // block_tokens) + 1)
            t += out * 0.03 + float(rng.exponential(5.0))
    reqs.sort(key=lambda r: r.arrival_s)
    reqs = reqs[:requests]
    meta = {"requests": requests, "rate": rate, "tenants": tenants, "documents": documents, "seed": seed}
    return Trace(f"rag-{requests}", reqs, "synthetic", meta)
