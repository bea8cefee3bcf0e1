"""The control plane a config asks for, per deployment: its replica provider (as a factory the composition
root hands the gateway's callbacks), its autoscaler and whether the prober remediates through the provider.

``fleetgate serve`` builds all of it from ``deployments[*].provider / autoscaler / remediation``;
``fleetgate up`` is ``serve`` after :func:`up_config` made its deployment a local one (the embedded default).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from fleetgate.capacity_loop import PoolMemberPlan, PoolPlan
from fleetgate.config import ConfigError, DeploymentConfig, FleetgateConfig
from fleetgate.config_checks import reservation_target_utilisation, sold_by_model
from fleetgate.config_control import (
    DEFAULT_REMEDIATION,
    KubernetesProviderConfig,
    LocalProviderConfig,
    election_kind,
)
from fleetgate.core.autoscale import (
    AutoscalePolicy,
    DemandMeter,
    KpaAutoscaler,
    ReportingAutoscaler,
    autoscaler_from,
)
from fleetgate.core.capacity import AllocatorParams
from fleetgate.core.leader import ElectionTiming, LeaderElection
from fleetgate.engines.dialects import dialect
from fleetgate.profiles import replica_capacity_mu_per_min
from fleetgate.providers.base import ChangeListener, DrainHook, ReplicaProvider
from fleetgate.providers.demand_share import SharedDemand
from fleetgate.providers.kubernetes_rbac import lease_name
from fleetgate.providers.kubernetes_replicas import KubernetesReplicaProvider
from fleetgate.providers.leader import (
    LeaderElector,
    LeaderMetrics,
    LeaseStore,
    RedisLeaseStore,
    candidate_identity,
)
from fleetgate.providers.leader_lease import KubernetesLeaseStore
from fleetgate.providers.local import LocalProcessProvider, sim_engine_command

#: cost profile of the simulated engine replicas (src/fleetgate/profiles/fleetgate-sim.json)
SIM_COST_PROFILE = "fleetgate-sim"

#: Builds one deployment's replica provider, given the callbacks the gateway wants it to call: the new replica
#: list after every change, and "drain this replica" before it stops one.
ProviderFactory = Callable[[ChangeListener, DrainHook], ReplicaProvider]

#: Builds one deployment's leader elector, given its built provider and the gateway's leader gauge family.
ElectionFactory = Callable[[ReplicaProvider, LeaderMetrics], LeaderElector]

#: Builds one deployment's demand as all gateways see it, given this gateway's meter.
DemandShareFactory = Callable[[DemandMeter], SharedDemand]


@dataclass(slots=True)
class ControlPlane:
    """What ``build_gateway`` is given for the deployments whose replicas the gateway manages."""

    providers: dict[str, ProviderFactory] = field(default_factory=dict)
    autoscalers: dict[str, ReportingAutoscaler] = field(default_factory=dict)
    remediate: set[str] = field(default_factory=set)
    #: replicas each provider is asked for before the gateway listens
    initial: dict[str, int] = field(default_factory=dict)
    #: deployments whose replicas several gateways share: only the elected one autoscales and remediates
    elections: dict[str, ElectionFactory] = field(default_factory=dict)
    #: ... and, with a Redis admission store, the autoscaler reads every gateway's demand
    demand_shares: dict[str, DemandShareFactory] = field(default_factory=dict)
    #: GPU pools whose allocator sizes their deployments (``capacity_loop``); their autoscalers only decide
    pools: list[PoolPlan] = field(default_factory=list)

    def pooled(self) -> set[str]:
        """Deployments the pool loops scale (their autoscaler loops must not)."""
        return {m.model for plan in self.pools for m in plan.members}


def remediation(dep: DeploymentConfig) -> str:
    """The deployment's remediation: as written, else its provider kind's default."""
    return dep.remediation or DEFAULT_REMEDIATION[dep.provider.kind]


def with_local_defaults(cfg: FleetgateConfig) -> FleetgateConfig:
    """Deployments on the default simulated engine get its dialect and cost profile unless they set them."""
    deployments = []
    for dep in cfg.deployments:
        update: dict[str, Any] = {}
        if isinstance(dep.provider, LocalProviderConfig) and dep.provider.command is None:
            if dep.engine is None:
                update["engine"] = "sim"  # vLLM's metric names, always takes a priority
            if dep.cost_profile is None:
                update["cost_profile"] = SIM_COST_PROFILE  # fitted to its default perf model
        deployments.append(dep.model_copy(update=update) if update else dep)
    return cfg.model_copy(update={"deployments": deployments})


def _local_factory(model: str, dep: DeploymentConfig, local: LocalProviderConfig) -> ProviderFactory:
    default = local.command is None
    command = sim_engine_command(local.engine_args) if local.command is None else local.command
    health_path = dialect(dep.engine).health_path

    def build(on_change: ChangeListener, drain_hook: DrainHook) -> ReplicaProvider:
        return LocalProcessProvider(
            model=dep.upstream_model or model,
            command=command,
            url_from_output=default,
            ready_timeout_s=local.ready_timeout_s,
            stop_timeout_s=local.stop_timeout_s,
            health_path=health_path,
            on_change=on_change,
            drain_hook=drain_hook,
        )

    return build


def _kubernetes_factory(k8s: KubernetesProviderConfig) -> ProviderFactory:
    """The engine Deployment's replicas from its Service's EndpointSlices (watched); the Deployment owns
    the count, so nothing is asked for before the gateway listens."""
    from fleetgate.providers.kubernetes_config import connect as kubernetes_connect  # its client: ~0.3 s

    make_api = functools.partial(
        kubernetes_connect,
        deployment=k8s.deployment,
        service=k8s.service,
        port_name=k8s.port,
        namespace=k8s.namespace,
    )

    def build(on_change: ChangeListener, drain_hook: DrainHook) -> ReplicaProvider:
        return KubernetesReplicaProvider(make_api, on_change=on_change, drain_hook=drain_hook)

    return build


def control_plane(cfg: FleetgateConfig) -> ControlPlane:
    """Providers, autoscalers and remediation of every deployment (config already validated)."""
    plane = ControlPlane()
    for i, dep in enumerate(cfg.deployments):
        provider = dep.provider
        if provider.kind == "static":
            continue
        if isinstance(provider, KubernetesProviderConfig):
            plane.providers[dep.model] = _kubernetes_factory(provider)
        elif isinstance(provider, LocalProviderConfig):
            plane.providers[dep.model] = _local_factory(dep.model, dep, provider)
            plane.initial[dep.model] = provider.replicas
        else:  # pragma: no cover - the config union has no other kind
            raise ConfigError(
                f"deployments.{i}.provider: kind {provider.kind} is not run by `fleetgate serve`"
            )
        if dep.autoscaler is not None:
            plane.autoscalers[dep.model] = autoscaler_from(dep.autoscaler)
        if remediation(dep) != "none":
            plane.remediate.add(dep.model)
        election = _election_factory(cfg, dep)
        if election is not None:
            plane.elections[dep.model] = election
            if cfg.admission.store.kind == "redis" and dep.autoscaler is not None:
                plane.demand_shares[dep.model] = _demand_share_factory(cfg, dep.model)
    plane.pools = pool_plans(cfg)
    sold = sold_by_model(cfg)
    for plan in plane.pools:  # what each starts with: floors first, within its pool
        plane.initial.update({m: n for m, n in plan.initial(sold).items() if m in plane.initial})
    return plane


# -- GPU pools (issue 18): the allocator's inputs from the config; the loop is ``capacity_loop`` -----------


def pool_plans(cfg: FleetgateConfig) -> list[PoolPlan]:
    """Every pool with the deployments whose provider the gateway scales (local, kubernetes); the GPUs of
    a static replica list in the pool are taken off its size."""
    plans = []
    for pool in cfg.pools:
        members: list[PoolMemberPlan] = []
        static_gpus = 0
        for dep in cfg.deployments:
            if dep.pool != pool.name:
                continue
            if dep.provider.kind == "static":
                static_gpus += len(dep.replicas) * dep.gpus_per_replica
                continue
            local = dep.provider if isinstance(dep.provider, LocalProviderConfig) else None
            members.append(
                PoolMemberPlan(
                    model=dep.model,
                    gpus_per_replica=dep.gpus_per_replica,
                    capacity_mu_per_min=replica_capacity_mu_per_min(dep),
                    target_utilisation=reservation_target_utilisation(cfg, dep),
                    replicas=None if local is None else local.replicas,
                    max_replicas=_lend_cap(dep),
                )
            )
        if members:
            plans.append(
                PoolPlan(
                    name=pool.name,
                    gpus=max(0, pool.gpus - static_gpus),
                    members=tuple(members),
                    params=AllocatorParams(
                        reclaim_after_s=pool.reclaim_after_s, lend_idle_gpus=pool.lend_idle_gpus
                    ),
                )
            )
    return plans


def _lend_cap(dep: DeploymentConfig) -> int | None:
    """The most replicas a pooled deployment may run on lent idle GPUs: its autoscaler's ``max_replicas``
    (``None``, lent nothing: no autoscaler or a fixed count)."""
    if isinstance(dep.autoscaler, AutoscalePolicy | KpaAutoscaler):
        return int(dep.autoscaler.max_replicas)
    return None


def _demand_share_factory(cfg: FleetgateConfig, model: str) -> DemandShareFactory:
    store = cfg.admission.store

    def build(meter: DemandMeter) -> SharedDemand:
        prefix = f"{store.namespace}:demand:{model}"
        return SharedDemand(meter, url=store.url, prefix=prefix, identity=candidate_identity())

    return build


def _election_factory(cfg: FleetgateConfig, dep: DeploymentConfig) -> ElectionFactory | None:
    """The deployment's leader election (``leader_election``), or None when every gateway acts."""
    le = dep.leader_election
    kind = election_kind(le, dep.provider.kind)
    if kind == "none":
        return None
    timing = ElectionTiming(le.lease_duration_s, le.renew_deadline_s, le.retry_period_s)
    store_cfg = cfg.admission.store
    k8s = dep.provider if isinstance(dep.provider, KubernetesProviderConfig) else None

    def build(provider: ReplicaProvider, metrics: LeaderMetrics) -> LeaderElector:
        store: LeaseStore
        if kind == "lease":
            assert k8s is not None and isinstance(provider, KubernetesReplicaProvider)
            store = KubernetesLeaseStore(lambda: provider.api, lease_name(k8s.deployment))
        else:
            store = RedisLeaseStore(store_cfg.url, f"{store_cfg.namespace}:leader:{dep.model}")
        election = LeaderElection(candidate_identity(), timing)
        return LeaderElector(store, election, deployment=dep.model, metrics=metrics)

    return build


