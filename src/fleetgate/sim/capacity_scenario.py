"""The scenario file of ``fleetgate simulate --scenario FILE.yaml --capacity MODE``: one GPU pool, several
deployments replaying columns of ServeGen rate tables, reservations per tenant column.

Keys (issue 18; extra keys are refused so that a typo is not silently ignored):

```yaml
pool: {name: h100, gpus: 96}
cold_start_s: 180
slo_ttft_p95_s: 1.0
deployments:
  - name: chat-a
    trace: ../shared/traces/servegen/rates_language_m-large.csv
    tenants: [client_3, client_17]     # columns of the rates table replayed (omitted: all)
    profile: llama2-70b-h100-tp4
    gpus_per_replica: 4
    min_replicas: 1
    max_replicas: 64
    reservations: {client_3: 400}      # MU/min per tenant column; the rest is best-effort
```

Optional keys with their defaults are the fields of :class:`Scenario` below. A relative ``trace`` is looked up
from the working directory, then from the scenario file's folder; ``../shared/traces/...`` also resolves to
the shared traces folder (``$FLEETGATE_TRACES_DIR``) wherever the command runs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fleetgate.sim.traces import RateTable, TraceFormatError, default_traces_dir, load_rate_table

CapacityMode = Literal["fleetgate", "static", "independent"]
CAPACITY_MODES: tuple[str, ...] = ("fleetgate", "static", "independent")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolSpec(_Strict):
    """The one finite pool every deployment of the scenario draws its replicas from."""

    name: str = "pool"
    gpus: int = Field(ge=1)


class DeploymentSpec(_Strict):
    """One deployment: the tenant columns it replays and how its replicas look."""

    name: str = Field(min_length=1)
    trace: str
    tenants: list[str] | None = None
    profile: str = "llama2-70b-h100-tp4"
    gpus_per_replica: int = Field(default=1, ge=1)
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=1024, ge=1)
    reservations: dict[str, float] = Field(default_factory=dict)
    weight: float = Field(default=1.0, gt=0, description="Share of the pool above the floors (allocator).")

    @field_validator("reservations")
    @classmethod
    def _non_negative(cls, v: dict[str, float]) -> dict[str, float]:
        for tenant, mu in v.items():
            if not (math.isfinite(mu) and mu >= 0):
                raise ValueError(f"reservation of {tenant!r} must be a finite MU/min >= 0, got {mu!r}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> DeploymentSpec:
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas must be >= min_replicas")
        if self.tenants is not None:
            missing = sorted(set(self.reservations) - set(self.tenants))
            if missing:
                raise ValueError(f"reservations for tenants not replayed here: {', '.join(missing)}")
        return self


class Scenario(_Strict):
    """A whole capacity scenario. Defaults follow the autoscaling benchmark (docs/benchmarks.md)."""

    pool: PoolSpec
    cold_start_s: float = Field(default=180.0, ge=0)
    slo_ttft_p95_s: float = Field(default=1.0, gt=0)
    deployments: list[DeploymentSpec] = Field(min_length=1)
    step_s: float = Field(default=1.0, gt=0, le=60, description="Fluid time step (s).")
    seed: int = 0
    start_s: float = Field(default=0.0, ge=0, description="Skip this much of the traces.")
    duration_s: float | None = Field(default=None, gt=0, description="Replay only this long.")
    lengths: str | None = Field(default=None, description="Length source (servegen, azure, mooncake, path).")
    autoscaler: str = "fleetgate"
    autoscaler_params: dict[str, Any] = Field(default_factory=dict)
    autoscale_interval_s: float = Field(default=10.0, gt=0)
    reclaim_after_s: float = Field(default=60.0, ge=0, description="The allocator's hysteresis.")
    lend_idle_gpus: bool = Field(
        default=True,
        description="fleetgate mode: lend the GPUs left idle as warm headroom replicas (the allocator's).",
    )
    drain_s: float = Field(
        default=30.0,
        ge=0,
        description="A drained replica keeps its GPUs this long (requests in flight finish).",
    )
    best_effort_wait_budget_s: float | None = Field(
        default=None,
        ge=0,
        description="Best-effort is admitted while the queue it joins drains within this (default: half the "
        "SLO); the rest is shed.",
    )
    reserved_queue_timeout_s: float = Field(
        default=30.0, gt=0, description="Reserved work that would wait longer than this is shed."
    )

    @model_validator(mode="after")
    def _unique(self) -> Scenario:
        names = [d.name for d in self.deployments]
        if len(set(names)) != len(names):
            raise ValueError("deployment names must be unique")
        return self

    @property
    def wait_budget_s(self) -> float:
        b = self.best_effort_wait_budget_s
        return self.slo_ttft_p95_s / 2.0 if b is None else b


class ScenarioError(ValueError):
    """A scenario file that cannot be used (message names the file and the field)."""


def load_scenario(path: Path) -> Scenario:
    """Parse and validate a scenario file."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: expected a mapping with pool and deployments")
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ScenarioError(f"{path}:\n" + "\n".join(lines)) from exc


def resolve_trace(trace: str, scenario_dir: Path | None) -> Path:
    """Where a deployment's ``trace`` is (see the module docstring)."""
    p = Path(trace)
    candidates = [p] if p.is_absolute() else [Path.cwd() / p]
    if not p.is_absolute() and scenario_dir is not None:
        candidates.append(scenario_dir / p)
    parts = p.parts
    if "traces" in parts:
        k = parts.index("traces")
        candidates.append(default_traces_dir().joinpath(*parts[k + 1 :]))
    for c in candidates:
        if c.is_file():
            return c
    raise ScenarioError(f"trace not found: {trace} (tried {', '.join(str(c) for c in candidates)})")


def deployment_tables(scenario: Scenario, scenario_dir: Path | None) -> dict[str, RateTable]:
    """Each deployment's rate table: its tenant columns, sliced to the scenario's window."""
    cache: dict[Path, RateTable] = {}
    out: dict[str, RateTable] = {}
    for dep in scenario.deployments:
        path = resolve_trace(dep.trace, scenario_dir)
        if path not in cache:
            try:
                cache[path] = load_rate_table(path)
            except TraceFormatError as exc:
                raise ScenarioError(f"deployments.{dep.name}.trace: {exc}") from exc
        table = cache[path]
        cols = dep.tenants if dep.tenants is not None else sorted(table.rates)
        unknown = [c for c in cols if c not in table.rates]
        if unknown:
            raise ScenarioError(f"deployments.{dep.name}.tenants: not in {path.name}: {', '.join(unknown)}")
        bad = [t for t in dep.reservations if t not in cols]
        if bad:
            raise ScenarioError(f"deployments.{dep.name}.reservations: not replayed here: {', '.join(bad)}")
        sub = RateTable(
            table.t_s, table.window_s, {c: table.rates[c] for c in cols}, f"{table.name}:{dep.name}"
        )
        out[dep.name] = sub.slice(scenario.start_s, scenario.duration_s)
    replayed = [c for d in scenario.deployments for c in out[d.name].rates]
    if len(set(replayed)) != len(replayed):
        raise ScenarioError("a tenant column is replayed by two deployments (tenants must be disjoint)")
    return out
