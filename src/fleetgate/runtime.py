"""Composition root: builds every live object from the config and runs their lifecycles.

Nothing else in the package constructs long-lived objects from config or touches process signals: tests and
the CLI both come through here (``build_gateway`` for an in-process gateway, ``serve``/``up`` for whole
processes). No singletons: each call builds a fresh, independent set of objects.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import random
import signal
import sys
import time
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from fleetgate.admission.latency import headroom_params, wire_latency_headroom
from fleetgate.autoscaler import AutoscalerLoop, AutoscalerMetrics, provider_counts
from fleetgate.autoscaler.loop import DemandSource
from fleetgate.capacity_loop import (
    LentReplicas,
    PoolLoop,
    PoolPlan,
    admission_sold,
    admission_used,
    pool_loops,
)
from fleetgate.config import ConfigError, FleetgateConfig
from fleetgate.control import (
    SIM_COST_PROFILE,
    DemandShareFactory,
    ElectionFactory,
    ProviderFactory,
    control_plane,
    up_config,
    with_local_defaults,
)
from fleetgate.core.autoscale import DemandMeter, ReportingAutoscaler
from fleetgate.core.engine_rates import EngineRateLearner
from fleetgate.core.health import HealthPolicy, Transition
from fleetgate.core.lifecycle import LifecycleObserver, SortedOutputHistory
from fleetgate.core.tokenize import PromptTokenizer
from fleetgate.core.types import HealthState, RandomSource
from fleetgate.engines.client import UpstreamClient
from fleetgate.engines.metrics import EngineSignals
from fleetgate.engines.scraper import MetricsScraper, ScrapeObserver, ScrapeTarget
from fleetgate.gateway.admission import Admission, OpenAdmission
from fleetgate.gateway.app import create_app, create_metrics_app
from fleetgate.gateway.engine_rates import EngineRateListener, EngineRateMetrics
from fleetgate.gateway.fleet import Deployment, Fleet, build_deployment
from fleetgate.gateway.metrics import GatewayMetrics
from fleetgate.gateway.proxy import Proxy, ResultListener, default_parser
from fleetgate.gateway.secrets import KeySink, SecretFiles
from fleetgate.gateway.server import GatewayServer
from fleetgate.health.families import HealthFamilies
from fleetgate.health.monitor import HealthMonitor, Remediator
from fleetgate.ops.web import Ops
from fleetgate.providers.base import ProviderError, ReplicaInfo, ReplicaProvider
from fleetgate.providers.kubernetes_replicas import KubernetesReplicaProvider
from fleetgate.providers.leader import LeaderElector, LeaderMetrics, LeaderOnly
from fleetgate.providers.local import LocalProcessProvider

if TYPE_CHECKING:
    from aiohttp import web

    from fleetgate.admission.fleet_ledger import FleetLedger
    from fleetgate.admission.reservations import ReservationBook
    from fleetgate.multimodal.pipeline import ImagePipeline

log = logging.getLogger("fleetgate")

__all__ = ["SIM_COST_PROFILE", "Gateway", "ProviderFactory", "build_gateway", "serve", "up"]


def build_admission(cfg: FleetgateConfig, registry: CollectorRegistry | None = None) -> Admission:
    """Tenant admission (``fleetgate.admission``) when tenants or admin keys are configured, else open."""
    adm = cfg.admission
    if not cfg.tenants and not adm.admin_api_keys and not adm.admin_api_keys_file:
        return OpenAdmission()
    from fleetgate.admission.service import AdmissionService

    return AdmissionService.from_config(cfg, registry=registry)


def metrics_access(cfg: FleetgateConfig, admission: Admission) -> Callable[[str | None], None] | None:
    """Who may read ``GET /metrics`` on the main port (``gateway.metrics_auth``): none means anyone.

    ``admin``: when tenants are configured, only an admin key (401 without a valid key, 403 for a tenant's
    key); a gateway without tenants has nothing per tenant to hide.
    """
    if cfg.gateway.metrics_auth == "none" or not cfg.tenants or isinstance(admission, OpenAdmission):
        return None
    from fleetgate.core.errors import PermissionDeniedError

    def check(authorization: str | None) -> None:
        caller = admission.authenticate(authorization)  # AuthenticationError (401) without a valid key
        if not admission.is_admin(caller):
            raise PermissionDeniedError("GET /metrics needs the admin API key.", code="admin_only")

    return check


def build_images(cfg: FleetgateConfig) -> ImagePipeline | None:
    """The image pipeline (``fleetgate.multimodal``); its worker processes start lazily or at startup."""
    from fleetgate.multimodal.pipeline import build_pipeline

    return build_pipeline(cfg.multimodal)


def attach_images(
    app: web.Application, images: ImagePipeline, *, prestart: bool, registry: CollectorRegistry | None = None
) -> None:
    """Tie the pipeline's workers to the app's lifecycle (started on startup if asked; always closed) and
    its counters to /metrics."""
    if registry is not None:
        from fleetgate.multimodal.metrics import register

        register(images, registry)

    async def on_startup(_: web.Application) -> None:
        await images.start()

    async def on_cleanup(_: web.Application) -> None:
        await images.close()

    if prestart:
        app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)


class Gateway:
    """Every object of one gateway process, wired at construction (what :func:`build_gateway` returns).

    ``server`` listens and runs the services; ``fleet``, ``proxy`` and ``ops`` serve requests and report;
    ``monitors`` (health, by model), ``providers`` (replica providers, by model) and ``autoscalers`` (loops,
    by model) are the control plane. Nothing is attached later: observers and sinks are constructor arguments.
    """

    def __init__(
        self,
        *,
        config: FleetgateConfig,
        server: GatewayServer,
        fleet: Fleet,
        proxy: Proxy,
        ops: Ops,
        admission: Admission,
        monitors: Mapping[str, HealthMonitor],
        providers: Mapping[str, ReplicaProvider],
        autoscalers: Mapping[str, AutoscalerLoop],
        pools: Mapping[str, PoolLoop] | None = None,
    ) -> None:
        self.config = config
        self.server = server
        self.fleet = fleet
        self.proxy = proxy
        self.ops = ops
        self.admission = admission
        self.monitors = monitors
        self.providers = providers
        self.autoscalers = autoscalers
        #: GPU pool loops by pool name (``capacity_loop``): they scale their deployments' providers
        self.pools: Mapping[str, PoolLoop] = pools or {}

    @property
    def app(self) -> web.Application:
        return self.server.app

    @property
    def url(self) -> str:
        return self.server.url

    async def start(self, port: int | None = None) -> str:
        """Listen and start every service (scrapers, probers, autoscaler loops); returns the URL."""
        return await self.server.start(port)

    async def stop(self, grace_s: float | None = None) -> bool:
        """Drain and stop (see ``GatewayServer.stop``); True when every in-flight request finished."""
        return await self.server.stop(grace_s)


def build_gateway(
    cfg: FleetgateConfig,
    *,
    admission: Admission | None = None,
    rng: RandomSource | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    health: bool = False,
    providers: Mapping[str, ProviderFactory] | None = None,
    autoscalers: Mapping[str, ReportingAutoscaler] | None = None,
    autoscale_interval_s: float = 1.0,
    observers: Sequence[LifecycleObserver] = (),
    remediate: Collection[str] | None = None,
    pools: Sequence[PoolPlan] = (),
    elections: Mapping[str, ElectionFactory] | None = None,
    demand_shares: Mapping[str, DemandShareFactory] | None = None,
) -> Gateway:
    """Every gateway object, wired: fleet, upstream client, metrics, admission, health monitors, replica
    providers, autoscaler loops, ops, proxy, app, scraper.

    ``health``: black-box health checking of every deployment (``serve`` and ``up`` pass
    ``gateway.health_checks``). ``providers[model]`` builds the replica provider of a deployment whose
    replicas the gateway manages (``up``: local processes); with health on, it also restarts that
    deployment's hung or crashed replicas (``remediate``: the models whose provider does; default: every
    one with a provider). ``autoscalers[model]`` scales such a deployment through it. ``elections[model]``
    builds the deployment's leader elector: then only the elected gateway autoscales and remediates;
    ``demand_shares[model]`` makes its autoscaler read every gateway's demand (through Redis).
    ``observers`` see every request's dispatch, first token and completion (``core.lifecycle``).
    ``pools``: GPU pools whose allocator scales their deployments (their autoscalers only decide).
    """
    gw = cfg.gateway
    rng = rng if rng is not None else random.Random()
    history = SortedOutputHistory()  # one per fleet: a tenant's output lengths, whichever model served them
    hp = headroom_params(cfg.admission.latency_headroom)
    fleet = Fleet(
        (build_deployment(d, history=history, observers=observers, headroom=hp) for d in cfg.deployments),
        tokenizer=PromptTokenizer.with_budget(gw.tokenizer_cache_mb),
    )
    client = UpstreamClient(connect_timeout_s=gw.connect_timeout_s)
    metrics = GatewayMetrics(fleet)
    gate = admission if admission is not None else build_admission(cfg, metrics.registry)
    # best-effort follows the live fleet: health, scaling, the engines' own queues
    gate.use_replica_capacity(lambda m: fleet.deployments[m].snapshots() if m in fleet.deployments else None)
    wire_latency_headroom(gate, fleet, metrics.registry, clock)  # ... and the latency the gateway measures
    images = build_images(cfg)
    # Built in dependency order; ``monitors`` is filled below, before anything runs (the scraper's observer
    # and the providers' change callbacks read it only once the gateway has started).
    monitors: dict[str, HealthMonitor] = {}

    def learner_for(model: str) -> EngineRateLearner | None:
        deployment = fleet.deployments.get(model)
        return None if deployment is None else deployment.rates

    rates = EngineRateListener(learner_for, clock, EngineRateMetrics(metrics.registry))
    scraper = MetricsScraper(
        client,
        interval_s=gw.scrape_interval_s,
        timeout_s=gw.scrape_timeout_s,
        rng=rng,
        observers=[rates, _progress_observer(monitors)] if health else [rates],
    )

    def sync(model: str, infos: Sequence[ReplicaInfo]) -> None:
        """A provider's new replica list -> the deployment, its health monitor and the scrapers."""
        deployment = fleet.get(model)
        sync_deployment(deployment, infos, monitors.get(model))
        scraper.sync(replica for _, replica in fleet.replicas())

    built: dict[str, ReplicaProvider] = {}
    for model, factory in (providers or {}).items():
        deployment = fleet.get(model)

        async def drain(name: str, timeout_s: float, deployment: Deployment = deployment) -> None:
            await drain_replica(deployment, name, timeout_s)

        def changed(infos: Sequence[ReplicaInfo], model: str = model) -> None:
            sync(model, infos)

        built[model] = factory(changed, drain)
    leader_metrics = LeaderMetrics(metrics.registry if elections else None)  # registered only when used
    leaders = {m: f(built[m], leader_metrics) for m, f in (elections or {}).items() if m in built}
    scaled = set(autoscalers or {})
    shares = {m: f(_demand_meter(fleet.get(m))) for m, f in (demand_shares or {}).items() if m in scaled}
    if health:
        remediators: dict[str, Remediator] = {
            m: LeaderOnly(p, leaders[m].is_leader) if m in leaders else p
            for m, p in built.items()
            if remediate is None or m in remediate
        }
        monitors.update(_health_monitors(fleet, metrics.registry, remediators))

    pooled = {m.model for plan in pools for m in plan.members}
    # A pool is led where its first member is: its allocation and its members' autoscaler decisions run on
    # that one gateway (remediation stays with each member's own leader).
    pool_leaders = {
        p.name: leaders[p.members[0].model] for p in pools if p.members and p.members[0].model in leaders
    }
    loop_leaders = dict(leaders)
    for plan in pools:
        if plan.name in pool_leaders:
            loop_leaders.update({m.model: pool_leaders[plan.name] for m in plan.members})
    scale_metrics = AutoscalerMetrics(metrics.registry) if autoscalers else None  # one set for all loops
    lent = LentReplicas()  # a pooled deployment's autoscaler leaves out the replicas lent to it
    loops = {
        model: _autoscaler_loop(
            fleet.get(model),
            built[model],
            autoscaler,
            scale_metrics,
            clock,
            autoscale_interval_s,
            apply=model not in pooled,
            leader=loop_leaders.get(model),
            demand=shares.get(model),
            lent=lent if model in pooled else None,
        )
        for model, autoscaler in (autoscalers or {}).items()
    }
    pool_loops_ = pool_loops(
        pools,
        built,
        {model: functools.partial(_desired, loop) for model, loop in loops.items()},
        functools.partial(admission_sold, gate),
        registry=metrics.registry,
        interval_s=autoscale_interval_s,
        clock=clock,
        leading={name: leader.is_leader for name, leader in pool_leaders.items()},
        used=functools.partial(admission_used, gate),
        lent=lent,
    )
    ops = Ops(cfg.ops, fleet=fleet, admission=gate, clock=clock, autoscalers=loops)
    proxy = Proxy(
        config=gw,
        fleet=fleet,
        client=client,
        metrics=metrics,
        admission=gate,
        rng=rng,
        clock=clock,
        images=images,
        listeners=[_result_observer(monitors)] if health else (),
        slo=ops,  # SLO window + access log
        parser=default_parser(gw, fleet, isolate_tenants=bool(cfg.tenants)),
    )
    app = create_app(
        proxy=proxy,
        fleet=fleet,
        metrics=metrics,
        max_body_bytes=gw.max_body_bytes,
        created=int(wall_clock()),
        models_require_key=gw.models_require_key,
        cors_allowed_origins=gw.cors_allowed_origins,
        metrics_access=metrics_access(cfg, gate),
    )
    if images is not None:
        attach_images(app, images, prestart=cfg.multimodal.prestart, registry=metrics.registry)
    reservations: ReservationBook | None = None
    fleet_ledger: FleetLedger | None = None
    if not isinstance(gate, OpenAdmission):
        from fleetgate.admission.http import add_admin_routes
        from fleetgate.admission.service import AdmissionService

        if isinstance(gate, AdmissionService):
            add_admin_routes(app, gate, pools=pool_loops_)  # /admin/tenants, /admin/usage, /admin/capacity
            reservations = gate.reservations
            fleet_ledger = gate.fleet_ledger
    ops.install(app, metrics.registry)  # SLO gauges, /admin/status, /ui, request ids in log lines
    server = GatewayServer(
        config=gw,
        app=app,
        proxy=proxy,
        fleet=fleet,
        client=client,
        scraper=scraper,
        metrics_app=create_metrics_app(metrics) if gw.metrics_port is not None else None,
    )
    secrets = SecretFiles(cfg, _KeyTargets(gate, fleet))
    if secrets:  # key files (mounted Secrets): read now, then re-read while running
        secrets.refresh(strict=True)
        server.add_loop("secret-files", secrets.run)
    if admission is None:  # built here, owned here: first in, last out (after the loops using its store)
        server.add_service("admission", gate.start, gate.aclose)
    for model, leader in leaders.items():  # before the loops it gates
        server.add_service(f"leader-{model}", leader.start, leader.stop)
    for model, share in shares.items():
        server.add_service(f"demand-{model}", share.start, share.stop)
    if reservations is not None:  # run-time reservations (admin API) from the store, every replica in step
        server.add_service("reservations", reservations.start, reservations.stop)
    if fleet_ledger is not None:  # the capacity ledger's used, summed over every gateway sharing the store
        server.add_service("fleet-ledger", fleet_ledger.start, fleet_ledger.stop)
    for model, monitor in monitors.items():
        server.add_service(f"health-{model}", monitor.start, monitor.stop)
    for model, loop in loops.items():
        server.add_service(f"autoscaler-{model}", loop.start, loop.stop)
    for name, pool in pool_loops_.items():
        server.add_service(f"pool-{name}", pool.start, pool.stop)
    return Gateway(
        config=cfg,
        server=server,
        fleet=fleet,
        proxy=proxy,
        ops=ops,
        admission=gate,
        monitors=monitors,
        providers=built,
        autoscalers=loops,
        pools=pool_loops_,
    )


