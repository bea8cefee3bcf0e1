"""Coding-agent-style sessions: per-tenant system prompts, multi-turn sessions whose context grows.

Each tenant has one system prompt of 1k-16k tokens; sessions start in bursts (a Poisson process whose rate
alternates between ``burst`` x and 1 / ``burst`` x the mean every ``burst_period_s``), belong to a tenant
(Zipf-like: a few tenants are hot), and run 2-20 turns. Turn ``k``'s prompt is the system prompt, every
earlier turn's user message, answer and tool result, and this turn's user message, so the context grows by
every answer and tool result and each turn shares all of the previous turn's prompt. Turns follow each other
after the previous answer plus a think time (open loop: the arrival times are fixed in the trace; the answer
time is estimated at ``decode_s_per_token``). Prompts are chains of ``block_tokens`` hash blocks, as in the
Mooncake trace. Seeded: the same arguments give the same trace.

    trace = agentic_trace(sessions=400, session_rate=1.0, seed=0)
"""

from __future__ import annotations

import numpy as np

from fleetgate.sim.traces import Trace, TraceRequest


def agentic_trace(
    *,
    sessions: int = 400,
    session_rate: float = 1.0,
    tenants: int = 8,
    seed: int = 0,
    block_tokens: int = 512,
    system_tokens: tuple[int, int] = (1024, 16384),
    turns: tuple[int, int] = (2, 20),
    think_s: float = 4.0,
    burst: float = 3.0,
    burst_period_s: float = 60.0,
    decode_s_per_token: float = 0.03,
) -> Trace:
    rng = np.random.default_rng(seed)
    next_id = 0

    def blocks(n: int) -> list[int]:
        nonlocal next_id
        out = list(range(next_id, next_id + n))
        next_id += n
        return out

    systems = [
        blocks(int(rng.integers(system_tokens[0], system_tokens[1] + 1)) // block_tokens)
        for _ in range(tenants)
    ]
    weights = 1.0 / np.arange(1, tenants + 1) ** 1.1
    weights /= weights.sum()
    # Bursty session starts: thinning of a Poisson process at the peak rate.
    starts: list[float] = []
    t = 0.0
    peak = session_rate * burst
    while len(starts) < sessions:
        t += float(rng.exponential(1.0 / peak))
        high = int(t // burst_period_s) % 2 == 0
        if rng.random() < (1.0 if high else 1.0 / (burst * burst)):
            starts.append(t)
    reqs: list[TraceRequest] = []
    for s, start in enumerate(starts):
        tenant = int(rng.choice(tenants, p=weights))
        context = list(systems[tenant])
        at = start
        for _ in range(int(rng.integers(turns[0], turns[1] + 1))):
            context += blocks(int(rng.integers(1, 4)))  # the user's message (or the agent's next step)
            out = int(rng.integers(50, 800))
            reqs.append(
                TraceRequest(
                    arrival_s=at,
                    input_tokens=len(context) * block_tokens,
                    output_tokens=out,
                    tenant=f"t{tenant}",
                    hash_ids=tuple(context),
                    block_tokens=block_tokens,
                    session=f"s{s}",
                )
            )
            # the answer and a tool result join the context; the next turn comes after the answer + think time
            context += blocks(max(1, out // block_tokens) + int(rng.integers(0, 9)))
            at += out * decode_s_per_token + float(rng.exponential(think_s))
    reqs.sort(key=lambda r: r.arrival_s)
    meta = {"sessions": sessions, "session_rate": session_rate, "tenants": tenants, "seed": seed}
    return Trace(f"agentic-{sessions}", reqs, "synthetic", meta)
