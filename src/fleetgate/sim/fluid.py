"""Fluid mode: a time-stepped aggregate model of the fleet for horizons a per-request simulation cannot cover.

Fourteen days at hundreds of requests per second is hundreds of millions of requests; the fluid model instead
advances the fleet in steps of ``step_s`` (1 s) and keeps, per replica, aggregate quantities in model units:

* **Arrivals per step** are drawn, not enumerated. From a rate table: the count is a gamma-mixed Poisson
  (negative binomial) whose variance matches the gamma-renewal generator of ``sim.traces`` (index of
  dispersion ``sum_i cv_i^2 r_i / sum_i r_i``); the step's MU is normal with the per-request mean and variance
  of the length source times the count. From a recorded trace (azure, mooncake, expanded servegen): the exact
  per-step counts, MU and prefill seconds are binned from the requests.
* **Routing** is assumed balanced: arrivals split evenly over ready replicas (the MU least-load policies get
  close to this; random routing does not, see docs/simulator.md).
* **Service** follows the engine model's physics (``PerfParams`` from the profile), not the nominal MU
  capacity: one replica saturates at ``1 / (prefill + decode + overhead / batch)`` seconds per request with
  the batch at ``max_num_seqs`` (or what the KV cache holds), evaluated on the recent arrival mix. Work it
  cannot serve stays in a backlog (MU) that delays every later request by ``backlog / fleet service rate``.
* **TTFT** of a request arriving in a step = backlog wait + prefill queueing (Pollaczek-Khinchine mean wait of
  the prefill work at the current utilisation) + its own prefill time (input tokens x ``prefill_s_per_token``
  plus one iteration per chunk). Percentiles are exact over a fixed set of prefill-time quantiles per step.
* **In flight and settled** as the gateway counts them: a step's arrivals are in flight from their arrival
  until arrival + their end-to-end latency, when their real MU settles (the in-flight MU at the gateway's
  estimate, output budgeted at the p90).
* **After a scale-up** a backlog stays on the replicas that were ready before (requests are not moved once
  dispatched) and drains at their rate, while new arrivals go to the fresh replicas, until the fresh
  replicas' queues catch up and all share one queue again.
* **Autoscaling and admission** are the same objects as in discrete-event mode: the autoscaler's ``decide``
  is called every ``autoscale_interval_s`` with an ``AutoscaleContext`` (settled MU of the last minute, MU and
  requests in flight), new replicas serve after the cold start. An optional admission object
  (``FluidAdmission``) may shed part of a step's arrivals.

Replica-seconds count from provisioning to stop, as in discrete-event mode.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fleetgate.core.autoscale import AutoscaleContext, Autoscaler
from fleetgate.core.units import CostProfile
from fleetgate.sim import metrics as M
from fleetgate.sim.traces import (
    LengthSource,
    RateTable,
    Trace,
    tenant_cv,
)
from fleetgate.simengine.perfmodel import PerfParams

#: Prefill-time quantile points kept per step for TTFT percentiles.
N_QUANTILES = 32


class FluidAdmission(Protocol):
    """Sheds load in fluid mode: given the step's offered requests and MU, how many requests to admit."""

    def admit(self, now: float, requests: float, mu: float) -> float: ...


@dataclass(slots=True)
class Workload:
    """Per-step arrivals: counts, MU, prefill seconds (sums), plus the per-request prefill-time quantiles."""

    step_s: float
    counts: np.ndarray
    mu: np.ndarray
    prefill_s: np.ndarray
    prefill_sq: np.ndarray
    output_tokens: np.ndarray
    input_tokens: np.ndarray
    prefill_quantiles: np.ndarray
    output_quantiles: np.ndarray
    cache_hit_rate: float
    name: str
    arrival_cv2: float = 1.0


def _prefill_time(inp: np.ndarray, perf: PerfParams) -> np.ndarray:
    budget = perf.max_num_batched_tokens or (1 << 62)
    chunks = np.ceil(inp / budget)
    return inp * perf.prefill_s_per_token + chunks * perf.step_overhead_s


