"""Assemble and run one simulation from plain options (used by the CLI, the benchmarks and the tests)."""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetgate.core.units import CostProfile
from fleetgate.profiles import load_profile
from fleetgate.sim.traces import Trace, load_rate_table, load_trace

#: ``--mode auto`` runs the discrete-event simulator up to this many requests, the fluid model beyond.
AUTO_DES_MAX_REQUESTS = 2_000_000


@dataclass(slots=True)
class SimOptions:
    """Everything ``fleetgate simulate`` accepts."""

    trace: str
    fmt: str = "auto"
    policy: str = "fleetgate"
    policy_params: dict[str, Any] = field(default_factory=dict)
    replicas: int = 16
    profile: str | None = "llama2-70b-h100-tp4"
    seed: int = 0
    rate_scale: float = 1.0
    time_scale: float = 1.0
    tenant: str | None = None
    lengths: str | None = None
    start_s: float = 0.0
    duration_s: float | None = None
    max_requests: int | None = None
    mode: str = "auto"
    autoscale: str | None = None
    autoscale_params: dict[str, Any] = field(default_factory=dict)
    cold_start_s: float = 180.0
    slo_ttft_p95_s: float | None = None
    min_replicas: int = 0
    max_replicas: int = 1024
    scrape_interval_s: float = 1.0
    engine_params: dict[str, Any] = field(default_factory=dict)
    step_s: float = 1.0


def estimated_requests(opts: SimOptions) -> float:
    """Roughly how many requests the run would simulate (to choose the mode without expanding the trace)."""
    path = Path(opts.trace)
    if opts.fmt == "servegen" or (opts.fmt == "auto" and path.suffix == ".csv" and _is_rate_table(path)):
        table = load_rate_table(path).select(opts.tenant).slice(opts.start_s, opts.duration_s)
        total = float(table.total().sum() * table.window_s * opts.rate_scale)
        return min(total, float(opts.max_requests)) if opts.max_requests else total
    return float(opts.max_requests or 0) or 1.0


def _is_rate_table(path: Path) -> bool:
    from fleetgate.sim.traces import detect_format

    try:
        return path.exists() and detect_format(path) == "servegen"
    except ValueError:
        return False


def choose_mode(opts: SimOptions) -> str:
    """``des`` or ``fluid`` for ``--mode auto``: per-request simulation while it stays affordable."""
    if opts.mode != "auto":
        return opts.mode
    return "des" if estimated_requests(opts) <= AUTO_DES_MAX_REQUESTS else "fluid"


def _profile(opts: SimOptions) -> CostProfile:
    return load_profile(opts.profile)


def _autoscaler(opts: SimOptions, profile: CostProfile) -> Any:
    if not opts.autoscale:
        return None
    from fleetgate.core.autoscale import Railed, Rails, build_autoscaler

    params = dict(opts.autoscale_params)
    if opts.autoscale == "static" and "replicas" not in params and "peak_mu_per_min" not in params:
        params["replicas"] = opts.replicas
    # the simulator's own bounds are outer rails around whichever policy runs
    return Railed(build_autoscaler(opts.autoscale, params), Rails(opts.min_replicas, opts.max_replicas))


def load_for(opts: SimOptions) -> Trace:
    """The trace of a discrete-event run."""
    return load_trace(
        opts.trace,
        opts.fmt,
        seed=opts.seed,
        time_scale=opts.time_scale,
        rate_scale=opts.rate_scale,
        tenant=opts.tenant,
        lengths=opts.lengths,
        start_s=opts.start_s,
        duration_s=opts.duration_s,
        max_requests=opts.max_requests,
    )


