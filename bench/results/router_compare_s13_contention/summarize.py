"""Summarise predict_all.sh outputs: p95 ratio errors (counted as router_compare_sim.compare_live counts
them: other routers, variants of the default not counted) and absolute p50 / p95 errors of every
contender's figures (sim / live - 1).  usage: summarize.py TAG [TAG ...]"""

import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = [
    "router_compare_s11_llama_mc10",
    "router_compare_s10_aglive_l1",
    "router_compare_s10_aglive_l2",
    "router_compare_llama_s7_mooncake_x1",
    "router_compare_llama_s7_mooncake_x1.5",
    "router_compare_llama_s7_azure_x1",
    "router_compare_llama_s7_azure_x2",
    "mc13",
]


def rows(tag, run):
    for line in (HERE / f"pred_{tag}_{run}.txt").read_text().splitlines():
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if (
            len(c) == 11
            and c[1] in ("p50", "p95", "p99", "hit")
            and c[5] != "-"
            and c[6] != "live fleetgate/other"
        ):
            yield c


def main():
    tags = sys.argv[1:]
    table = {}
    absolute = {t: {"p50": [], "p95": []} for t in tags}
    for tag in tags:
        for run in RUNS:
            figs = {}  # (contender, figure) -> (live, sim)
            for c in rows(tag, run):
                other, fig = c[0], c[1]
                if fig in ("p50", "p95"):
                    figs[("fleetgate:fleetgate", fig)] = (float(c[2]), float(c[3]))
                    figs[(other, fig)] = (float(c[4]), float(c[5]))
                if fig != "p95" or other.startswith("fleetgate:fleetgate@"):
                    continue
                table.setdefault((run, other), {})[tag] = (float(c[6]), float(c[7]), c[8])
            for (_, fig), (lv, sv) in figs.items():
                absolute[tag][fig].append(abs(sv / lv - 1))
    print(
        "| live run | other | live p95 ratio | " + " | ".join(f"{t}: predicted (error)" for t in tags) + " |"
    )
    print("|---|---|---|" + "---|" * len(tags))
    held = dict.fromkeys(tags, 0)
    errs = {t: [] for t in tags}
    for (run, other), per in table.items():
        live = next(iter(per.values()))[0]
        cells = []
        for t in tags:
            lr, pr, e = per[t]
            err = pr / lr - 1
            held[t] += abs(err) <= 0.15
            errs[t].append(abs(err))
            cells.append(f"{pr:.3f} ({e})")
        print(f"| {run.replace('router_compare_', '')} | {other} | {live:.3f} | " + " | ".join(cells) + " |")
    print()
    for t in tags:
        a = absolute[t]
        print(
            f"{t}: p95 ratio within 15%: {held[t]} of {len(errs[t])}; median |ratio error| "
            f"{statistics.median(errs[t]):.1%}; absolute |sim/live - 1| over contenders: "
            f"p50 median {statistics.median(a['p50']):.1%}, p95 median {statistics.median(a['p95']):.1%}"
        )


main()