def _desired(loop: AutoscalerLoop) -> int | None:
    return loop.desired


class _KeyTargets(KeySink):
    """Key-file updates land in the tenant directory and the deployments' upstream headers."""

    def __init__(self, admission: Admission, fleet: Fleet) -> None:
        self._admission = admission
        self._fleet = fleet

    def set_keys(self, tenant: str | None, key_hashes: list[str]) -> None:
        from fleetgate.admission.service import AdmissionService

        if isinstance(self._admission, AdmissionService):
            self._admission.directory.set_keys(tenant, key_hashes)

    def set_upstream_key(self, model: str, key: str) -> None:
        if not key:
            raise ValueError("the file is empty")
        self._fleet.deployments[model].upstream_headers["Authorization"] = f"Bearer {key}"


def _health_monitors(
    fleet: Fleet, registry: CollectorRegistry, remediators: Mapping[str, Remediator]
) -> dict[str, HealthMonitor]:
    """Black-box health checking per deployment (``fleetgate.health.HealthMonitor``).

    Verdicts out: each transition sets the replica's ``health`` (unhealthy replicas leave routing at once);
    deployments in ``remediators`` have their provider restart hung or crashed replicas. Replicas start
    healthy: they were ready when handed to the gateway.
    """
    monitors: dict[str, HealthMonitor] = {}
    families = HealthFamilies(registry)  # one set of series, labelled by deployment
    for model, deployment in fleet.deployments.items():

        def apply(transition: Transition, deployment: Deployment = deployment) -> None:
            replica = deployment.replicas.get(transition.replica)
            if replica is not None:
                replica.health = transition.new

        monitor = HealthMonitor(
            model=deployment.upstream_model,
            dialect=deployment.dialect,
            engine_priority=deployment.sends_priority,
            policy=HealthPolicy(remediate=model in remediators),
            remediator=remediators.get(model),
            initial_state=HealthState.HEALTHY,
            metrics=families.for_deployment(model),
            listeners=[apply],
        )
        monitor.set_replicas({name: r.url for name, r in deployment.replicas.items()})
        monitors[model] = monitor
    return monitors


