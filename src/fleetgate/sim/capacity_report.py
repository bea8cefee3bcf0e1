"""The summary of a capacity run (the JSON of ``fleetgate simulate --scenario``) and its allocation plot.

Keys (issue 18): ``pool_gpu_hours``; ``deployments: {name: {replica_hours, peak_replicas, slo_attainment}}``;
``tiers: {reserved|best_effort: {requests, served, shed, slo_attainment}}``; ``tenants: {column: {deployment,
tier, requests, served, shed, peak_mu_per_min, mean_mu_per_min}}`` for every replayed column; plus the pool's
size, GPU-hours available and doing useful work, and the figures the tests check (``max_gpus_in_use``,
``min_ready_replicas`` against ``floor_replicas``).

* ``slo_attainment``: share of minutes (with admitted requests) whose TTFT p95 met ``slo_ttft_p95_s``; a
  tier's is over all deployments together, a deployment's over both tiers.
* ``useful_gpu_hours``: the GPU-hours that serving the admitted MU takes at the replicas' saturated rate;
  ``utilisation`` = useful / used (``pool_gpu_hours``): the share of the GPU-hours held doing useful work;
  ``pool_utilisation`` = useful / the pool's GPU-hours (held or not).
* A tenant column's ``requests``/``shed``: its own counts when it holds a reservation (its draw is its own);
  otherwise its share, window by window (its rate in the table over its group's), of its group's arrivals
  and sheds. ``peak_mu_per_min``/``mean_mu_per_min``: offered MU/min over the table's windows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fleetgate.sim import metrics as M

if TYPE_CHECKING:
    from fleetgate.sim.capacity import CapacitySimulator, Deployment, Recorder

#: Minutes per chunk when computing per-minute p95s (bounds the memory of the sort).
_CHUNK_MIN = 256


def minute_p95(waits: np.ndarray, counts: np.ndarray, quantiles: np.ndarray, per_min: int) -> np.ndarray:
    """Per-minute TTFT p95 of several columns together: each step's requests of column ``c`` take
    ``waits[s, c] + quantiles[c, k]`` with weight ``counts[s, c] / K``. ``nan`` for minutes without any."""
    n_steps, m = waits.shape
    k = quantiles.shape[1]
    n_min = n_steps // per_min
    out = np.full(n_min, math.nan)
    for s in range(0, n_min, _CHUNK_MIN):
        e = min(n_min, s + _CHUNK_MIN)
        w = waits[s * per_min : e * per_min].astype(np.float64).reshape(e - s, per_min, m)
        c = counts[s * per_min : e * per_min].astype(np.float64).reshape(e - s, per_min, m)
        vals = (w[:, :, :, None] + quantiles[None, None, :, :]).reshape(e - s, -1)
        wts = np.broadcast_to((c / k)[:, :, :, None], (e - s, per_min, m, k)).reshape(e - s, -1)
        order = np.argsort(vals, axis=1)
        sv = np.take_along_axis(vals, order, axis=1)
        sw = np.cumsum(np.take_along_axis(wts, order, axis=1), axis=1)
        tot = sw[:, -1]
        idx = np.argmax(sw >= 0.95 * tot[:, None] - 1e-12, axis=1)
        out[s:e] = np.where(tot > 1e-9, sv[np.arange(e - s), idx], math.nan)
    return out


def _tenant_rows(d: Deployment, per_win: int) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    table = d.table
    for g in d.groups:
        realised = g.counts[: (len(g.counts) // per_win) * per_win].reshape(-1, per_win).sum(axis=1)
        n_w = min(len(realised), len(table.t_s))
        rates = np.stack([table.rates[t][:n_w] for t in g.tenants])
        total = rates.sum(axis=0)
        share = np.divide(rates, total, out=np.zeros_like(rates), where=total > 0)
        requests = share @ realised[:n_w] if len(g.tenants) > 1 else np.array([float(g.counts.sum())])
        shed = share @ g.shed_by_window[:n_w] if len(g.tenants) > 1 else np.array([g.shed])
        for k, t in enumerate(g.tenants):
            mu_min = table.rates[t] * 60.0 * d.phys.e_mu
            reserved = d.spec.reservations.get(t, 0.0)
            rows[t] = {
                "deployment": d.spec.name,
                "tier": "reserved" if reserved > 0 else "best_effort",
                "reservation_mu_per_min": reserved,
                "requests": round(float(requests[k])),
                "served": round(float(requests[k] - shed[k])),
                "shed": round(float(shed[k])),
                "peak_mu_per_min": float(mu_min.max()) if mu_min.size else 0.0,
                "mean_mu_per_min": float(mu_min.mean()) if mu_min.size else 0.0,
            }
    return rows


def summarise(sim: CapacitySimulator, rec: Recorder, wall_s: float) -> dict[str, Any]:
    """The run's summary (JSON-ready except the ``_``-prefixed plot data)."""
    sc, deps = sim.sc, sim.deps
    dt = sc.step_s
    per_min = max(1, round(60.0 / dt))
    per_win = max(1, round(deps[0].table.window_s / dt))
    horizon_h = rec.n_steps * dt / 3600.0
    q = np.stack([d.phys.prefill_quantiles for d in deps])
    slo = sc.slo_ttft_p95_s
    deployments: dict[str, Any] = {}
    for j, d in enumerate(deps):
        both_w = np.stack([rec.wait_r[:, j], rec.wait_b[:, j]], axis=1)
        both_c = np.stack([rec.cnt_r[:, j], rec.cnt_b[:, j]], axis=1)
        p95 = minute_p95(both_w, both_c, np.stack([q[j], q[j]]), per_min)
        requests = sum(float(g.counts.sum()) for g in d.groups)
        served = float(rec.cnt_r[:, j].sum(dtype=np.float64) + rec.cnt_b[:, j].sum(dtype=np.float64))
        deployments[d.spec.name] = {
            "replica_hours": d.replica_seconds / 3600.0,
            "peak_replicas": d.peak_replicas,
            "slo_attainment": M.slo_attainment(p95, slo),
            "gpus_per_replica": d.spec.gpus_per_replica,
            "gpu_hours": d.replica_seconds * d.spec.gpus_per_replica / 3600.0,
            "mean_replicas": d.replica_seconds / 3600.0 / horizon_h if horizon_h > 0 else 0.0,
            "replicas_started": d.started,
            "lent_replica_hours": d.lent_seconds / 3600.0,
            "floor_replicas": d.floor,
            "min_ready_replicas": d.min_ready if rec.n_steps else 0,
            "sold_mu_per_min": float(sum(d.spec.reservations.values())),
            "replica_mu_per_min": d.phys.rep_rate * 60.0,
            "requests": round(requests),
            "served": round(served),
            "shed": round(requests - served),
        }
    tiers: dict[str, Any] = {}
    for tier, waits, counts in (("reserved", rec.wait_r, rec.cnt_r), ("best_effort", rec.wait_b, rec.cnt_b)):
        if tier == "reserved":
            requests = sum(g.requests_reserved for d in deps for g in d.groups)
        else:
            requests = sum(g.requests_best_effort for d in deps for g in d.groups)
        served = float(counts.sum(dtype=np.float64))
        p95 = minute_p95(waits, counts, q, per_min)
        tiers[tier] = {
            "requests": round(requests),
            "served": round(served),
            "shed": round(max(0.0, requests - served)),
            "slo_attainment": M.slo_attainment(p95, slo),
            "minutes_missed": int(np.sum(p95[~np.isnan(p95)] > slo)),
        }
    tenants: dict[str, Any] = {}
    for d in deps:
        tenants.update(_tenant_rows(d, per_win))
    used = sum(d.replica_seconds * d.spec.gpus_per_replica for d in deps) / 3600.0
    useful = sum(d.served_mu / d.phys.rep_rate * d.spec.gpus_per_replica for d in deps) / 3600.0
    available = sc.pool.gpus * horizon_h
    summary: dict[str, Any] = {
        "mode": "fluid",
        "capacity": sim.mode,
        "pool": {"name": sc.pool.name, "gpus": sc.pool.gpus},
        "horizon_h": horizon_h,
        "slo_ttft_p95_s": slo,
        "pool_gpu_hours": used,
        "pool_gpu_hours_available": available,
        "pool_occupancy": used / available if available > 0 else 0.0,
        "useful_gpu_hours": useful,
        "utilisation": useful / used if used > 0 else 0.0,
        "pool_utilisation": useful / available if available > 0 else 0.0,
        "max_gpus_in_use": rec.max_gpus_in_use,
        "lent_gpu_hours": sum(d.lent_seconds * d.spec.gpus_per_replica for d in deps) / 3600.0,
        "reclaims": sim.reclaims,
        "deployments": deployments,
        "tiers": tiers,
        "tenants": tenants,
        "autoscaler": sc.autoscaler,
        "step_s": dt,
        "steps": rec.n_steps,
        "wall_s": wall_s,
    }
    out: dict[str, Any] = M.clean(summary)
    out["_allocation"] = rec.allocation
    out["_deployments"] = [d.spec.name for d in deps]
    out["_gpus_per_replica"] = [d.spec.gpus_per_replica for d in deps]
    per_day = max(1, round(86400.0 / dt))
    offered = np.zeros(max(1, math.ceil(rec.n_steps / per_day)))
    for d in deps:
        for g in d.groups:
            c = g.counts[: rec.n_steps]
            offered += np.bincount(np.arange(len(c)) // per_day, weights=c, minlength=len(offered))
    out["_offered_per_day"] = offered.tolist()
    return out


def busiest_day(summary: dict[str, Any]) -> int:
    """The (0-based) day with the most requests offered to the pool."""
    offered = summary.get("_offered_per_day") or [0.0]
    return int(np.argmax(offered))


def plot_allocation(summaries: dict[str, dict[str, Any]], out: Path, day: int, title: str) -> None:
    """One panel per capacity mode: each deployment's GPUs (ready + starting + draining, stacked) over one
    day, the pool size, and (fleetgate) the floors and the GPUs lent as headroom."""
    from fleetgate.plots import pyplot

    plt = pyplot()
    modes = list(summaries)
    fig, axes = plt.subplots(len(modes), 1, figsize=(11, 3.2 * len(modes)), sharex=True, squeeze=False)
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        s = summaries[mode]
        rows = np.asarray(s["_allocation"], dtype=np.float64)
        names, gpr = s["_deployments"], np.asarray(s["_gpus_per_replica"], dtype=np.float64)
        n = len(names)
        keep = (rows[:, 0] >= day * 86400) & (rows[:, 0] < (day + 1) * 86400)
        r = rows[keep]
        hours = (r[:, 0] - day * 86400) / 3600.0
        per = r[:, 1:].reshape(len(r), n, 6)
        gpus = (per[:, :, 0] + per[:, :, 1] + per[:, :, 2]) * gpr
        ax.stackplot(hours, gpus.T, labels=names, alpha=0.75)
        if mode == "fleetgate":
            floors = np.cumsum(per[:, :, 4] * gpr, axis=1)
            ax.plot(hours, floors[:, -1], "k--", lw=1, label="floors (sum)")
            lent = (per[:, :, 5] * gpr).sum(axis=1)
            if lent.any():
                ax.plot(hours, lent, "k:", lw=1, label="lent headroom (sum)")
        wanted = (per[:, :, 3] * gpr).sum(axis=1)
        ax.plot(hours, wanted, color="grey", lw=0.8, label="autoscalers' demand (sum)")
        ax.axhline(s["pool"]["gpus"], color="red", lw=1.2, label=f"pool ({s['pool']['gpus']} GPUs)")
        be = s["tiers"]["best_effort"]
        ax.set_title(
            f"{mode}: utilisation {s['utilisation']:.2f}, "
            f"reserved slo {s['tiers']['reserved']['slo_attainment']:.4f}, "
            f"best-effort shed {be['shed'] / max(1, be['requests']):.2%}",
            fontsize=9,
        )
        ax.set_ylabel("GPUs")
        ax.legend(fontsize=7, loc="upper left", ncol=3)
    axes[-1, 0].set_xlabel(f"hour of day {day}")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
