"""Cross-field checks of a config: what a single field's validation cannot see, each problem one line with
its path (``tenants.1.name: ...``), all reported at once.

``config_problems``: wrong wherever the config runs (``parse_config`` applies them). ``serve_problems``:
what ``fleetgate serve`` (and ``validate-config``) also need: something to serve, names of served models
and known tenants, readable key and tokenizer files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # config.parse_config calls in here: no runtime import back
    from fleetgate.config import DeploymentConfig, FleetgateConfig

_STORE_SCHEMES = ("redis://", "rediss://", "unix://")


def config_problems(cfg: FleetgateConfig) -> list[str]:
    """Cross-field problems that make a config wrong wherever it runs, one line each with its path:
    duplicate names and keys, unknown cost profiles, pools unknown or oversold, an unsupported store URL."""
    from fleetgate.config_control import election_problems
    from fleetgate.profiles import load_profile

    problems: list[str] = []
    seen: dict[str, int] = {}
    for i, tenant in enumerate(cfg.tenants):
        if tenant.name in seen:
            problems.append(
                f"tenants.{i}.name: tenant {tenant.name!r} is already tenants.{seen[tenant.name]}"
            )
        seen.setdefault(tenant.name, i)
    owners: dict[str, str] = {}
    keyed = [
        (f"tenants.{i}.api_keys.{k}", h) for i, t in enumerate(cfg.tenants) for k, h in enumerate(t.api_keys)
    ]
    keyed += [(f"admission.admin_api_keys.{k}", h) for k, h in enumerate(cfg.admission.admin_api_keys)]
    for where, digest in keyed:
        if digest in owners:
            problems.append(f"{where}: an API key used twice (also {owners[digest]}); every key must differ")
        owners.setdefault(digest, where)
    models: dict[str, int] = {}
    for i, dep in enumerate(cfg.deployments):
        if dep.model in models:
            problems.append(
                f"deployments.{i}.model: {dep.model!r} is already deployments.{models[dep.model]}"
            )
        models.setdefault(dep.model, i)
        if dep.cost_profile is not None:
            try:
                load_profile(dep.cost_profile)
            except (ValueError, OSError, TypeError, KeyError) as exc:
                problems.append(f"deployments.{i}.cost_profile: {exc}")
        if dep.upstream_api_key and dep.upstream_api_key_file:
            problems.append(f"deployments.{i}.upstream_api_key_file: set either it or upstream_api_key")
        problems += control_problems(f"deployments.{i}", dep)
        problems += election_problems(
            f"deployments.{i}", dep.leader_election, dep.provider.kind, cfg.admission.store.kind
        )
    problems += pool_problems(cfg)
    store = cfg.admission.store
    if store.kind == "redis" and not store.url.startswith(_STORE_SCHEMES):
        scheme = store.url.split("://", 1)[0] if "://" in store.url else store.url
        problems.append(
            f"admission.store.url: unsupported scheme {scheme!r} (use {', '.join(_STORE_SCHEMES)})"
        )
    return problems


def control_problems(where: str, dep: DeploymentConfig) -> list[str]:
    """Wrong combinations of a deployment's provider, autoscaler and remediation, one line each."""
    from fleetgate.config_control import REMEDIATION_NEEDS

    kind = dep.provider.kind
    problems: list[str] = []
    needs = REMEDIATION_NEEDS.get(dep.remediation or "none")
    if needs is not None and needs != kind:
        problems.append(
            f"{where}.remediation: {dep.remediation} needs `provider: {{kind: {needs}}}` (this provider is "
            f"{kind}); use `remediation: none`"
        )
    if dep.autoscaler is not None and kind == "static":
        problems.append(
            f"{where}.autoscaler: a static replica list cannot be scaled; set `provider: {{kind: local}}` "
            "or `{kind: kubernetes, ...}`, or drop `autoscaler`"
        )
    if dep.replicas and kind != "static":
        problems.append(
            f"{where}.replicas: the {kind} provider finds its own replicas; drop the list "
            f"(`provider.replicas` is the local count)"
        )
    return problems