def _result_observer(monitors: Mapping[str, HealthMonitor]) -> ResultListener:
    """Evidence in from the proxy: every finished request attempt."""

    def on_result(model: str, replica: str, ok: bool, now: float) -> None:
        monitor = monitors.get(model)
        if monitor is not None:
            monitor.observe_request(replica, ok)

    return on_result


def _progress_observer(monitors: Mapping[str, HealthMonitor]) -> ScrapeObserver:
    """Evidence in from the scraper: every scraped generated-token counter."""

    def on_scrape(target: ScrapeTarget, signals: EngineSignals | None) -> None:
        monitor = monitors.get(target.deployment)
        if monitor is not None and signals is not None and signals.generation_tokens is not None:
            monitor.observe_progress(target.name, signals.generation_tokens)

    return on_scrape


def _autoscaler_loop(
    deployment: Deployment,
    provider: ReplicaProvider,
    autoscaler: ReportingAutoscaler,
    metrics: AutoscalerMetrics | None,
    clock: Callable[[], float],
    interval_s: float,
    *,
    apply: bool = True,
    leader: LeaderElector | None = None,
    demand: DemandSource | None = None,
    lent: LentReplicas | None = None,
) -> AutoscalerLoop:
    """Autoscale ``deployment`` through ``provider`` (``fleetgate.autoscaler.AutoscalerLoop``); the
    deployment's lifecycle feeds its ``DemandMeter`` (MU started / settled); ``demand``: read instead (every
    gateway's, ``SharedDemand``); ``lent``: a pooled deployment's counts leave out the replicas lent to it."""
    meter = demand if demand is not None else _demand_meter(deployment)

    def routable(name: str) -> bool:
        replica = deployment.replicas.get(name)
        return replica is not None and replica.snapshot().routable

    counts = provider_counts(provider, routable)
    return AutoscalerLoop(
        deployment=deployment.model,
        autoscaler=autoscaler,
        meter=meter,
        counts=counts if lent is None else lent.counts(deployment.model, counts),
        target=provider,
        capacity_mu_per_min=deployment.profile.capacity_mu_per_min,
        metrics=metrics,
        interval_s=interval_s,
        apply=apply,
        clock=clock,
        leading=None if leader is None else leader.is_leader,
    )


