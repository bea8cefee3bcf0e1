"""The seeded workload generators of bench/workloads/ (issue 20 item 1): deterministic, and each has the
shape its docstring promises."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from workloads.agentic import agentic_trace
from workloads.batch import batch_trace
from workloads.mix import mix_trace
from workloads.rag import rag_trace

from fleetgate.sim.traces import Trace


def _sig(tr: Trace) -> list[tuple[float, int, int, str, tuple[int, ...]]]:
    return [(r.arrival_s, r.input_tokens, r.output_tokens, r.tenant, r.hash_ids) for r in tr.requests]


def test_generators_are_seeded() -> None:
    for make in (
        lambda s: rag_trace(requests=300, rate=5.0, seed=s),
        lambda s: batch_trace(requests=300, rate=5.0, seed=s),
        lambda s: mix_trace(replicas=2, load=1.0, seed=s, duration_s=120.0),
    ):
        a, b, c = make(0), make(0), make(1)
        assert _sig(a) == _sig(b)
        assert _sig(a) != _sig(c)
        arrivals = [r.arrival_s for r in a.requests]
        assert arrivals == sorted(arrivals)
        assert all(r.input_tokens == len(r.hash_ids) * r.block_tokens for r in a.requests)


def test_rag_shares_documents_across_tenants() -> None:
    tr = rag_trace(requests=600, rate=5.0, seed=0)
    assert len(tr.requests) == 600
    tenants_of_root: dict[int, set[str]] = {}
    for r in tr.requests:
        tenants_of_root.setdefault(r.hash_ids[0], set()).add(r.tenant)
    # the hot documents are read by several tenants: their leading blocks are shared prefixes
    assert max(len(t) for t in tenants_of_root.values()) >= 5
    assert len(tenants_of_root) <= 64
    # and a document read by two tenants diverges after the document (per-tenant instructions)
    doc = max(tenants_of_root, key=lambda h: len(tenants_of_root[h]))
    tails = {r.hash_ids[len(r.hash_ids) // 2 :] for r in tr.requests if r.hash_ids[0] == doc}
    assert len(tails) > 1


def test_batch_is_long_prompts_short_outputs() -> None:
    tr = batch_trace(requests=500, rate=5.0, seed=0)
    assert len(tr.requests) == 500
    assert all(1 <= r.output_tokens <= 64 for r in tr.requests)
    assert min(r.input_tokens for r in tr.requests) >= 2048
    mean_in = sum(r.input_tokens for r in tr.requests) / len(tr.requests)
    assert 5000 < mean_in < 20000


def test_mix_has_every_part_with_disjoint_blocks() -> None:
    tr = mix_trace(replicas=4, load=1.0, seed=0, duration_s=200.0)
    blocks: dict[str, set[int]] = {}
    for r in tr.requests:
        blocks.setdefault(r.tenant.split("-")[0], set()).update(r.hash_ids)
    assert set(blocks) == {"agentic", "rag", "batch"}
    a, r, b = blocks["agentic"], blocks["rag"], blocks["batch"]
    assert not (a & r) and not (a & b) and not (r & b)
    # every part spans the run, not only its start
    last = {p: max(x.arrival_s for x in tr.requests if x.tenant.startswith(p)) for p in blocks}
    assert min(last.values()) > 100.0
    # agentic sessions are multi-turn (the context grows), as in agentic_trace
    assert len(agentic_trace(sessions=10, session_rate=1.0, seed=0).requests) > 20
