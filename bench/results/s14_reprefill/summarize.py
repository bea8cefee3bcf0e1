"""Session 14 screen summary: per draw and per cell p95 / cache_aware, p95 / default, bar; geometric means.

    python bench/results/s14_reprefill/summarize.py bench/results/s14_reprefill/screen [--rows] [--merge DIR]

``--merge DIR``: add DIR's rows (e.g. a variant run alone, without cache_aware and the default, which are
deterministic: their rows come from the first folder); a merged row's bar is computed here against
cache_aware (p95 <= 0.8x, hit >= 0.9x, p99 <= cache_aware's), as ``session_affinity.py --bar`` does when
cache_aware is the only other policy.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from pathlib import Path


def parse(d: Path) -> tuple[dict, dict]:
    runs: dict = {}  # (seed, load, n) -> label -> (p50, p95, p99, hit)
    bars: dict = {}  # (seed, load, n, label) -> met
    for f in sorted(d.glob("s*_x*.txt")):
        seed = int(f.name[1 : f.name.index("_")])
        for line in f.read_text().splitlines():
            c = [x.strip() for x in line.strip().strip("|").split("|")]
            if len(c) == 12 and c[0] == "agentic":
                figs = tuple(float(x) for x in (c[5], c[6], c[7], c[9]))
                runs.setdefault((seed, c[1], int(c[2])), {})[c[4]] = figs
            elif len(c) == 9 and c[0] == "agentic":
                bars[(seed, c[1], int(c[2]), c[3])] = c[8] == "yes"
    return runs, bars


def gm(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main() -> None:
    d = Path(sys.argv[1])
    runs, bars = parse(d)
    if "--merge" in sys.argv:
        more, _ = parse(Path(sys.argv[sys.argv.index("--merge") + 1]))
        for key, rows in more.items():
            runs.setdefault(key, {}).update(rows)
            ca = runs[key].get("cache_aware")
            for lab, (_, p95, p99, hit) in rows.items():
                if ca is not None and lab.startswith("fleetgate"):
                    bars[(*key, lab)] = p95 <= 0.8 * ca[1] and hit >= 0.9 * ca[3] and p99 <= ca[2]
    labels = [lab for lab in next(iter(runs.values())) if lab.startswith("fleetgate")]
    if "--rows" in sys.argv:
        heads = " | ".join(f"{lab} p95 s, hit (/ca, /default, bar)" for lab in labels)
        print(f"| seed | cell | {heads} |")
        print("|---|---|" + "---|" * len(labels))
        for key in sorted(runs, key=lambda k: (k[1], k[2], k[0])):
            seed, load, n = key
            r = runs[key]
            if "cache_aware" not in r or "fleetgate" not in r:
                continue
            ca, de = r["cache_aware"][1], r["fleetgate"][1]
            cells = []
            for lab in labels:
                if lab not in r:
                    cells.append("-")
                    continue
                _, p95, _, hit = r[lab]
                met = "**yes**" if bars.get((seed, load, n, lab)) else "no"
                cells.append(f"{p95:.1f}, {hit:.3f} ({p95 / ca:.3f}, {p95 / de:.3f}, {met})")
            print(f"| {seed} | {n} x{load} | " + " | ".join(cells) + " |")
        print()
    print(
        "| policy | draws | bar met | geo mean p95 / cache_aware | geo mean p95 / default | p99 / default "
        "| hit / default | per cell geo mean p95 / default (16 x0.015, 32 x0.015, 16 x0.02, 32 x0.02) "
        "| worst / best draw p95 / default |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    cells = sorted({(k[1], k[2]) for k in runs})
    for lab in labels:
        rca, rde, r99, rhit, nbar, per = [], [], [], [], 0, defaultdict(list)
        for key, r in runs.items():
            if lab not in r or "cache_aware" not in r or "fleetgate" not in r:
                continue
            rca.append(r[lab][1] / r["cache_aware"][1])
            rde.append(r[lab][1] / r["fleetgate"][1])
            r99.append(r[lab][2] / r["fleetgate"][2])
            rhit.append(r[lab][3] / r["fleetgate"][3])
            nbar += bool(bars.get((*key, lab)))
            per[(key[1], key[2])].append(rde[-1])
        pc = ", ".join(f"{gm(per[c]):.3f}" for c in cells)
        print(
            f"| {lab} | {len(rca)} | {nbar} | {gm(rca):.3f} | {gm(rde):.3f} | {gm(r99):.3f} | {gm(rhit):.4f} "
            f"| {pc} | {max(rde):.2f} / {min(rde):.2f} |"
        )


if __name__ == "__main__":
    main()
