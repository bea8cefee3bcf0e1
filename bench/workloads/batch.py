"""Offline batch jobs: long prompts, short outputs.

Jobs (classification, extraction, summarisation scoring) arrive as a Poisson process; each job belongs to a
tenant, has one instruction template of 256-2,048 tokens shared by all its requests (the prompt's leading
blocks), and submits 20-200 requests at ``job_rate`` requests/s each: the template, then a fresh document
of 2k-32k tokens (log-uniform), output 1-64 tokens. Jobs overlap, so the fleet sees several templates at
once with bursts whenever a job starts. Prompts are chains of ``block_tokens`` hash blocks. Seeded.

    trace = batch_trace(requests=2000, rate=5.0, seed=0)
"""

from __future__ import annotations

import math

import numpy as np

from fleetgate.sim.traces import Trace, TraceRequest

from .common import Blocks


def batch_trace(
    *,
    requests: int = 2000,
    rate: float = 5.0,
    tenants: int = 6,
    seed: int = 0,
    block_tokens: int = 512,
    template_tokens: tuple[int, int] = (256, 2048),
    doc_tokens: tuple[int, int] = (2048, 32768),
    job_size: tuple[int, int] = (20, 200),
    first_block: int = 0,
) -> Trace:
    rng = np.random.default_rng(seed)
    ids = Blocks(first_block)
    mean_job = (job_size[0] + job_size[1]) / 2
    job_rate = rate / mean_job  # jobs per second, so requests arrive at ``rate`` on average
    per_job_rate = max(rate / 2, 1.0)  # requests/s within a job
    reqs: list[TraceRequest] = []
    t = 0.0
    j = 0
    lo, hi = math.log(doc_tokens[0]), math.log(doc_tokens[1])
    while len(reqs) < requests:
        t += float(rng.exponential(1.0 / job_rate))
        tenant = int(rng.integers(0, tenants))
        template = ids.take(
            max(1, int(rng.integers(template_tokens[0], template_tokens[1] + 1)) // block_tokens)
        )
        at = t
        for _ in range(int(rng.integers(job_size[0], job_size[1] + 1))):
            at += float(rng.exponential(1.0 / per_job_rate))
            doc = ids.take(max(1, int(math.exp(rng.uniform(lo, hi))) // block_tokens))
            context = template + doc
            reqs.append(
                TraceRequest(
                    arrival_s=at,
                    input_tokens=len(context) * block_tokens,
                    output_tokens=int(rng.integers(1, 65)),
                    tenant=f"t{tenant}",
                    hash_ids=tuple(context),
                    block_tokens=block_tokens,
                    session=f"j{j}",
                )
            )
        j += 1
    reqs.sort(key=lambda r: r.arrival_s)
    reqs = reqs[:requests]
    meta = {"requests": requests, "rate": rate, "tenants": tenants, "seed": seed}
    return Trace(f"batch-{requests}", reqs, "synthetic", meta)
