"""Markdown + PNG reports of simulation runs (TTFT CDF per policy, load per replica, replicas over time)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fleetgate.sim.des import RunResult

TABLE_KEYS: tuple[str, ...] = (
    "policy",
    "autoscaler",
    "mode",
    "replicas",
    "requests",
    "completed",
    "rejected",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "e2e_p95_s",
    "output_tokens_per_s",
    "cache_hit_rate",
    "replica_hours",
    "max_over_mean_load",
    "slo_attainment",
    "wall_s",
)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def markdown_table(summaries: Sequence[Mapping[str, Any]], keys: Sequence[str] = TABLE_KEYS) -> str:
    """One row per run; only the columns some run has."""
    cols = [k for k in keys if any(k in s for s in summaries)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for s in summaries:
        lines.append("| " + " | ".join(_fmt(s.get(k)) for k in cols) + " |")
    return "\n".join(lines)


def write_report(
    out_dir: Path,
    runs: Mapping[str, RunResult | None],
    summaries: Mapping[str, Mapping[str, Any]],
    title: str,
    command: str = "",
) -> Path:
    """Write ``report.md`` plus PNG plots into ``out_dir``; returns the Markdown path."""
    from fleetgate.plots import pyplot

    plt = pyplot()

    out_dir.mkdir(parents=True, exist_ok=True)
    pngs: list[str] = []

    des_runs = {k: r for k, r in runs.items() if r is not None}
    if des_runs:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, r in des_runs.items():
            v = r.ttft_s[~np.isnan(r.ttft_s)]
            if v.size:
                xs = np.sort(v)
                ax.plot(xs, np.arange(1, xs.size + 1) / xs.size, label=name)
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_title("TTFT CDF per policy")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "ttft_cdf.png", dpi=110)
        plt.close(fig)
        pngs.append("ttft_cdf.png")

        for name, r in des_runs.items():
            if r.window_load.size == 0:
                continue
            fig, ax = plt.subplots(figsize=(7, 4.5))
            minutes = np.arange(r.window_load.shape[0])
            for j in range(r.window_load.shape[1]):
                ax.plot(minutes, r.window_load[:, j], lw=0.8, alpha=0.7)
            ax.set_xlabel("minute")
            ax.set_ylabel("MU dispatched per minute")
            ax.set_title(f"load per replica ({name})")
            ax.grid(True, alpha=0.3)
            fig.tight_layout()
            fname = f"load_per_replica_{_safe(name)}.png"
            fig.savefig(out_dir / fname, dpi=110)
            plt.close(fig)
            pngs.append(fname)

    series = {k: s.get("_replicas_over_time") for k, s in summaries.items()}
    for name, r in des_runs.items():
        if not series.get(name):
            series[name] = [list(x) for x in r.replicas_over_time]
    if any(series.values()):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, pts in series.items():
            if not pts:
                continue
            arr = np.asarray(pts, dtype=float)
            ax.step(arr[:, 0] / 3600.0, arr[:, 2], where="post", label=name)
        ax.set_xlabel("hours")
        ax.set_ylabel("replicas (ready + starting)")
        ax.set_title("replicas over time")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "replicas_over_time.png", dpi=110)
        plt.close(fig)
        pngs.append("replicas_over_time.png")

    rows = [{k: v for k, v in s.items() if not k.startswith("_")} for s in summaries.values()]
    md = [f"# {title}", ""]
    if command:
        md += ["```", command, "```", ""]
    md += [markdown_table(rows), ""]
    md += [f"![{p}]({p})" for p in pngs]
    path = out_dir / "report.md"
    path.write_text("\n".join(md) + "\n", encoding="utf-8")
    return path


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
