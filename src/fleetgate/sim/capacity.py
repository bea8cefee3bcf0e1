"""Fluid capacity simulation: several deployments sharing one finite GPU pool (issue 18).

``fleetgate simulate --scenario FILE.yaml --capacity fleetgate|static|independent`` advances every deployment
of a :class:`~fleetgate.sim.capacity_scenario.Scenario` in steps of ``step_s`` and decides who holds the
pool's GPUs in one of three ways:

* ``fleetgate``: every ``autoscale_interval_s`` each deployment's autoscaler (the same policy object the
  gateway's loop builds, ``core/autoscale``) says how many replicas it wants; the pool allocator
  (``core/capacity/allocator.decide``, the same pure function the gateway drives) turns those demands, the
  floors that back the reservations, the replicas held and draining into replicas per deployment: floors
  first, weighted max-min fair shares above them, hysteresis ``reclaim_after_s``, drain before a GPU moves;
  the GPUs still idle lent as warm headroom (``lend_idle_gpus``, up to ``max_replicas``), the first taken
  back. Each autoscaler is shown only its demand-backed replicas as current (a lent replica is not one it
  asked for: counting it would hold the lent replicas as demand through its scale-down delay).
* ``independent``: each deployment's autoscaler, its scale-ups granted first come, first served while GPUs
  remain (no floors, no reclaim: a GPU comes back only when its holder scales down). The autoscalers tick
  with staggered phases, so "first" is the earliest to ask.
* ``static``: the pool split among the deployments in proportion to their mean offered MU, fixed.

Per deployment and step (the fluid model of ``sim.fluid``, reduced to a constant length mix and two classes):

* Arrivals per step are drawn per group (each reserved tenant alone, the other tenants together) by
  ``sim.fluid.workload_from_rates``. A reserved tenant's MU up to its reservation (a meter of
  ``reservation / 60`` MU/s with no burst, as the gateway's default) is the **reserved** tier; the rest of
  its MU and every other tenant's is **best-effort**.
* Service follows the engine physics of the profile (``PerfParams``): one ready replica serves
  ``rep_rate`` MU/s, its saturated throughput on the length mix. Reserved work is served first (priority at
  the engine); best-effort takes the capacity left.
* **Admission** (the same in every mode, so only capacity management differs): reserved work is shed only
  when it would queue longer than ``reserved_queue_timeout_s``; best-effort is admitted while the queue it
  joins drains within ``best_effort_wait_budget_s`` (default: half the SLO), the rest is shed and counted
  (and counted as offered demand in the autoscaler's window, as the gateway counts a capacity refusal).
* **TTFT** = the queue ahead of the request (reserved: only reserved work; best-effort: both) over the fleet's
  service rate beyond the free batch slots + the prefill queueing of a non-preemptive two-class priority
  queue (M/G/1 with Kingman's correction for bursty arrivals) + half an iteration + its own prefill time
  (one of a fixed set of prefill-time quantiles).
* New replicas serve after ``cold_start_s``; a drained replica stops taking work at once and holds its GPUs
  for ``drain_s`` more. GPU-hours count from the start of provisioning to the release of the GPUs.

What the fluid model leaves out (see docs/simulator.md for how fluid mode compares with the per-request
simulator): routing imbalance, backlog stranded on old replicas after a scale-up, per-request settlement
delay (in-flight MU are Little's law of this step's service).
"""

from __future__ import annotations

import math
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fleetgate.core.autoscale import (
    AutoscaleContext,
    AutoscalePolicy,
    Railed,
    Rails,
    autoscaler_params,
    build_autoscaler,
    replicas_for,
)
from fleetgate.core.capacity import (
    AllocationContext,
    AllocatorParams,
    AllocatorState,
    DeploymentDemand,
    decide,
    floor_replicas,
)
from fleetgate.core.units import CostProfile
from fleetgate.profiles import load_profile
from fleetgate.sim.capacity_scenario import (
    CAPACITY_MODES,
    DeploymentSpec,
    Scenario,
    deployment_tables,
)
from fleetgate.sim.engine import perf_params_from_profile
from fleetgate.sim.fluid import N_QUANTILES, _costs, _prefill_time, workload_from_rates
from fleetgate.sim.traces import RateTable, length_source
from fleetgate.simengine.perfmodel import PerfParams