def serve_problems(cfg: FleetgateConfig, implied_models: tuple[str, ...] = ()) -> list[str]:
    """What makes a config unusable for ``fleetgate serve`` (``implied_models``: deployments that
    ``fleetgate up`` adds itself): nothing to serve, names of models no deployment serves, unreadable key
    files."""
    problems: list[str] = []
    served = {d.model for d in cfg.deployments} | set(implied_models)
    if not served:
        problems.append("deployments: none configured; the gateway would have nothing to route to")
    for i, tenant in enumerate(cfg.tenants):
        for model in tenant.reserved_mu_per_min:
            if model not in served:
                problems.append(f"tenants.{i}.reserved_mu_per_min.{model}: no deployment serves {model!r}")
    for model in cfg.multimodal.per_model:
        if model not in served:
            problems.append(f"multimodal.per_model.{model}: no deployment serves {model!r}")
    names = {t.name for t in cfg.tenants}
    for name in cfg.ops.slo.tenant_ttft_target_s:
        if name not in names:
            problems.append(f"ops.slo.tenant_ttft_target_s.{name}: no tenant is called {name!r}")
    files = [(f"tenants.{i}.api_keys_file", t.api_keys_file) for i, t in enumerate(cfg.tenants)]
    files.append(("admission.admin_api_keys_file", cfg.admission.admin_api_keys_file))
    files += [
        (f"deployments.{i}.upstream_api_key_file", d.upstream_api_key_file)
        for i, d in enumerate(cfg.deployments)
    ]
    for i, dep in enumerate(cfg.deployments):
        if dep.tokenizer is not None:
            path = Path(dep.tokenizer)
            if not (path / "tokenizer.json" if path.is_dir() else path).is_file():
                problems.append(f"deployments.{i}.tokenizer: no tokenizer.json at {dep.tokenizer}")
    for where, file in files:
        if file is not None:
            try:
                Path(file).read_bytes()
            except OSError as exc:
                problems.append(f"{where}: cannot read {file}: {exc.strerror}")
    return problems


def reservation_target_utilisation(cfg: FleetgateConfig, dep: DeploymentConfig | None = None) -> float:
    """The utilisation reservations are backed at: the deployment's (else the deprecated ``local:``
    section's) fleetgate autoscaler target, else its default."""
    from fleetgate.core.autoscale.fleetgate import AutoscalePolicy

    scaler = dep.autoscaler if dep is not None and dep.autoscaler is not None else cfg.local.autoscaler
    return (scaler if isinstance(scaler, AutoscalePolicy) else AutoscalePolicy()).target_utilisation


@dataclass(frozen=True, slots=True)
class PoolShortfall:
    """A pool whose floors need more GPUs than it has: by how many, and the reserved MU/min its GPUs
    cannot back at this mix of deployments (``sold * (1 - gpus / exact GPUs needed)``)."""

    index: int
    pool: str
    gpus: int
    need_gpus: int
    sold_mu_per_min: float
    short_mu_per_min: float
    targets: tuple[float, ...]

    @property
    def short_gpus(self) -> int:
        return self.need_gpus - self.gpus

    def line(self) -> str:
        at = "/".join(f"{t:g}" for t in self.targets)
        return (
            f"pools.{self.index}: pool {self.pool!r} is oversold: the reservations on its deployments "
            f"({self.sold_mu_per_min:g} MU/min) need {self.need_gpus} GPUs at target utilisation {at}, "
            f"it has {self.gpus}: short by {self.short_gpus} GPUs and {self.short_mu_per_min:.1f} MU/min"
        )

    def public(self) -> dict[str, object]:
        """The shortfall as the admin API answers it (409)."""
        return {
            "pool": self.pool,
            "gpus": self.gpus,
            "gpus_needed": self.need_gpus,
            "short_gpus": self.short_gpus,
            "sold_mu_per_min": self.sold_mu_per_min,
            "short_mu_per_min": round(self.short_mu_per_min, 3),
        }