def run_des(
    opts: SimOptions,
    *,
    trace: Trace | None = None,
    progress: Callable[[int, int], None] | None = None,
    engine_factory: Callable[[str], Any] | None = None,
) -> Any:
    """One discrete-event run; returns ``sim.des.RunResult``."""
    from fleetgate.core.routing.registry import build_policy
    from fleetgate.sim.des import SimConfig, Simulator
    from fleetgate.sim.engine import engine_factory as make_factory

    tr = trace if trace is not None else load_for(opts)
    profile = _profile(opts)
    block = tr.requests[0].block_tokens if tr.requests else 16
    factory = engine_factory or make_factory(profile, hash_block_tokens=block, overrides=opts.engine_params)
    cfg = SimConfig(
        replicas=opts.replicas,
        seed=opts.seed,
        cold_start_s=opts.cold_start_s,
        scrape_interval_s=opts.scrape_interval_s,
        slo_ttft_p95_s=opts.slo_ttft_p95_s,
        min_replicas=opts.min_replicas,
        max_replicas=opts.max_replicas,
        progress=progress,
    )
    sim = Simulator(
        tr,
        build_policy(opts.policy, opts.policy_params, profile=profile),
        profile,
        factory,
        cfg,
        autoscaler=_autoscaler(opts, profile),
    )
    return _with_setup_frozen(sim.run)


def _with_setup_frozen(run: Callable[[], Any]) -> Any:
    """``run()`` with every object that exists now (the trace, the simulator, imported modules) frozen out of
    the garbage collector's sight (``gc.freeze``), unfrozen after: the collections during the run then walk
    only what the run creates (a full collection walked all of it: tens of thousands of setup objects).
    Collection timing only; the results are the same."""
    gc.freeze()
    try:
        return run()
    finally:
        gc.unfreeze()


def run_fluid(opts: SimOptions, *, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Fluid run (``sim.fluid``) from ``SimOptions``."""
    from fleetgate.sim.engine import perf_params_from_profile
    from fleetgate.sim.fluid import FluidConfig, FluidSimulator, workload_from_rates, workload_from_trace
    from fleetgate.sim.traces import RateTable, detect_format, length_source

    profile = _profile(opts)
    perf = perf_params_from_profile(profile, overrides=opts.engine_params)
    path = Path(opts.trace)
    is_table = opts.fmt == "servegen" or (
        opts.fmt == "auto" and not str(path).startswith("synthetic:") and detect_format(path) == "servegen"
    )
    if is_table:
        table = load_rate_table(path).select(opts.tenant).slice(opts.start_s, opts.duration_s)
        if opts.time_scale != 1.0:
            table = RateTable(
                table.t_s * opts.time_scale, table.window_s * opts.time_scale, table.rates, table.name
            )
        work = workload_from_rates(
            table,
            length_source(opts.lengths),
            profile,
            perf,
            opts.step_s,
            seed=opts.seed,
            rate_scale=opts.rate_scale,
        )
    else:
        work = workload_from_trace(load_for(opts), profile, perf, opts.step_s)
    cfg = FluidConfig(
        replicas=opts.replicas,
        seed=opts.seed,
        step_s=opts.step_s,
        cold_start_s=opts.cold_start_s,
        min_replicas=opts.min_replicas,
        max_replicas=opts.max_replicas,
        slo_ttft_p95_s=opts.slo_ttft_p95_s,
        progress=progress,
    )
    return FluidSimulator(work, profile, perf, cfg, autoscaler=_autoscaler(opts, profile)).run()


def run(
    opts: SimOptions, *, progress: Callable[[int, int], None] | None = None
) -> tuple[dict[str, Any], Any]:
    """Run in the chosen mode; returns (summary, RunResult or None for fluid runs)."""
    mode = choose_mode(opts)
    if mode == "des":
        res = run_des(opts, progress=progress)
        return res.summary, res
    if mode == "fluid":
        summary = run_fluid(opts, progress=progress)
        return summary, None
    raise ValueError(f"unknown mode {opts.mode!r}; one of des, fluid, auto")


def parse_params(items: list[str] | None) -> dict[str, Any]:
    """``key=value`` strings into a dict (values parsed as YAML scalars: numbers, booleans, lists)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value, got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def json_dumps(summary: Mapping[str, Any]) -> bytes:
    """Stable JSON bytes (sorted nowhere: summaries are already ordered; indented; NaN -> null)."""
    import orjson

    def default(o: Any) -> Any:
        if isinstance(o, float) and not math.isfinite(o):
            return None
        raise TypeError(type(o).__name__)

    return orjson.dumps(
        {k: v for k, v in summary.items() if not k.startswith("_")},
        option=orjson.OPT_INDENT_2,
        default=default,
    )