@dataclass(frozen=True, slots=True)
class Physics:
    """One replica on the deployment's (constant) length mix: the same formulas as ``sim.fluid``."""

    e_mu: float  # MU per request
    e_out: float  # output tokens per request
    e_pf_tok: float  # prefill compute seconds per request
    e_pf2: float  # E[prefill time^2]
    ps_eff: float  # decode seconds per sequence and iteration (with its KV reads)
    seqs: float  # sequences one replica batches
    iter_base: float  # fixed seconds per iteration
    lam_sat: float  # requests/s one replica serves saturated
    rep_rate: float  # MU/s one replica serves saturated
    prefill_quantiles: np.ndarray

    @classmethod
    def of(cls, profile: CostProfile, perf: PerfParams, inp: np.ndarray, out: np.ndarray) -> Physics:
        si, so = inp.astype(np.float64), out.astype(np.float64)
        mu = _costs(profile, si, so)
        pf = _prefill_time(si, perf)
        e_in, e_out, e_mu = float(si.mean()), float(so.mean()), float(mu.mean())
        ps_eff = perf.decode_s_per_seq + perf.decode_s_per_kv_token * (e_in + e_out / 2.0)
        e_pf_tok = e_in * perf.prefill_s_per_token
        seqs = min(float(perf.max_num_seqs), perf.kv_capacity_tokens / max(1.0, e_in + e_out / 2.0))
        per_req = e_pf_tok + e_out * ps_eff + e_out * perf.step_overhead_s / seqs
        lam_sat = 1.0 / per_req
        qs = (np.arange(N_QUANTILES) + 0.5) / N_QUANTILES
        return cls(
            e_mu, e_out, e_pf_tok, float((pf * pf).mean()), ps_eff, seqs, perf.step_overhead_s,
            lam_sat, lam_sat * e_mu, np.quantile(pf, qs),
        )  # fmt: skip


@dataclass(slots=True)
class Group:
    """Arrivals of one reserved tenant (``reserved_mu_s`` > 0) or of a deployment's other tenants together."""

    tenants: list[str]
    reserved_mu_s: float
    counts: np.ndarray
    mu: np.ndarray
    requests_reserved: float = 0.0
    requests_best_effort: float = 0.0
    shed: float = 0.0
    shed_by_window: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass(slots=True)
class Deployment:
    """One deployment's fixed inputs and its running state."""

    spec: DeploymentSpec
    profile: CostProfile
    phys: Physics
    table: RateTable
    groups: list[Group]
    autoscaler: Any
    floor: int
    warm: int
    arrival_cv2: float
    ready: int = 0
    starting: deque[float] = field(default_factory=deque)
    draining: deque[float] = field(default_factory=deque)
    backlog_r: float = 0.0
    backlog_b: float = 0.0
    sm_n: float = 0.0
    sm_r: float = 0.0
    settled: deque[tuple[float, float]] = field(default_factory=deque)
    settled_sum: float = 0.0
    inflight_mu: float = 0.0
    policy_state: Any = None
    desired: int = 0
    replica_seconds: float = 0.0
    peak_replicas: int = 0
    min_ready: int = 1 << 30
    served_mu: float = 0.0
    started: int = 0
    #: The demand-backed replicas of the last allocation (``None``: nothing lent in this mode).
    backed: int | None = None
    lent_seconds: float = 0.0

    @property
    def held(self) -> int:
        return self.ready + len(self.starting)

    @property
    def lent(self) -> int:
        """Replicas held above the demand-backed allocation: lent headroom."""
        return 0 if self.backed is None else max(0, self.held - self.backed)

    @property
    def gpus_in_use(self) -> int:
        return (self.held + len(self.draining)) * self.spec.gpus_per_replica

    def start(self, n: int, ready_at: float) -> None:
        self.starting.extend([ready_at] * n)
        self.started += n

    def fresh(self) -> Deployment:
        """The same inputs (workload draws shared, not copied) with the running state reset: one draw, several
        capacity modes."""
        groups = [Group(g.tenants, g.reserved_mu_s, g.counts, g.mu) for g in self.groups]
        return Deployment(
            self.spec, self.profile, self.phys, self.table, groups, self.autoscaler, self.floor, self.warm,
            self.arrival_cv2,
        )  # fmt: skip

    def shrink(self, n: int, now: float, drain_s: float) -> None:
        """Cancel the newest starting replicas first (their GPUs free at once), then drain ready ones."""
        while n > 0 and self.starting:
            self.starting.pop()
            n -= 1
        n = min(n, self.ready)
        self.ready -= n
        if drain_s > 0:
            self.draining.extend([now + drain_s] * n)