def sold_by_model(cfg: FleetgateConfig) -> dict[str, float]:
    """MU/min the configured tenants reserved, per deployment."""
    sold: dict[str, float] = {}
    for tenant in cfg.tenants:
        for model, mu in tenant.reserved_mu_per_min.items():
            sold[model] = sold.get(model, 0.0) + mu
    return sold


def pool_shortfalls(cfg: FleetgateConfig, sold: Mapping[str, float]) -> list[PoolShortfall]:
    """The pools whose floors (the replicas backing ``sold``, MU/min per deployment) need more GPUs than
    they have; unknown pools and unreadable profiles are skipped (``pool_problems`` reports them)."""
    from fleetgate.core.capacity import floor_replicas
    from fleetgate.profiles import replica_capacity_mu_per_min

    index = {pool.name: k for k, pool in reversed(list(enumerate(cfg.pools)))}
    need_gpus = [0] * len(cfg.pools)
    exact_gpus = [0.0] * len(cfg.pools)
    sold_mu = [0.0] * len(cfg.pools)
    targets: list[set[float]] = [set() for _ in cfg.pools]
    for dep in cfg.deployments:
        if dep.pool is None or dep.pool not in index:
            continue
        k = index[dep.pool]
        mu = sold.get(dep.model, 0.0)
        try:
            per_replica = replica_capacity_mu_per_min(dep)
        except (ValueError, OSError, TypeError, KeyError):
            continue  # an unreadable cost profile is reported by config_problems
        target = reservation_target_utilisation(cfg, dep)
        targets[k].add(target)
        need_gpus[k] += floor_replicas(mu, per_replica, target) * dep.gpus_per_replica
        exact_gpus[k] += mu * dep.gpus_per_replica / (per_replica * target)
        sold_mu[k] += mu
    out = []
    for k, pool in enumerate(cfg.pools):
        if need_gpus[k] <= pool.gpus:
            continue
        out.append(
            PoolShortfall(
                index=k,
                pool=pool.name,
                gpus=pool.gpus,
                need_gpus=need_gpus[k],
                sold_mu_per_min=sold_mu[k],
                short_mu_per_min=max(0.0, sold_mu[k] * (1.0 - pool.gpus / exact_gpus[k])),
                targets=tuple(sorted(targets[k])),
            )
        )
    return out


def pool_problems(cfg: FleetgateConfig) -> list[str]:
    """Pools named twice or unknown, replicas larger than their pool, and pools whose floors (the replicas
    backing the reservations sold on their deployments) need more GPUs than they have: one line per pool
    with the shortfall in GPUs and in MU/min (what the pool's GPUs cannot back at this mix)."""
    problems: list[str] = []
    pools: dict[str, int] = {}
    for i, pool in enumerate(cfg.pools):
        if pool.name in pools:
            problems.append(f"pools.{i}.name: pool {pool.name!r} is already pools.{pools[pool.name]}")
        pools.setdefault(pool.name, i)
    for i, dep in enumerate(cfg.deployments):
        if dep.pool is None:
            continue
        if dep.pool not in pools:
            problems.append(f"deployments.{i}.pool: no pool is called {dep.pool!r}")
            continue
        k = pools[dep.pool]
        if dep.gpus_per_replica > cfg.pools[k].gpus:
            problems.append(
                f"deployments.{i}.gpus_per_replica: {dep.gpus_per_replica} GPUs per replica do not fit pool "
                f"{dep.pool!r} ({cfg.pools[k].gpus} GPUs)"
            )
    problems += [short.line() for short in pool_shortfalls(cfg, sold_by_model(cfg))]
    return problems
