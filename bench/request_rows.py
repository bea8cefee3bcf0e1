"""Where a router_compare block's TTFT tail comes from, from the rows ``--request-rows`` keeps.

    python3 bench/request_rows.py RESULT.json [--against fleetgate:cache_aware] [--top 10] [--logdir DIR]

Per block: p50 / p95 / p99 TTFT, the token hit rate, and the requests at or above the block's p95 (how many
were prefix-cache misses, their prompt length, when they were sent). Then, for every repeat in which both
ran, the requests the default (``fleetgate:fleetgate``, or ``--contender``) made slowest relative to
``--against``, the same request index in the same repeat, with both runs' TTFT and cached tokens: equal
cached tokens mean the same placement quality, so a difference there is queueing (at the gateway or in the
engine), not a lost cache hit. The replica each request went to is in its row when router_compare read it
from the fleetgate gateway's access log (the replay sends ``x-request-id: replay-<index>``); ``--logdir``
(router_compare's) reads it from ``run<position>-gateway.log`` there instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

Row = dict[str, Any]

#: The replay's ``request_id_prefix`` in router_compare (``x-request-id: replay-<index>``).
REQUEST_ID_PREFIX = "replay-"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _on(row: Row) -> str:
    return f", on {row['replica']}" if "replica" in row else ""


def _share(row: Row) -> float:
    return float(row["cached_tokens"]) / max(1, int(row["prompt_tokens"]))


def describe(block: dict[str, Any]) -> str:
    """One block's tail in two lines."""
    rows = [r for r in block["request_rows"] if r["ok"] and r["ttft_s"] is not None]
    ttft = [float(r["ttft_s"]) for r in rows]
    p95 = _pct(ttft, 0.95)
    tail = [r for r in rows if r["ttft_s"] >= p95]
    hit = sum(r["cached_tokens"] for r in rows) / max(1, sum(r["prompt_tokens"] for r in rows))
    counters = block.get("router_counters")
    gate = [v for k, v in (counters or {}).items() if "gate_held" in k]
    held = f"{sum(gate):.0f}" if gate else "not recorded"
    return (
        f"[{block['repeat']}] {block['contender']}: TTFT p50 {_pct(ttft, 0.5):.3f} p95 {p95:.3f} "
        f"p99 {_pct(ttft, 0.99):.3f} s, hit {hit:.3f}, requests the gate held: {held}\n"
        f"    tail (>= p95, {len(tail)} requests): cached share median "
        f"{statistics.median(_share(r) for r in tail):.2f}, misses (share < 0.5) "
        f"{sum(_share(r) < 0.5 for r in tail)}, prompt tokens median "
        f"{statistics.median(r['prompt_tokens'] for r in tail):.0f}, sent at (s) "
        f"{sorted(round(r['at_s'], 1) for r in tail)}"
    )


def replicas_from_log(path: Path) -> dict[int, str]:
    """Plan index -> replica, from a fleetgate access log of a replay that sent ``replay-<index>`` ids."""
    out: dict[int, str] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        rid = str(entry.get("request_id") or "")
        if (
            entry.get("msg") == "request finished"
            and rid.startswith(REQUEST_ID_PREFIX)
            and entry.get("replica")
        ):
            out[int(rid.removeprefix(REQUEST_ID_PREFIX))] = str(entry["replica"])
    return out


def slowest_relative(mine: dict[int, Row], other: dict[int, Row], top: int) -> list[tuple[Row, Row]]:
    """The ``top`` requests whose TTFT in ``mine`` exceeds that in ``other`` the most (same index)."""
    common = set(mine) & set(other)
    order = sorted(common, key=lambda i: mine[i]["ttft_s"] - other[i]["ttft_s"], reverse=True)
    return [(mine[i], other[i]) for i in order[:top]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", type=Path)
    ap.add_argument("--contender", default="fleetgate:fleetgate")
    ap.add_argument("--against", default="fleetgate:cache_aware")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument(
        "--logdir", type=Path, help="router_compare's --logdir: replicas from fleetgate's access logs"
    )
    args = ap.parse_args()
    doc = json.loads(args.result.read_text())
    if "blocks" in doc:
        blocks = [b for b in doc["blocks"] if "request_rows" in b]
    else:  # one repeat: full reports by contender, in the order they ran (run<position> in --logdir)
        blocks = [
            {**rep, "contender": name, "repeat": 0, "position": i}
            for i, (name, rep) in enumerate(doc["results"].items())
            if "request_rows" in rep
        ]
    by: dict[tuple[str, int], dict[int, Row]] = {}
    for block in blocks:
        print(describe(block))
        rows = {r["index"]: dict(r) for r in block["request_rows"] if r["ok"] and r["ttft_s"] is not None}
        if args.logdir is not None:
            for i, replica in replicas_from_log(args.logdir / f"run{block['position']}-gateway.log").items():
                if i in rows:
                    rows[i]["replica"] = replica
        by[(block["contender"], block["repeat"])] = rows
    for repeat in sorted({b["repeat"] for b in blocks}):
        mine, other = by.get((args.contender, repeat)), by.get((args.against, repeat))
        if mine is None or other is None:
            continue
        print(f"repeat {repeat}: the requests {args.contender} made slowest relative to {args.against}")
        for a, b in slowest_relative(mine, other, args.top):
            print(
                f"    #{a['index']} sent at {a['at_s']:.1f} s, {a['prompt_tokens']} prompt tokens: "
                f"{a['ttft_s']:.3f} s (cached {a['cached_tokens']}{_on(a)}) against {b['ttft_s']:.3f} s "
                f"(cached {b['cached_tokens']}{_on(b)})"
            )


if __name__ == "__main__":
    main()
