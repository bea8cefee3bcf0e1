"""Live ratios of a run against the pre-registered predictions (pred_pre_*.txt of this folder).

usage: summarize.py LIVE.json TAG [TAG...]   (TAG: pre_base, pre_cores, ...)
Prints per other contender and figure: the live ratio (median of per-repeat paired ratios), each
prediction (median of 16 draws) and its error (predicted / live - 1); p95 within 15% counted.
Also the replicas' prompt speed per block (blocks[].engines_prompt: ms per evaluated token, summed over
the replicas), the block's p95 and its CPU shares.
"""

import json
import re
import sys
from pathlib import Path

here = Path(__file__).parent
live = json.loads(Path(sys.argv[1]).read_text())
tags = sys.argv[2:]
FIG = ("p50", "p95", "p99", "hit")


def predicted(tag: str) -> dict[tuple[str, str], float]:
    """(contender, figure) -> predicted fleetgate/other ratio (compare table's 'predicted' column)."""
    out = {}
    for line in (here / f"pred_{tag}.txt").read_text().splitlines():
        m = re.match(r"\| (\S+) \| (p50|p95|p99|hit) \| (?:[^|]*\|){5} ([0-9.]+) \|", line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


preds = {t: predicted(t) for t in tags}
paired = live["paired"]
print(
    f"live {sys.argv[1]} ({live['meta']['date_utc']}, load {live['meta']['load_avg_at_start']:.1f} -> "
    f"{live['meta']['load_avg_at_end']:.1f})"
)
print("| other | figure | live | " + " | ".join(tags) + " |")
print("|---|---|---|" + "---|" * len(tags))
held = {t: 0 for t in tags}
n = 0
for name, p in paired.items():
    for f in FIG:
        lr = p[f"{f}_ratio_median"]
        cells = []
        for t in tags:
            v = preds[t].get((name, f))
            if v is None:
                cells.append("-")
                continue
            err = v / lr - 1
            cells.append(f"{v:.3f} ({err:+.1%})")
            if f == "p95":
                held[t] += abs(err) <= 0.15
        n += f == "p95"
        per = " ".join(f"{x:.2f}" for x in p[f"{f}_ratios"])
        print(f"| {name} | {f} | {lr:.3f} [{per}] | " + " | ".join(cells) + " |")
print("\np95 within 15%: " + ", ".join(f"{t} {held[t]} of {n}" for t in tags))
print("\n| # | contender | start | ms per evaluated token | p95 s | hit | CPU user / nice / idle | load |")
print("|---|---|---|---|---|---|---|---|")
for i, b in enumerate(live["blocks"]):
    ep = b.get("engines_prompt") or []
    ev = sum(e["evaluated"] for e in ep)
    ms = 1e3 * sum(e["prompt_seconds_total"] for e in ep) / ev if ev else float("nan")
    c = b["cpu_shares"]
    la = b["load_avg_1min"]
    print(
        f"| {i} | {b['contender']} | {b['start_utc']} | {ms:.3f} | {b['ttft_s']['p95']:.2f} | "
        f"{b['prefix_cache_hit_rate']:.3f} | {c['user']:.2f} / {c['nice']:.2f} / {c['idle']:.2f} | "
        f"{la[0]:.1f}->{la[1]:.1f} |"
    )
