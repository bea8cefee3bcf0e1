"""Autoscaling on ServeGen (simulator): static peak vs KPA-style vs fleetgate (issue 6, Acceptance).

Replays /work/shared/traces/servegen/rates_language_m-large.csv (14 days of per-tenant rates, 10-minute
windows) in the simulator's fluid mode for (a) the whole model as one deployment and (b) each of the N largest
tenants (by request volume) as its own deployment, with a GPU profile, a cold start and a TTFT p95 SLO, and
prints one Markdown table of replica_hours and slo_attainment per case and autoscaler, plus totals.

Usage:
    .venv/bin/python bench/autoscale_servegen.py [--tenants 16] [--jobs 2] [--json OUT]
    .venv/bin/python bench/autoscale_servegen.py --duration-s 86400 --tenants 4   # a shorter slice

Each case draws its workload (arrival counts and MU per 1 s step) once and runs the three autoscalers on the
same draw. Static peak = ``replicas_for(peak 10-minute MU/min, capacity, 0.7)``: the replicas the peak window
needs at the same target utilisation fleetgate uses (``--static-target``).
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from fleetgate.core.autoscale import build_autoscaler, replicas_for
from fleetgate.profiles import load_profile
from fleetgate.sim.engine import perf_params_from_profile
from fleetgate.sim.fluid import FluidConfig, FluidSimulator, Workload, workload_from_rates
from fleetgate.sim.runner import parse_params
from fleetgate.sim.traces import default_traces_dir, length_source, load_rate_table

AUTOSCALERS: tuple[str, ...] = ("static", "kpa", "fleetgate")
WHOLE = "(all tenants)"


@dataclass(slots=True)
class Settings:
    """One benchmark configuration (everything that changes the numbers)."""

    trace: str
    profile: str = "llama2-70b-h100-tp4"
    slo_s: float = 1.0
    cold_start_s: float = 180.0
    seed: int = 0
    start_s: float = 0.0
    duration_s: float | None = None
    static_target: float = 0.7
    kpa_params: dict[str, Any] = field(default_factory=dict)
    fleetgate_params: dict[str, Any] = field(default_factory=dict)
    #: Extra columns: label -> (autoscaler name, parameters), e.g. fleetgate with a headroom term.
    variants: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    step_s: float = 1.0


def top_tenants(trace: str, n: int) -> list[str]:
    """The ``n`` tenants with the most requests over the whole table."""
    table = load_rate_table(Path(trace))
    vol = {k: float(np.sum(v)) for k, v in table.rates.items()}
    return sorted(vol, key=lambda k: (-vol[k], k))[:n]


def build_workload(s: Settings, tenant: str | None) -> tuple[Workload, Any, Any, float, float]:
    """The case's fluid workload, profile, engine parameters, and the peak and first 10-minute MU/min."""
    profile = load_profile(s.profile)
    perf = perf_params_from_profile(profile)
    table = load_rate_table(Path(s.trace)).select(tenant).slice(s.start_s, s.duration_s)
    work = workload_from_rates(table, length_source(None), profile, perf, s.step_s, seed=s.seed)
    per_win = max(1, round(table.window_s / s.step_s))
    n_win = len(work.mu) // per_win
    win_mu = work.mu[: n_win * per_win].reshape(n_win, per_win).sum(axis=1)
    peak_mu_per_min = float(win_mu.max()) * 60.0 / table.window_s if n_win else 0.0
    first_mu_per_min = float(win_mu[0]) * 60.0 / table.window_s if n_win else 0.0
    return work, profile, perf, peak_mu_per_min, first_mu_per_min


def autoscaler_params(
    s: Settings, name: str, profile: Any, peak_mu_per_min: float
) -> tuple[str, dict[str, Any]]:
    """(autoscaler name, parameters) of one column label."""
    if name in s.variants:
        return s.variants[name][0], dict(s.variants[name][1])
    return name, _base_params(s, name, profile, peak_mu_per_min)