def up_config(cfg: FleetgateConfig, model: str, replicas: int | None = None) -> FleetgateConfig:
    """``fleetgate up``'s config: ``model`` served by local replicas (``replicas`` of them when given), its
    other settings kept; the deprecated top-level ``local:`` section still fills its provider in."""
    existing = cfg.deployment(model) or DeploymentConfig(model=model)
    update: dict[str, Any] = {}
    if isinstance(existing.provider, LocalProviderConfig):
        provider = existing.provider
    else:
        local = cfg.local
        provider = LocalProviderConfig(
            command=local.command,
            engine_args=local.engine_args,
            ready_timeout_s=local.ready_timeout_s,
            stop_timeout_s=local.stop_timeout_s,
        )
        update["replicas"] = []
        if existing.autoscaler is None and local.autoscaler is not None:
            update["autoscaler"] = local.autoscaler
        if existing.remediation is not None and existing.remediation != "restart":
            update["remediation"] = None  # the static/kubernetes choice does not apply to local processes
    if replicas is not None:
        provider = provider.model_copy(update={"replicas": replicas})
    update["provider"] = provider
    deployment = existing.model_copy(update=update)
    others = [d for d in cfg.deployments if d.model != model]
    return with_local_defaults(cfg.model_copy(update={"deployments": [*others, deployment]}))


def local_section_warning(cfg: FleetgateConfig, model: str = "fleetgate-sim") -> str | None:
    """One line saying what to write instead of the deprecated top-level ``local:`` section (or None)."""
    if "local" not in cfg.model_fields_set:
        return None
    local = cfg.local
    written = local.model_fields_set & {"command", "engine_args", "ready_timeout_s", "stop_timeout_s"}
    provider: dict[str, Any] = {"kind": "local", **local.model_dump(mode="json", include=written)}
    dep: dict[str, Any] = {"model": model, "provider": provider}
    if local.autoscaler is not None:
        dep["autoscaler"] = local.autoscaler.model_dump(mode="json", exclude_defaults=True) | {
            "policy": local.autoscaler.policy
        }
    flow = yaml.safe_dump({"deployments": [dep]}, default_flow_style=True, width=10_000).strip()
    return (
        "config: the top-level `local:` section is deprecated (read by `fleetgate up` for one release); "
        f"write {flow} instead"
    )