def target_utilisation(scenario: Scenario) -> float:
    """The autoscaler target the floors are sized at (as ``config_checks.reservation_target_utilisation``)."""
    params = autoscaler_params(scenario.autoscaler, scenario.autoscaler_params)
    return (params if isinstance(params, AutoscalePolicy) else AutoscalePolicy()).target_utilisation


def _seed(base: int, *parts: str) -> int:
    return (base * 1_000_003 + zlib.crc32("/".join(parts).encode())) % (2**31)


def build_deployments(scenario: Scenario, scenario_dir: Path | None) -> list[Deployment]:
    """Rate tables, workload draws, physics, autoscalers and floors of every deployment."""
    tables = deployment_tables(scenario, scenario_dir)
    lengths = length_source(scenario.lengths)
    target = target_utilisation(scenario)
    inp, out = lengths.sample(200_000, np.random.default_rng(scenario.seed + 1))
    deps: list[Deployment] = []
    for spec in scenario.deployments:
        profile = load_profile(spec.profile)
        perf = perf_params_from_profile(profile)
        phys = Physics.of(profile, perf, inp, out)
        table = tables[spec.name]
        reserved = [t for t in sorted(table.rates) if spec.reservations.get(t, 0.0) > 0]
        rest = [t for t in sorted(table.rates) if t not in reserved]
        groups: list[Group] = []
        cv2_num = cv2_den = 0.0
        for cols in [[t] for t in reserved] + ([rest] if rest else []):
            sub = RateTable(table.t_s, table.window_s, {c: table.rates[c] for c in cols}, table.name)
            work = workload_from_rates(
                sub, lengths, profile, perf, scenario.step_s, seed=_seed(scenario.seed, spec.name, *cols[:1])
            )
            r_mu_s = spec.reservations.get(cols[0], 0.0) / 60.0 if cols[0] in reserved else 0.0
            groups.append(Group(cols, r_mu_s, work.counts, work.mu))
            weight = float(work.counts.sum())
            cv2_num += work.arrival_cv2 * weight
            cv2_den += weight
        sold = sum(spec.reservations.values())
        floor = floor_replicas(sold, profile.capacity_mu_per_min, target)
        first = float(table.total()[0]) * 60.0 * phys.e_mu if len(table.t_s) else 0.0
        warm = min(
            spec.max_replicas,
            max(spec.min_replicas, replicas_for(first, profile.capacity_mu_per_min, target)),
        )
        scaler = Railed(
            build_autoscaler(scenario.autoscaler, dict(scenario.autoscaler_params)),
            Rails(spec.min_replicas, spec.max_replicas),
        )
        deps.append(
            Deployment(
                spec, profile, phys, table, groups, scaler, floor, warm, cv2_num / cv2_den if cv2_den else 1.0
            )
        )
    return deps


def static_split(pool_gpus: int, deps: list[Deployment]) -> dict[str, int]:
    """Replicas per deployment in proportion to its mean offered MU (largest remainder for what is left)."""
    mean = {
        d.spec.name: float(d.table.total().mean()) * d.phys.e_mu if len(d.table.t_s) else 0.0 for d in deps
    }
    total = sum(mean.values()) or 1.0
    exact = {d.spec.name: pool_gpus * mean[d.spec.name] / total / d.spec.gpus_per_replica for d in deps}
    out = {n: math.floor(v) for n, v in exact.items()}
    free = pool_gpus - sum(out[d.spec.name] * d.spec.gpus_per_replica for d in deps)
    for d in sorted(deps, key=lambda d: (-(exact[d.spec.name] - out[d.spec.name]), d.spec.name)):
        if d.spec.gpus_per_replica <= free:
            out[d.spec.name] += 1
            free -= d.spec.gpus_per_replica
    return out