def _base_params(s: Settings, name: str, profile: Any, peak_mu_per_min: float) -> dict[str, Any]:
    if name == "static":
        return {
            "replicas": max(1, replicas_for(peak_mu_per_min, profile.capacity_mu_per_min, s.static_target))
        }
    if name == "kpa":
        return dict(s.kpa_params)
    return dict(s.fleetgate_params)


def run_case(args: tuple[Settings, str | None, Sequence[str]]) -> dict[str, Any]:
    """All autoscalers on one deployment (one workload draw)."""
    s, tenant, names = args
    t0 = time.perf_counter()
    work, profile, perf, peak, first = build_workload(s, tenant)
    # Autoscalers start warm: the deployment existed before the trace, sized for its first window.
    warm = max(1, replicas_for(first, profile.capacity_mu_per_min, s.static_target))
    out: dict[str, Any] = {
        "case": tenant or WHOLE,
        "requests": float(work.counts.sum()),
        "peak_mu_per_min": peak,
        "mean_mu_per_min": float(work.mu.sum()) * 60.0 / max(1.0, len(work.mu) * s.step_s),
        "unloaded_ttft_p50_s": float(np.quantile(work.prefill_quantiles, 0.5)) + perf.step_overhead_s / 2,
        "unloaded_ttft_p95_s": float(np.quantile(work.prefill_quantiles, 0.95)) + perf.step_overhead_s / 2,
        "active_minutes": _active_minutes(work.counts, s.step_s),
        "runs": {},
    }
    for name in names:
        base, params = autoscaler_params(s, name, profile, peak)
        scaler = build_autoscaler(base, params)
        start = int(params["replicas"]) if base == "static" else warm
        cfg = FluidConfig(
            replicas=start,
            seed=s.seed,
            step_s=s.step_s,
            cold_start_s=s.cold_start_s,
            slo_ttft_p95_s=s.slo_s,
        )
        summ = FluidSimulator(work, profile, perf, cfg, autoscaler=scaler).run()
        out["runs"][name] = {
            "autoscaler": base,
            "params": params,
            **{
                k: summ[k]
                for k in (
                    "replica_hours",
                    "slo_attainment",
                    "ttft_p50_s",
                    "ttft_p95_s",
                    "ttft_p99_s",
                    "peak_replicas",
                    "rejected",
                    "requests",
                )
            },
        }
    out["wall_s"] = time.perf_counter() - t0
    return out