def _demand_meter(deployment: Deployment) -> DemandMeter:
    meter = deployment.lifecycle.demand
    assert meter is not None  # every gateway deployment's lifecycle has one
    return meter


async def drain_replica(deployment: Deployment, name: str, timeout_s: float) -> None:
    """Stop routing to ``name`` and wait (bounded) until its in-flight requests finished."""
    replica = deployment.replicas.get(name)
    if replica is None:
        return
    replica.draining = True
    if replica.inflight_requests == 0:
        return
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    replica.idle_waiters.append(wake)
    try:
        await asyncio.wait_for(done, timeout_s)
    except TimeoutError:
        left = replica.inflight_requests
        log.warning("replica %s still has %d request(s) after draining %.0f s", name, left, timeout_s)


def sync_deployment(
    deployment: Deployment, infos: Sequence[ReplicaInfo], monitor: HealthMonitor | None = None
) -> None:
    """Make the deployment's replicas (and its health monitor's) match a provider's list: add, re-point,
    remove."""
    wanted = {info.name: info for info in infos}
    for name in list(deployment.replicas):
        if name not in wanted:
            deployment.remove_replica(name)
    for info in infos:
        state = deployment.add_replica(info.name, info.url)
        state.draining = False
    if monitor is not None:
        monitor.set_replicas({name: r.url for name, r in deployment.replicas.items()})