@dataclass(slots=True)
class Recorder:
    """Per-step TTFT inputs per deployment and tier, and the allocation once a minute (for plots)."""

    n_steps: int
    n_deps: int
    wait_r: np.ndarray = field(init=False)
    wait_b: np.ndarray = field(init=False)
    cnt_r: np.ndarray = field(init=False)
    cnt_b: np.ndarray = field(init=False)
    allocation: list[list[float]] = field(default_factory=list)
    max_gpus_in_use: int = 0

    def __post_init__(self) -> None:
        shape = (self.n_steps, self.n_deps)
        self.wait_r = np.zeros(shape, np.float32)
        self.wait_b = np.zeros(shape, np.float32)
        self.cnt_r = np.zeros(shape, np.float32)
        self.cnt_b = np.zeros(shape, np.float32)


class CapacitySimulator:
    """Runs one scenario under one capacity mode; :meth:`run` returns the summary (``capacity_report``)."""

    def __init__(
        self,
        scenario: Scenario,
        mode: str,
        *,
        scenario_dir: Path | None = None,
        deployments: list[Deployment] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        if mode not in CAPACITY_MODES:
            raise ValueError(f"unknown capacity mode {mode!r}; one of {', '.join(CAPACITY_MODES)}")
        self.sc = scenario
        self.mode = mode
        self.deps = deployments if deployments is not None else build_deployments(scenario, scenario_dir)
        self.progress = progress
        self.alloc_state: AllocatorState | None = None
        self.alloc_params = AllocatorParams(
            reclaim_after_s=scenario.reclaim_after_s, lend_idle_gpus=scenario.lend_idle_gpus
        )
        self.reclaims = 0

    # ------------------------------------------------------------------------------------------ control

    def _autoscale(self, d: Deployment, now: float) -> int:
        while d.settled and d.settled[0][0] <= now - 60.0:
            d.settled_sum -= d.settled.popleft()[1]
        current = d.held - d.lent
        ready = min(d.ready, current)
        ctx = AutoscaleContext(
            now_s=now,
            current_replicas=current,
            ready_replicas=ready,
            starting_replicas=current - ready,
            capacity_mu_per_min=d.profile.capacity_mu_per_min,
            settled_mu_per_min=max(0.0, d.settled_sum),
            inflight_mu=max(0.0, d.inflight_mu),
            inflight_requests=max(0.0, d.inflight_mu / d.phys.e_mu),
            policy_state=d.policy_state,
        )
        desired, d.policy_state = d.autoscaler.decide(ctx)
        d.desired = int(desired)
        return d.desired

    def _allocate(self, now: float, demands: dict[str, int], *, warm: bool = False) -> None:
        """One allocator decision, applied: drains, then starts (at once when ``warm``)."""
        ctx = AllocationContext(
            now_s=now,
            pool_gpus=self.sc.pool.gpus,
            deployments=[
                DeploymentDemand(
                    d.spec.name,
                    demands[d.spec.name],
                    d.floor,
                    d.spec.gpus_per_replica,
                    d.spec.weight,
                    d.held,
                    len(d.draining),
                    d.spec.max_replicas,
                )
                for d in self.deps
            ],
            params=self.alloc_params,
            state=self.alloc_state,
        )
        alloc, self.alloc_state = decide(ctx)
        self.reclaims += int(alloc.reclaimed)
        for d in self.deps:
            d.backed = alloc.backed(d.spec.name)
            d.shrink(alloc.drain[d.spec.name], now, self.sc.drain_s)
        for d in self.deps:
            n = alloc.start[d.spec.name]
            if warm:
                d.ready += n
            else:
                d.start(n, now + self.sc.cold_start_s)

    def _free_gpus(self) -> int:
        return self.sc.pool.gpus - sum(d.gpus_in_use for d in self.deps)

    def _grant(self, d: Deployment, desired: int, now: float, *, warm: bool = False) -> None:
        """``independent``: scale-ups first come, first served while GPUs remain; scale-downs release."""
        if desired > d.held:
            n = min(desired - d.held, max(0, self._free_gpus()) // d.spec.gpus_per_replica)
            if warm:
                d.ready += n
            else:
                d.start(n, now + self.sc.cold_start_s)
        elif desired < d.held:
            d.shrink(d.held - desired, now, self.sc.drain_s)

    def _warm_start(self) -> None:
        if self.mode == "static":
            for d in self.deps:
                d.ready = static_split(self.sc.pool.gpus, self.deps)[d.spec.name]
        elif self.mode == "fleetgate":
            self._allocate(0.0, {d.spec.name: d.warm for d in self.deps}, warm=True)
        else:
            for d in self.deps:
                self._grant(d, d.warm, 0.0, warm=True)

    # --------------------------------------------------------------------------------------------- run

    def run(self) -> dict[str, Any]:
        from fleetgate.sim.capacity_report import summarise

        wall0 = time.perf_counter()
        sc, deps = self.sc, self.deps
        dt = sc.step_s
        n_steps = min((len(g.counts) for d in deps for g in d.groups), default=0)
        rec = Recorder(n_steps, len(deps))
        self._warm_start()
        interval = sc.autoscale_interval_s
        phase = [0.0 if self.mode == "fleetgate" else j * interval / len(deps) for j in range(len(deps))]
        next_tick = list(phase)
        per_min = max(1, round(60.0 / dt))
        per_win = max(1, round(deps[0].table.window_s / dt)) if deps else 1
        for d in deps:
            for g in d.groups:
                g.shed_by_window = np.zeros(max(1, math.ceil(n_steps / per_win)))
        report_every = max(1, n_steps // 200)
        for i in range(n_steps):
            now = i * dt
            for d in deps:
                while d.starting and d.starting[0] <= now:
                    d.starting.popleft()
                    d.ready += 1
                while d.draining and d.draining[0] <= now:
                    d.draining.popleft()
            if self.mode == "fleetgate":
                if now + 1e-9 >= next_tick[0]:
                    next_tick[0] += interval
                    self._allocate(now, {d.spec.name: self._autoscale(d, now) for d in deps})
            elif self.mode == "independent":
                for j, d in enumerate(deps):
                    if now + 1e-9 >= next_tick[j]:
                        next_tick[j] += interval
                        self._grant(d, self._autoscale(d, now), now)
            in_use = 0
            for j, d in enumerate(deps):
                self._step(d, j, i, now, dt, rec, i // per_win)
                in_use += d.gpus_in_use
            rec.max_gpus_in_use = max(rec.max_gpus_in_use, in_use)
            if i % per_min == 0:
                row: list[float] = [now]
                for d in deps:
                    row += [d.ready, len(d.starting), len(d.draining), d.desired, d.floor, d.lent]
                rec.allocation.append(row)
            if self.progress is not None and i % report_every == 0:
                self.progress(i, n_steps)
        if self.progress is not None:
            self.progress(n_steps, n_steps)
        return summarise(self, rec, time.perf_counter() - wall0)

    def _step(self, d: Deployment, j: int, i: int, now: float, dt: float, rec: Recorder, win: int) -> None:
        """Arrivals, admission, service and the TTFT inputs of one deployment in one step."""
        ph = d.phys
        held_now = d.held + len(d.draining)
        d.replica_seconds += held_now * dt
        d.lent_seconds += d.lent * dt
        d.peak_replicas = max(d.peak_replicas, d.held)
        d.min_ready = min(d.min_ready, d.ready)
        # Arrivals, split into tiers by the reservation meters.
        ar = nr = ab = nb = 0.0
        parts: list[tuple[Group, float, float]] = []
        for g in d.groups:
            n, a = float(g.counts[i]), float(g.mu[i])
            if n <= 0:
                continue
            if g.reserved_mu_s > 0 and a > 0:
                r = min(a, g.reserved_mu_s * dt)
                fr = r / a
                ar += r
                nr += n * fr
                ab += a - r
                nb += n * (1.0 - fr)
                parts.append((g, n * fr, n * (1.0 - fr)))
            else:
                ab += a
                nb += n
                parts.append((g, 0.0, n))
        ready = d.ready
        fleet_rate = ready * ph.rep_rate
        cap = fleet_rate * dt
        # Engine state from the smoothed admitted rates (the decode batch frees slots for bursts).
        lam = min(d.sm_n / ready, ph.lam_sat) if ready else 0.0
        rho_p = min(0.95, lam * ph.e_pf_tok)
        x = 1.0 - rho_p - lam * ph.e_out * ph.ps_eff
        batch = min(ph.seqs, lam * ph.e_out * ph.iter_base / x) if x > 1e-6 else ph.seqs
        slack = (ph.seqs - batch) * ready * ph.e_mu
        # Admission: reserved unless it would outwait the queue timeout; best-effort within the budget.
        if ready:
            room_r = self.sc.reserved_queue_timeout_s * fleet_rate + slack + cap - d.backlog_r
            adm_r = min(ar, max(0.0, room_r))
            room_b = self.sc.wait_budget_s * fleet_rate + slack + cap - d.backlog_r - adm_r - d.backlog_b
            adm_b = min(ab, max(0.0, room_b))
        else:
            adm_r = adm_b = 0.0
        fr_keep = adm_r / ar if ar > 0 else 1.0
        fb_keep = adm_b / ab if ab > 0 else 1.0
        for g, n_r, n_b in parts:
            g.requests_reserved += n_r
            g.requests_best_effort += n_b
            lost = n_r * (1.0 - fr_keep) + n_b * (1.0 - fb_keep)
            g.shed += lost
            g.shed_by_window[min(win, len(g.shed_by_window) - 1)] += lost
        cr, cb = nr * fr_keep, nb * fb_keep
        # Service: reserved first, best-effort in what is left.
        d.backlog_r += adm_r
        sr = min(d.backlog_r, cap)
        d.backlog_r -= sr
        d.backlog_b += adm_b
        sb = min(d.backlog_b, cap - sr)
        d.backlog_b -= sb
        served = sr + sb
        d.served_mu += served
        # The autoscaler's demand is what was offered: served MU plus the MU shed for lack of capacity (as
        # the gateway's DemandMeter counts a capacity refusal); without the shed part a deployment that
        # sheds reads as needing exactly what it holds.
        offered = served + (ar - adm_r) + (ab - adm_b)
        d.settled.append((now, offered))
        d.settled_sum += offered
        smooth = min(1.0, dt / 30.0)
        d.sm_n += ((cr + cb) / dt - d.sm_n) * smooth
        d.sm_r += (cr / dt - d.sm_r) * smooth
        if ready:
            lam_r = min(d.sm_r / ready, ph.lam_sat)
            rho_r = min(0.95, lam_r * ph.e_pf_tok)
            e_pf = ph.e_pf_tok + ph.iter_base
            cs2 = max(0.0, ph.e_pf2 / (e_pf * e_pf) - 1.0)
            r0 = lam * ph.e_pf2 / 2.0 * (d.arrival_cv2 + cs2) / (1.0 + cs2)
            step_t = ph.iter_base + ph.ps_eff * batch
            ride = 0.5 * step_t + ph.ps_eff * batch
            q_r = d.backlog_r - slack if d.backlog_r > slack else 0.0
            q_b = d.backlog_r + d.backlog_b - slack if d.backlog_r + d.backlog_b > slack else 0.0
            rec.wait_r[i, j] = q_r / fleet_rate + r0 / (1.0 - rho_r) + ride
            rec.wait_b[i, j] = q_b / fleet_rate + r0 / ((1.0 - rho_r) * (1.0 - rho_p)) + ride
            svc = ph.e_pf_tok + ph.e_out * step_t / (1.0 - rho_p)
            d.inflight_mu = d.backlog_r + d.backlog_b + served / dt * svc
        else:
            d.inflight_mu = d.backlog_r + d.backlog_b
        rec.cnt_r[i, j] = cr
        rec.cnt_b[i, j] = cb


def run_scenario(
    scenario: Scenario,
    mode: str,
    *,
    scenario_dir: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Build and run one scenario under one capacity mode; the summary (with ``_``-prefixed plot data)."""
    return CapacitySimulator(scenario, mode, scenario_dir=scenario_dir, progress=progress).run()