def des_check(s: Settings, tenant: str, names: Sequence[str]) -> str:
    """The same slice in discrete-event and fluid mode (``runner.run``; least-requests routing in DES)."""
    from fleetgate.sim.runner import SimOptions, run

    _, profile, _, peak, first = build_workload(s, tenant)
    warm = max(1, replicas_for(first, profile.capacity_mu_per_min, s.static_target))
    rows = [
        "| autoscaler | requests | rh des | rh fluid | p95 des | p95 fluid | slo des | slo fluid |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        base, params = autoscaler_params(s, name, profile, peak)
        out = {}
        for mode in ("des", "fluid"):
            opts = SimOptions(
                trace=s.trace,
                tenant=tenant,
                policy="least_requests",
                profile=s.profile,
                seed=s.seed,
                start_s=s.start_s,
                duration_s=s.duration_s,
                mode=mode,
                autoscale=base,
                autoscale_params=params,
                replicas=int(params["replicas"]) if base == "static" else warm,
                cold_start_s=s.cold_start_s,
                slo_ttft_p95_s=s.slo_s,
            )
            out[mode], _ = run(opts)
        d, f = out["des"], out["fluid"]
        rows.append(
            f"| {name} | {d['requests']} | {d['replica_hours']:.1f} | {f['replica_hours']:.1f} | "
            f"{_f(d['ttft_p95_s'], '.3g')} | {_f(f['ttft_p95_s'], '.3g')} | "
            f"{_f(d['slo_attainment'], '.3f')} | {_f(f['slo_attainment'], '.3f')} |"
        )
    return "\n".join(rows)


def _active_minutes(counts: np.ndarray, step_s: float) -> int:
    per_min = max(1, round(60.0 / step_s))
    n = len(counts) // per_min
    return int(np.count_nonzero(counts[: n * per_min].reshape(n, per_min).sum(axis=1) > 0))


def _f(x: float | None, fmt: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def markdown(
    results: Sequence[Mapping[str, Any]], names: Sequence[str], fleetgate_labels: Sequence[str] = ()
) -> str:
    """One row per case: replica-hours and slo_attainment per autoscaler; totals for the per-tenant cases."""
    head = "| deployment | requests | peak/mean |"
    sep = "|---|---|---|"
    for n in names:
        head += f" {n} rh | {n} slo |"
        sep += "---|---|"
    comps = [(f, b) for f in fleetgate_labels for b in ("static", "kpa") if b in names]
    for f, b in comps:
        head += f" {f} vs {b} |"
        sep += "---|"
    lines = [head, sep]

    def row(label: str, res: Mapping[str, Any], reqs: float, p2m: str) -> str:
        line = f"| {label} | {reqs / 1e6:.2f} M | {p2m} |"
        for n in names:
            r = res[n]
            line += f" {r['replica_hours']:,.0f} | {_f(r['slo_attainment'], '.4f')} |"
        for f, b in comps:
            line += f" {res[f]['replica_hours'] / res[b]['replica_hours'] - 1:+.1%} |"
        return line

    tenants = [r for r in results if r["case"] != WHOLE]
    for r in results:
        p2m = r["peak_mu_per_min"] / r["mean_mu_per_min"] if r["mean_mu_per_min"] > 0 else math.nan
        lines.append(row(str(r["case"]), r["runs"], r["requests"], f"{p2m:.1f}"))
    if tenants:
        tot: dict[str, dict[str, float]] = {}
        for n in names:
            rh = sum(r["runs"][n]["replica_hours"] for r in tenants)
            # Unweighted mean of the deployments' attainment (the worst one is printed below).
            slos = [r["runs"][n]["slo_attainment"] for r in tenants]
            tot[n] = {"replica_hours": rh, "slo_attainment": float(np.mean(slos))}
        label = f"**total, {len(tenants)} tenants** (slo: mean)"
        lines.append(row(label, tot, sum(r["requests"] for r in tenants), ""))
        # Pooled: every tenant-minute with arrivals counts once (the metric's own definition, fleet-wide).
        pooled = {
            n: sum(r["runs"][n]["slo_attainment"] * r["active_minutes"] for r in tenants)
            / max(1, sum(r["active_minutes"] for r in tenants))
            for n in names
        }
        lines.append(
            "| tenant-minutes pooled slo | | |"
            + "".join(f" | {_f(pooled[n], '.4f')} |" for n in names)
            + " |" * len(comps)
        )
        mins = {n: min(r["runs"][n]["slo_attainment"] for r in tenants) for n in names}
        lines.append(
            "| worst tenant slo | | |"
            + "".join(f" | {_f(mins[n], '.4f')} |" for n in names)
            + " |" * len(comps)
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(default_traces_dir() / "servegen" / "rates_language_m-large.csv"))
    ap.add_argument("--profile", default="llama2-70b-h100-tp4")
    ap.add_argument("--slo", type=float, default=1.0, help="TTFT p95 SLO per minute, seconds")
    ap.add_argument("--cold-start-s", type=float, default=180.0)
    ap.add_argument("--tenants", type=int, default=16, help="largest tenants as their own deployments")
    ap.add_argument("--no-whole", action="store_true", help="skip (a), the whole model as one deployment")
    ap.add_argument("--only", default=None, help="comma-separated tenant ids instead of the top N")
    ap.add_argument("--autoscalers", default=",".join(AUTOSCALERS))
    ap.add_argument("--start-s", type=float, default=0.0)
    ap.add_argument("--duration-s", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--static-target", type=float, default=0.7)
    ap.add_argument("--kpa-param", action="append", default=[], help="key=value (repeatable)")
    ap.add_argument("--fleetgate-param", action="append", default=[], help="key=value (repeatable)")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="extra column LABEL=AUTOSCALER:k=v,k=v (e.g. fleetgate-h=fleetgate:headroom_beta=0.5)",
    )
    ap.add_argument(
        "--des-check",
        default=None,
        metavar="TENANT",
        help="only compare des and fluid on TENANT over --start-s/--duration-s (default 1 h)",
    )
    ap.add_argument("--jobs", type=int, default=2, help="processes (at most 2 on the shared dev VM)")
    ap.add_argument("--json", default=None, help="write all results here")
    args = ap.parse_args(argv)

    # Knative's concurrency target must be set per model; 32 in-flight requests per replica (x Knative's 70%)
    # keeps the flat tenant client_143 within the SLO, 64 (the engine's batch) does not (docs/benchmarks.md).
    kpa: dict[str, Any] = {"target_concurrency": 32}
    kpa.update(parse_params(args.kpa_param))
    s = Settings(
        trace=args.trace,
        profile=args.profile,
        slo_s=args.slo,
        cold_start_s=args.cold_start_s,
        seed=args.seed,
        start_s=args.start_s,
        duration_s=args.duration_s,
        static_target=args.static_target,
        kpa_params=kpa,
        fleetgate_params=parse_params(args.fleetgate_param),
    )
    names = [n for n in args.autoscalers.split(",") if n]
    for spec in args.variant:
        label, _, rest = spec.partition("=")
        base, _, kv = rest.partition(":")
        s.variants[label] = (base, parse_params([x for x in kv.split(",") if x]))
        names.append(label)
    fg_labels = [n for n in names if n == "fleetgate" or s.variants.get(n, ("",))[0] == "fleetgate"]
    if args.des_check:
        if s.duration_s is None:
            s.duration_s = 3600.0
        print(f"{args.des_check}, {s.start_s:g} s + {s.duration_s:g} s, SLO {s.slo_s:g} s, {s.profile}")
        print(des_check(s, args.des_check, names))
        return 0
    cases: list[str | None] = [] if args.no_whole else [None]
    cases += args.only.split(",") if args.only else top_tenants(args.trace, args.tenants)
    t0 = time.perf_counter()
    work = [(s, c, names) for c in cases]
    results: list[dict[str, Any]] = []

    def _done(r: dict[str, Any]) -> None:
        results.append(r)
        runs = ", ".join(
            f"{n} {v['replica_hours']:.0f} rh / {_f(v['slo_attainment'], '.4f')}"
            for n, v in r["runs"].items()
        )
        print(f"[{len(results)}/{len(work)}] {r['case']}: {runs} ({r['wall_s']:.0f} s)", file=sys.stderr)

    if args.jobs > 1 and len(work) > 1:
        with ProcessPoolExecutor(max_workers=min(args.jobs, len(work))) as pool:
            for r in pool.map(run_case, work):
                _done(r)
    else:
        for w in work:
            _done(run_case(w))
    wall = time.perf_counter() - t0
    print(
        f"ServeGen {Path(args.trace).name}, profile {args.profile}, cold start {args.cold_start_s:g} s, "
        f"TTFT p95 SLO {args.slo:g} s per minute, fluid mode, seed {args.seed}; "
        f"kpa {s.kpa_params}; fleetgate {s.fleetgate_params or 'defaults'}; "
        f"variants {s.variants or 'none'}; autoscalers start warm (first window at 0.7); "
        f"static = peak 10-min MU at {args.static_target:g} utilisation"
    )
    if results:
        r0 = results[0]
        print(f"unloaded TTFT p50 {r0['unloaded_ttft_p50_s']:.3f} s, p95 {r0['unloaded_ttft_p95_s']:.3f} s")
    print()
    print(markdown(results, names, fg_labels))
    print()
    print(
        f"{len(results)} deployments in {wall:.0f} s wall on {platform.node()} "
        f"({platform.machine()}, {args.jobs} processes), {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    )
    if args.json:
        import json

        Path(args.json).write_text(
            json.dumps({"settings": asdict(s), "results": results}, indent=1, default=str)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