def _costs(profile: CostProfile, inp: np.ndarray, out: np.ndarray) -> np.ndarray:
    """MU of each (input, output) pair through the profile's own formula (never re-derived here)."""
    cost = profile.cost
    return np.fromiter(
        (cost(int(i), o) for i, o in zip(inp.tolist(), out.tolist(), strict=True)), float, len(inp)
    )


def _cv2(gaps: np.ndarray) -> float:
    """Squared coefficient of variation of inter-arrival gaps (1 for Poisson)."""
    if gaps.size < 2 or gaps.mean() <= 0:
        return 1.0
    return float(gaps.var() / gaps.mean() ** 2)


def workload_from_trace(trace: Trace, profile: CostProfile, perf: PerfParams, step_s: float) -> Workload:
    """Bin a recorded trace into steps (exact per-step sums; no prefix-cache credit)."""
    reqs = trace.requests
    t = np.array([r.arrival_s for r in reqs])
    inp = np.array([r.input_tokens for r in reqs], dtype=np.float64)
    out = np.array([r.output_tokens for r in reqs], dtype=np.float64)
    n_steps = math.floor(t[-1] / step_s) + 1 if t.size else 1
    idx = (t // step_s).astype(np.int64)
    mu = _costs(profile, inp, out)
    pf = _prefill_time(inp, perf)
    qs = (np.arange(N_QUANTILES) + 0.5) / N_QUANTILES
    return Workload(
        step_s,
        np.bincount(idx, minlength=n_steps).astype(np.float64),
        np.bincount(idx, weights=mu, minlength=n_steps),
        np.bincount(idx, weights=pf, minlength=n_steps),
        np.bincount(idx, weights=pf * pf, minlength=n_steps),
        np.bincount(idx, weights=out, minlength=n_steps),
        np.bincount(idx, weights=inp, minlength=n_steps),
        np.quantile(pf, qs) if pf.size else np.zeros(N_QUANTILES),
        np.quantile(out, qs) if out.size else np.zeros(N_QUANTILES),
        0.0,
        trace.name,
        _cv2(np.diff(t)),
    )


def workload_from_rates(
    table: RateTable,
    lengths: LengthSource,
    profile: CostProfile,
    perf: PerfParams,
    step_s: float,
    *,
    seed: int,
    rate_scale: float = 1.0,
    median_cv: float = 1.2,
) -> Workload:
    """Draw per-step arrivals from a rate table (see the module docstring for the process)."""
    rng = np.random.default_rng(seed)
    names = sorted(table.rates)
    rates = np.stack([table.rates[k] for k in names]) * rate_scale  # (tenants, windows)
    cv2 = np.array([tenant_cv(k, median_cv, seed=seed) ** 2 for k in names])[:, None]
    mean_w = rates.sum(axis=0)
    var_w = (rates * cv2).sum(axis=0)
    per_win = max(1, round(table.window_s / step_s))
    n_steps = per_win * len(mean_w)
    mean = np.repeat(mean_w * step_s, per_win)
    disp = np.repeat(np.where(mean_w > 0, var_w / np.maximum(mean_w, 1e-12), 1.0), per_win)
    # Gamma-mixed Poisson: Var = mean * disp when disp > 1.
    extra = np.maximum(disp - 1.0, 1e-9)
    lam = rng.gamma(shape=np.maximum(mean / extra, 1e-12), scale=extra) if n_steps else np.zeros(0)
    lam = np.where(disp > 1.0 + 1e-9, lam, mean)
    counts = rng.poisson(lam).astype(np.float64)
    sample_in, sample_out = lengths.sample(200_000, np.random.default_rng(seed + 1))
    si, so = sample_in.astype(np.float64), sample_out.astype(np.float64)
    mu_req = _costs(profile, si, so)
    pf = _prefill_time(si, perf)
    m, v = float(mu_req.mean()), float(mu_req.var())
    z = rng.standard_normal(n_steps)
    mu = np.maximum(0.0, counts * m + np.sqrt(counts * v) * z)
    qs = (np.arange(N_QUANTILES) + 0.5) / N_QUANTILES
    return Workload(
        step_s,
        counts,
        mu,
        counts * float(pf.mean()),
        counts * float((pf * pf).mean()),
        counts * float(so.mean()),
        counts * float(si.mean()),
        np.quantile(pf, qs),
        np.quantile(so, qs),
        0.0,
        table.name,
        float((var_w * table.window_s).sum() / max(1e-12, float((mean_w * table.window_s).sum()))),
    )


@dataclass(slots=True)
class FluidConfig:
    replicas: int = 4
    seed: int = 0
    step_s: float = 1.0
    cold_start_s: float = 180.0
    autoscale_interval_s: float = 10.0
    min_replicas: int = 0
    max_replicas: int = 1024
    slo_ttft_p95_s: float | None = None
    progress: Callable[[int, int], None] | None = None


class FluidSimulator:
    """The time-stepped model; ``run()`` returns the same summary keys as the discrete-event simulator."""

    def __init__(
        self,
        workload: Workload,
        profile: CostProfile,
        perf: PerfParams,
        config: FluidConfig,
        *,
        autoscaler: Autoscaler | None = None,
        admission: FluidAdmission | None = None,
        policy_name: str = "fluid-balanced",
    ) -> None:
        self.w = workload
        self.profile = profile
        self.perf = perf
        self.cfg = config
        self.autoscaler = autoscaler
        self.admission = admission
        self.policy_name = policy_name

    def run(self) -> dict[str, Any]:
        wall0 = time.perf_counter()
        w, cfg, perf = self.w, self.cfg, self.perf
        dt = w.step_s
        n_steps = len(w.counts)
        cap_rate = self.profile.capacity_mu_per_min / 60.0  # MU per replica-second
        counts, mu_arr, pf_arr, pf2_arr = (
            w.counts.tolist(),
            w.mu.tolist(),
            w.prefill_s.tolist(),
            w.prefill_sq.tolist(),
        )
        out_arr = w.output_tokens.tolist()
        base_wait = np.zeros(n_steps)
        admitted_counts = np.zeros(n_steps)
        replicas_series: list[tuple[float, int, int]] = []
        ready = cfg.replicas
        starting: deque[float] = deque()  # ready times of replicas still starting
        provisioned: list[float] = [0.0] * cfg.replicas  # start times of live replicas (for replica-seconds)
        replica_seconds = 0.0
        backlog = 0.0
        settled: deque[tuple[float, float]] = deque()
        settled_sum = 0.0
        # Requests in flight, as the gateway counts them: a step's arrivals join at their arrival and leave at
        # arrival + their end-to-end latency, when their real MU settles (as in discrete-event mode).
        # Entries: (completion time, real MU, requests, estimated MU).
        completing: list[tuple[float, float, float, float]] = []
        # Backlog stranded on replicas that were ready before a scale-up: routing sends new arrivals to the
        # fresh (empty) replicas, so only the old ones drain it, at their own rate.
        stuck = 0.0
        stuck_reps = 0
        inflight_req = 0.0
        inflight_mu = 0.0
        state: Any = None
        next_scale = 0.0
        rejected = 0.0
        served_total = 0.0
        out_p90 = float(np.quantile(w.output_quantiles, 0.9))
        in_arr = w.input_tokens.tolist()
        kv_tok = perf.decode_s_per_kv_token
        a_p = perf.prefill_s_per_token
        max_seqs = float(perf.max_num_seqs)
        kv_tokens = float(perf.kv_capacity_tokens)
        sm_n = sm_a = sm_pf = sm_pf2 = sm_out = sm_in = 0.0
        smooth = min(1.0, dt / 30.0)
        ca2 = w.arrival_cv2
        q_pref = 0.0  # prefill seconds per replica carried over from earlier steps
        chunk_s = (perf.max_num_batched_tokens or 8192) * perf.prefill_s_per_token
        iter_base = perf.step_overhead_s
        per_seq = perf.decode_s_per_seq
        progress = cfg.progress
        report_every = max(1, n_steps // 200)
        replicas_series.append((0.0, ready, ready))
        for i in range(n_steps):
            now = i * dt
            was_ready = ready
            while starting and starting[0] <= now:
                starting.popleft()
                ready += 1
                replicas_series.append((now, ready, ready + len(starting)))
            if ready > was_ready and was_ready > 0 and backlog > 1e-9:
                # The queue built up on the old replicas stays there (requests are not moved once
                # dispatched); least-loaded routing sends everything new to the replicas that just started.
                stuck += backlog
                stuck_reps = was_ready
                backlog = 0.0
                q_pref = 0.0
            while completing and completing[0][0] <= now:
                t_done, mu_done, n_done, est_done = heapq.heappop(completing)
                settled.append((t_done, mu_done))
                settled_sum += mu_done
                inflight_req -= n_done
                inflight_mu -= est_done
            if not completing:
                inflight_req = inflight_mu = 0.0  # no float drift
            if self.autoscaler is not None and now >= next_scale:
                next_scale = now + cfg.autoscale_interval_s
                while settled and settled[0][0] < now - 60.0:
                    settled_sum -= settled.popleft()[1]
                ctx = AutoscaleContext(
                    now_s=now,
                    current_replicas=ready + len(starting),
                    ready_replicas=ready,
                    starting_replicas=len(starting),
                    capacity_mu_per_min=self.profile.capacity_mu_per_min,
                    settled_mu_per_min=max(0.0, settled_sum),
                    inflight_mu=max(0.0, inflight_mu),
                    inflight_requests=max(0.0, inflight_req),
                    policy_state=state,
                )
                desired, state = self.autoscaler.decide(ctx)
                desired = max(cfg.min_replicas, min(cfg.max_replicas, int(desired)))
                live = ready + len(starting)
                if desired > live:
                    for _ in range(desired - live):
                        starting.append(now + cfg.cold_start_s)
                        provisioned.append(now)
                    replicas_series.append((now, ready, desired))
                elif desired < live:
                    drop = live - desired
                    while drop and starting:  # cancel the newest starting replicas first
                        starting.pop()
                        replica_seconds += now - provisioned.pop()
                        drop -= 1
                    drop = min(drop, ready)
                    ready -= drop
                    stuck_reps = min(stuck_reps, ready)
                    for _ in range(drop):
                        replica_seconds += now - provisioned.pop(0)
                    replicas_series.append((now, ready, ready + len(starting)))
            n = counts[i]
            a = mu_arr[i]
            if self.admission is not None and n > 0:
                keep = min(n, max(0.0, self.admission.admit(now, n, a)))
                rejected += n - keep
                frac = keep / n
                a *= frac
                n = keep
            admitted_counts[i] = n
            # Smoothed arrival mix (fleet totals per second, ~30 s memory): the engine physics below use it.
            sm_n += (n / dt - sm_n) * smooth
            sm_a += (a / dt - sm_a) * smooth
            sm_pf += (pf_arr[i] / dt - sm_pf) * smooth
            sm_pf2 += (pf2_arr[i] / dt - sm_pf2) * smooth
            sm_out += (out_arr[i] / dt - sm_out) * smooth
            sm_in += (in_arr[i] / dt - sm_in) * smooth
            if sm_n > 1e-12:
                e_pf2 = sm_pf2 / sm_n
                e_out, e_in, e_mu = sm_out / sm_n, sm_in / sm_n, sm_a / sm_n
            else:
                e_pf2 = e_out = e_in = e_mu = 0.0
            # Decode cost per sequence and iteration, including its KV reads at the mean context length.
            ps_eff = per_seq + kv_tok * (e_in + e_out / 2.0)
            # Saturated throughput of one replica (req/s): prefill work + decode work + iteration overheads
            # shared by at most max_num_seqs sequences (also capped by KV capacity).
            e_pf_tok = e_in * a_p  # prefill compute only: iteration overheads are shared with decodes
            seqs = min(max_seqs, kv_tokens / max(1.0, e_in + e_out / 2.0))
            per_req_s = e_pf_tok + e_out * ps_eff + e_out * iter_base / seqs
            lam_sat = 1.0 / per_req_s if per_req_s > 0 else math.inf
            rep_rate = lam_sat * e_mu if e_mu > 0 else cap_rate  # MU/s one replica serves
            if stuck > 0 and (stuck_reps >= ready or backlog * stuck_reps >= stuck * (ready - stuck_reps)):
                # No fresh replica left, or the fresh replicas' queues have caught up with the old ones:
                # least-loaded routing spreads new arrivals over all of them again (one common queue).
                backlog += stuck
                stuck, stuck_reps = 0.0, 0
            stuck_served = 0.0
            if stuck > 0:
                stuck_served = min(stuck, stuck_reps * rep_rate * dt)
                stuck -= stuck_served
                if stuck <= 1e-9:
                    stuck, stuck_reps = 0.0, 0
            fresh = ready - stuck_reps if stuck > 0 else ready  # replicas new arrivals are routed to
            fleet_rate = fresh * rep_rate  # MU/s the replicas taking new arrivals serve
            backlog += a
            served = min(backlog, fleet_rate * dt)
            backlog -= served
            served_total += served + stuck_served
            if fresh > 0 and fleet_rate > 0:
                lam = min(sm_n / fresh, lam_sat)  # requests per second per replica actually served
                rho_p = min(0.95, lam * e_pf_tok)
                x = 1.0 - rho_p - lam * e_out * ps_eff
                decode_batch = min(seqs, lam * e_out * iter_base / x) if x > 1e-6 else seqs
                step_t = iter_base + ps_eff * decode_batch
                # Pollaczek-Khinchine mean wait behind other prompts' prefill, half an iteration of
                # residual, the decode work riding along the prompt's own iteration, and the backlog that
                # the free batch slots cannot absorb (a burst first grows the batch: it waits only once
                # every replica runs max_num_seqs sequences).
                # Kingman's correction for non-Poisson arrivals: (ca^2 + cs^2) / (1 + cs^2).
                e_pf = e_pf_tok + iter_base
                cs2 = max(0.0, e_pf2 / (e_pf * e_pf) - 1.0) if e_pf > 0 else 1.0
                pk = lam * e_pf2 / (2.0 * (1.0 - rho_p)) * (ca2 + cs2) / (1.0 + cs2)
                slack = (seqs - decode_batch) * fresh * e_mu
                queued = backlog - slack if backlog > slack else 0.0
                # Prompt work beyond what a replica can prefill in this step (bursts) waits for the next.
                # (During a burst every iteration carries a full prefill chunk plus the running decodes.)
                prefill_share = chunk_s / (chunk_s + step_t)
                wait = q_pref + queued / fleet_rate + pk + 0.5 * step_t + ps_eff * decode_batch
                q_pref = max(0.0, q_pref + in_arr[i] * a_p / fresh - dt * prefill_share)
                # Decoders share iterations with prompt chunks: a token takes step_t / (1 - rho_p).
                svc = e_pf_tok + e_out * step_t / (1.0 - rho_p)
                e2e = wait + svc
            else:
                wait = math.inf if n > 0 else 0.0
                e2e = 0.0
                svc = 0.0
            base_wait[i] = wait
            if n > 0 and math.isfinite(wait) and math.isfinite(e2e):
                # The gateway counts in-flight MU at its *estimate* (output budgeted at the p90).
                est = a + n * self.profile.beta * out_p90 - self.profile.beta * out_arr[i]
                inflight_req += n
                inflight_mu += est
                heapq.heappush(completing, (now + e2e, a, n, est))
            if progress is not None and i % report_every == 0:
                progress(i, n_steps)
        end = n_steps * dt
        for p in provisioned:
            replica_seconds += end - p
        if progress is not None:
            progress(n_steps, n_steps)
        return self._summary(
            base_wait,
            admitted_counts,
            replica_seconds,
            rejected,
            served_total,
            replicas_series,
            time.perf_counter() - wall0,
        )

    def _summary(
        self,
        base_wait: np.ndarray,
        counts: np.ndarray,
        replica_seconds: float,
        rejected: float,
        served_mu: float,
        series: list[tuple[float, int, int]],
        wall_s: float,
    ) -> dict[str, Any]:
        w, cfg = self.w, self.cfg
        q = w.prefill_quantiles
        k = len(q)
        finite = np.isfinite(base_wait)
        lost = float(counts[~finite].sum())
        bw = np.where(finite, base_wait, 0.0)
        cw = np.where(finite, counts, 0.0)
        # Global TTFT distribution: a histogram of (step wait + prefill quantile) weighted by count / k.
        edges = np.concatenate([[0.0], np.logspace(-3, 5, 4001)])
        hist = np.zeros(len(edges) - 1)
        total_w = float(cw.sum())
        mean_ttft = float((bw * cw).sum() / total_w + q.mean()) if total_w > 0 else math.nan
        chunk = 200_000
        for s in range(0, len(bw), chunk):
            vals = (bw[s : s + chunk, None] + q[None, :]).ravel()
            wts = np.repeat(cw[s : s + chunk] / k, k)
            hist += np.histogram(vals, bins=edges, weights=wts)[0]
        cdf = np.cumsum(hist) / max(total_w, 1e-12)

        def pct(p: float) -> float:
            if total_w <= 0:
                return math.nan
            j = int(np.searchsorted(cdf, p / 100.0))
            return float(edges[min(j + 1, len(edges) - 1)])

        # Per-minute p95 for slo_attainment.
        per_min = max(1, round(60.0 / w.step_s))
        n_min = len(bw) // per_min
        minute_p95 = np.full(max(n_min, 1), math.nan)
        if n_min:
            b = bw[: n_min * per_min].reshape(n_min, per_min)
            c = cw[: n_min * per_min].reshape(n_min, per_min)
            mvals = (b[:, :, None] + q[None, None, :]).reshape(n_min, -1)
            mwts = np.repeat(c / k, k, axis=1).reshape(n_min, -1)
            order = np.argsort(mvals, axis=1)
            sv = np.take_along_axis(mvals, order, axis=1)
            sw = np.cumsum(np.take_along_axis(mwts, order, axis=1), axis=1)
            tot = sw[:, -1]
            idx = np.argmax(sw >= 0.95 * tot[:, None], axis=1)
            minute_p95 = np.where(tot > 0, sv[np.arange(n_min), idx], math.nan)
        requests = float(w.counts.sum())
        completed = float(counts.sum()) - lost
        horizon = len(bw) * w.step_s
        out_tokens = float(w.output_tokens.sum()) * (completed / requests if requests else 0.0)
        summary: dict[str, Any] = {
            "mode": "fluid",
            "policy": self.policy_name,
            "trace": w.name,
            "seed": cfg.seed,
            "replicas": cfg.replicas,
            "requests": round(requests),
            "completed": round(completed),
            "rejected": round(rejected + lost),
            "ttft_p50_s": pct(50),
            "ttft_p95_s": pct(95),
            "ttft_p99_s": pct(99),
            "ttft_mean_s": mean_ttft,
            "e2e_p50_s": None,
            "e2e_p95_s": None,
            "e2e_mean_s": None,
            "output_tokens_per_s": out_tokens / horizon if horizon > 0 else math.nan,
            "cache_hit_rate": w.cache_hit_rate,
            "replica_seconds": replica_seconds,
            "replica_hours": replica_seconds / 3600.0,
            "max_over_mean_load": None,
            "max_over_mean_load_p50": None,
            "slo_ttft_p95_s": cfg.slo_ttft_p95_s,
            "slo_attainment": M.slo_attainment(minute_p95, cfg.slo_ttft_p95_s),
            "sim_duration_s": horizon,
            "settled_mu": served_mu,
            "profile": self.profile.name,
            "autoscaler": self.autoscaler.name if self.autoscaler else "none",
            "peak_replicas": max((tot for _, _, tot in series), default=cfg.replicas),
            "steps": len(bw),
            "step_s": w.step_s,
            "wall_s": wall_s,
            "requests_per_wall_s": requests / wall_s if wall_s > 0 else math.nan,
        }
        out = M.ordered(summary)
        out["_replicas_over_time"] = [list(x) for x in _thin(series)]
        return out


def _thin(series: list[tuple[float, int, int]], max_points: int = 5000) -> list[tuple[float, int, int]]:
    if len(series) <= max_points:
        return series
    step = len(series) / max_points
    return [series[int(i * step)] for i in range(max_points)] + [series[-1]]