# -- process entry points ---------------------------------------------------------------------------------


def _run(main: Coroutine[Any, Any, None]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop

        uvloop.run(main)
    except ImportError:  # pragma: no cover - non-Linux fallback
        asyncio.run(main)


async def _wait_for_signal() -> int:
    loop = asyncio.get_running_loop()
    got: asyncio.Future[int] = loop.create_future()

    def handler(sig: int) -> None:
        if not got.done():
            got.set_result(sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, handler, int(sig))
    try:
        return await got
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _listen(server: GatewayServer, port: int | None) -> str:
    """``server.start``; a port that cannot be bound is a ``ConfigError`` naming ``gateway.port``."""
    try:
        return await server.start(port)
    except OSError as exc:
        gw = server.config
        where = f"{gw.host}:{gw.port if port is None else port}"
        raise ConfigError(f"gateway.port: cannot listen on {where}: {exc.strerror or exc}") from exc


def _print_metrics_address(server: GatewayServer) -> None:
    if server.metrics_port is not None:
        print(
            f"fleetgate metrics on http://{server.config.metrics_host}:{server.metrics_port}/metrics",
            flush=True,
        )


async def serve(cfg: FleetgateConfig, *, port: int | None = None, try_model: str | None = None) -> None:
    """Run the gateway with the control plane its config asks for (``deployments[*].provider``,
    ``autoscaler``, ``remediation``) until SIGTERM/SIGINT, then drain, stop and stop every local replica.

    Deployments with a local provider get their replicas started before the gateway listens; a static
    list is only routed to (its hung replicas leave routing, nothing restarts them).
    """
    cfg = with_local_defaults(cfg)
    plane = control_plane(cfg)
    gateway = build_gateway(
        cfg,
        health=cfg.gateway.health_checks,
        providers=plane.providers,
        autoscalers=plane.autoscalers,
        remediate=plane.remediate,
        pools=plane.pools,
        elections=plane.elections,
        demand_shares=plane.demand_shares,
    )
    started = False
    try:
        for provider in gateway.providers.values():
            if isinstance(provider, KubernetesReplicaProvider):
                await provider.start()  # first list of the EndpointSlices, then the watch runs
        for model, count in plane.initial.items():
            try:
                infos = await gateway.providers[model].scale_to(count)  # each change re-syncs
            except ProviderError as exc:
                where = next(i for i, d in enumerate(cfg.deployments) if d.model == model)
                raise ConfigError(f"deployments.{where}.provider: {exc}") from exc
            for info in infos:
                print(f"replica {info.name} {info.url}", flush=True)
        _freeze_startup_heap()
        url = await _listen(gateway.server, port)
        started = True
        print(f"fleetgate ready on {url}", flush=True)
        _print_metrics_address(gateway.server)
        if try_model is not None:
            print(
                f"try: curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' "
                f'-d \'{{"model": "{try_model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}\'',
                flush=True,
            )
        sig = await _wait_for_signal()
        log.info("signal %d: draining (grace %.0f s)", sig, cfg.gateway.shutdown_grace_s)
    finally:
        if started:
            await gateway.stop()
        for provider in gateway.providers.values():
            if isinstance(provider, LocalProcessProvider):
                await provider.stop_all()
            elif isinstance(provider, KubernetesReplicaProvider):
                await provider.stop()  # the pods stay: the Deployment owns them


def _freeze_startup_heap() -> None:
    """Garbage collection for a long-running gateway (docs/benchmarks.md, "Session 5").

    What start-up built (modules, config, app, tables: ~110k objects) is frozen out of the collector's sight
    (``gc.freeze``): the in-flight requests' objects triggered a full collection every ~1,500 streamed
    requests, and each walked all of it (about as much CPU as the rest of the request path added by the
    architecture step). And the youngest generation is collected after 10,000 net allocations instead of
    700: 32 streams in flight already hold ~800 tracked objects, so at 700 every dozen requests paid a
    collection that found next to nothing (reference counting frees a request's objects). Nothing frozen is
    ever freed, but it lives as long as the process; cyclic garbage waits a little longer.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def run_serve(cfg: FleetgateConfig) -> None:
    """``fleetgate serve``."""
    from fleetgate.ops.logging import setup_logging

    setup_logging(cfg.ops.log_level, cfg.ops.log_format)
    _run(serve(cfg))


async def up(cfg: FleetgateConfig, *, replicas: int | None, port: int, model: str) -> None:
    """The embedded default: ``serve`` with ``model`` on local (simulated, by default) replicas."""
    await serve(up_config(cfg, model, replicas), port=port, try_model=model)


def run_up(
    cfg: FleetgateConfig, *, replicas: int | None = None, port: int = 8080, model: str = "fleetgate-sim"
) -> None:
    """``fleetgate up``."""
    from fleetgate.ops.logging import setup_logging

    setup_logging(cfg.ops.log_level, cfg.ops.log_format)
    try:
        _run(up(cfg, replicas=replicas, port=port, model=model))
    except KeyboardInterrupt:  # pragma: no cover - a second Ctrl-C during shutdown
        sys.exit(130)
