"""Composition root: builds every live object from the config and runs their lifecycles.

Nothing else in the package constructs long-lived objects from config or touches process signals: tests and
the CLI both come through here (``build_gateway`` for an in-process gateway, ``serve``/``up`` for whole
processes). No singletons: each call builds a fresh, independent set of objects.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from fleetgate.config import ConfigError, DeploymentConfig, FleetgateConfig, ReplicaConfig
from fleetgate.core.engine_rates import EngineRateLearner
from fleetgate.core.lifecycle import LifecycleObserver, SortedOutputHistory
from fleetgate.core.types import RandomSource
from fleetgate.engines.client import UpstreamClient
from fleetgate.engines.dialects import dialect
from fleetgate.engines.metrics import EngineSignals
from fleetgate.engines.scraper import MetricsScraper
from fleetgate.gateway.admission import Admission, OpenAdmission
from fleetgate.gateway.app import create_app
from fleetgate.gateway.engine_rates import EngineRateListener, EngineRateMetrics
from fleetgate.gateway.fleet import Deployment, Fleet, build_deployment
from fleetgate.gateway.metrics import GatewayMetrics
from fleetgate.gateway.proxy import Proxy
from fleetgate.gateway.secrets import KeySink, SecretFiles
from fleetgate.gateway.server import GatewayServer
from fleetgate.providers.base import ReplicaInfo
from fleetgate.providers.local import LocalProcessProvider, sim_engine_command

if TYPE_CHECKING:
    from aiohttp import web

    from fleetgate.multimodal.pipeline import ImagePipeline

log = logging.getLogger("fleetgate")

#: cost profile of ``fleetgate up``'s simulated replicas (src/fleetgate/profiles/fleetgate-sim.json)
SIM_COST_PROFILE = "fleetgate-sim"


def build_admission(cfg: FleetgateConfig, registry: CollectorRegistry | None = None) -> Admission:
    """Tenant admission (``fleetgate.admission``) when tenants or admin keys are configured, else open."""
    adm = cfg.admission
    if not cfg.tenants and not adm.admin_api_keys and not adm.admin_api_keys_file:
        return OpenAdmission()
    from fleetgate.admission.service import AdmissionService

    return AdmissionService.from_config(cfg, registry=registry)


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


def build_gateway(
    cfg: FleetgateConfig,
    *,
    admission: Admission | None = None,
    rng: RandomSource | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    observers: Sequence[LifecycleObserver] = (),
) -> GatewayServer:
    """Every gateway object, wired: fleet, upstream client, metrics, admission, proxy, app, scraper.
    ``observers`` see every request's dispatch, first token and completion (``core.lifecycle``)."""
    gw = cfg.gateway
    rng = rng if rng is not None else random.Random()
    history = SortedOutputHistory()  # one per fleet: a tenant's output lengths, whichever model served them
    fleet = Fleet(build_deployment(d, history=history, observers=observers) for d in cfg.deployments)
    client = UpstreamClient(connect_timeout_s=gw.connect_timeout_s)
    metrics = GatewayMetrics(fleet)
    gate = admission if admission is not None else build_admission(cfg, metrics.registry)
    use_live = getattr(gate, "use_replica_capacity", None)
    if callable(use_live):  # best-effort follows the live fleet: health, scaling, the engines' own queues
        use_live(lambda m: fleet.deployments[m].snapshots() if m in fleet.deployments else None)
    images = build_images(cfg)
    proxy = Proxy(
        config=gw,
        fleet=fleet,
        client=client,
        metrics=metrics,
        admission=gate,
        rng=rng,
        clock=clock,
        images=images,
    )
    app = create_app(
        proxy=proxy,
        fleet=fleet,
        metrics=metrics,
        max_body_bytes=gw.max_body_bytes,
        created=int(wall_clock()),
        models_require_key=gw.models_require_key,
        cors_allowed_origins=gw.cors_allowed_origins,
    )
    if images is not None:
        attach_images(app, images, prestart=cfg.multimodal.prestart, registry=metrics.registry)
    if not isinstance(gate, OpenAdmission):
        from fleetgate.admission.http import add_admin_routes
        from fleetgate.admission.service import AdmissionService

        if isinstance(gate, AdmissionService):
            add_admin_routes(app, gate)  # /admin/tenants, /admin/usage, /admin/capacity
    scraper = MetricsScraper(client, interval_s=gw.scrape_interval_s, timeout_s=gw.scrape_timeout_s, rng=rng)

    def learner_for(model: str) -> EngineRateLearner | None:
        deployment = fleet.deployments.get(model)
        return None if deployment is None else deployment.rates

    scraper.add_listener(EngineRateListener(learner_for, clock, EngineRateMetrics(metrics.registry)))
    server = GatewayServer(config=gw, app=app, proxy=proxy, fleet=fleet, client=client, scraper=scraper)
    secrets = SecretFiles(cfg, _KeyTargets(gate, fleet))
    if secrets:  # key files (mounted Secrets): read now, then re-read while running
        secrets.refresh(strict=True)
        server.add_loop("secret-files", secrets.run)
    from fleetgate.ops.web import attach_ops

    attach_ops(server, cfg.ops)  # SLO window + gauges, /admin/status, /ui, request ids in log lines
    return server


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


def attach_health(server: GatewayServer, remediators: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Black-box health checking per deployment (``fleetgate.health.HealthMonitor``), wired both ways.

    Evidence in: every finished request (proxy listener) and every scraped generated-token counter.
    Verdicts out: each transition sets the replica's ``health`` (unhealthy replicas leave routing at once)
    and, where ``remediators[model]`` is given (a replica provider), restarts the replica. Replicas start
    healthy: they were ready when handed to the gateway.
    """
    from fleetgate.core.health import HealthPolicy
    from fleetgate.core.types import HealthState
    from fleetgate.health.monitor import HealthMonitor

    monitors: dict[str, HealthMonitor] = {}
    families = _HealthFamilies(server.proxy.metrics.registry)  # one set of series, labelled by deployment
    for model, deployment in server.fleet.deployments.items():
        remediator = (remediators or {}).get(model)
        monitor = HealthMonitor(
            model=deployment.upstream_model,
            dialect=dialect(deployment.config.engine),
            engine_priority=deployment.config.engine_priority,
            policy=HealthPolicy(remediate=remediator is not None),
            remediator=remediator,
            initial_state=HealthState.HEALTHY,
            metrics=families.for_deployment(model),
        )
        monitor.set_replicas({name: r.url for name, r in deployment.replicas.items()})

        def apply(transition: Any, deployment: Deployment = deployment) -> None:
            replica = deployment.replicas.get(transition.replica)
            if replica is not None:
                replica.health = transition.new

        monitor.add_listener(apply)
        monitors[model] = monitor
        server.add_service(f"health-{model}", monitor.start, monitor.stop)

    def on_result(model: str, replica: str, ok: bool, now: float) -> None:
        monitor = monitors.get(model)
        if monitor is not None:
            monitor.observe_request(replica, ok)

    def on_scrape(target: Any, signals: EngineSignals | None) -> None:
        monitor = monitors.get(getattr(target, "deployment", ""))
        if monitor is not None and signals is not None and signals.generation_tokens is not None:
            monitor.observe_progress(target.name, signals.generation_tokens)

    server.proxy.listeners.append(on_result)
    if server.scraper is not None:
        server.scraper.add_listener(on_scrape)
    server.extras["health"] = monitors
    return monitors


class _DeploymentLabelled:
    """A metric family seen with its ``deployment`` label already set (``labels``/``remove`` as usual)."""

    def __init__(self, family: Any, deployment: str) -> None:
        self._family = family
        self._deployment = deployment

    def labels(self, *values: str, **labels: str) -> Any:
        if values:
            return self._family.labels(self._deployment, *values)
        return self._family.labels(deployment=self._deployment, **labels)

    def remove(self, *values: str) -> None:
        self._family.remove(self._deployment, *values)


class _HealthFamilies:
    """The health series (``fleetgate.health.monitor.HealthMetrics``) with a leading ``deployment`` label,
    shared by the monitors of all deployments (replica names may repeat across deployments)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        from fleetgate.health.monitor import _PROBE_BUCKETS

        self.probe_latency = Histogram(
            "fleetgate_health_probe_latency_seconds",
            "Latency of health probes (a 1-token request), by outcome.",
            ["deployment", "replica", "outcome"],
            buckets=_PROBE_BUCKETS,
            registry=registry,
        )
        self.transitions = Counter(
            "fleetgate_health_transitions_total",
            "Replica health state transitions, by reason kind.",
            ["deployment", "replica", "from_state", "to_state", "reason"],
            registry=registry,
        )
        self.remediations = Counter(
            "fleetgate_health_remediations_total",
            "Remediations (restarts / pod deletions) started, by reason kind and result.",
            ["deployment", "replica", "action", "reason", "result"],
            registry=registry,
        )
        self.state = Gauge(
            "fleetgate_health_state",
            "1 for the replica's current health state, 0 for the others.",
            ["deployment", "replica", "state"],
            registry=registry,
        )

    def for_deployment(self, deployment: str) -> Any:
        from fleetgate.health.monitor import HealthMetrics

        view = HealthMetrics.__new__(HealthMetrics)  # its methods, these series
        view.probe_latency = _DeploymentLabelled(self.probe_latency, deployment)  # type: ignore[assignment]
        view.transitions = _DeploymentLabelled(self.transitions, deployment)  # type: ignore[assignment]
        view.remediations = _DeploymentLabelled(self.remediations, deployment)  # type: ignore[assignment]
        view.state = _DeploymentLabelled(self.state, deployment)  # type: ignore[assignment]
        return view


def attach_autoscaler(
    server: GatewayServer, model: str, provider: Any, autoscaler: Any, *, interval_s: float = 1.0
) -> Any:
    """Autoscale ``model`` through ``provider`` (``fleetgate.autoscaler.AutoscalerLoop``): the deployment's
    lifecycle feeds the loop its ``DemandMeter`` (MU started / settled); ``autoscaler`` comes from
    ``core.autoscale.build_autoscaler(name, params)``. Returns the loop."""
    from fleetgate.autoscaler import AutoscalerLoop, provider_counts

    deployment = server.fleet.get(model)
    meter = deployment.lifecycle.demand  # started and settled by the deployment's request lifecycle
    assert meter is not None

    def routable(name: str) -> bool:
        replica = deployment.replicas.get(name)
        return replica is not None and replica.snapshot().routable

    loop = AutoscalerLoop(
        deployment=model,
        autoscaler=autoscaler,
        meter=meter,
        counts=provider_counts(provider, routable),
        target=provider,
        capacity_mu_per_min=deployment.config.capacity_mu_per_min,
        registry=server.proxy.metrics.registry,
        interval_s=interval_s,
        clock=server.proxy.clock,
    )
    server.add_service(f"autoscaler-{model}", loop.start, loop.stop)
    server.extras.setdefault("autoscalers", {})[model] = loop
    return loop


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


def sync_deployment(server: GatewayServer, deployment: Deployment, infos: Sequence[ReplicaInfo]) -> None:
    """Make the deployment's replicas match a provider's list (add, re-point, remove), then the scrapers."""
    wanted = {info.name: info for info in infos}
    for name in list(deployment.replicas):
        if name not in wanted:
            deployment.remove_replica(name)
    for info in infos:
        state = deployment.add_replica(info.name, info.url)
        state.draining = False
    monitor = server.extras.get("health", {}).get(deployment.model)
    if monitor is not None:
        monitor.set_replicas({name: r.url for name, r in deployment.replicas.items()})
    server.sync_replicas()


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


async def serve(cfg: FleetgateConfig) -> None:
    """Run the gateway until SIGTERM/SIGINT, then drain and stop."""
    server = build_gateway(cfg)
    if cfg.gateway.health_checks:
        attach_health(server)  # static replicas: detection and routing only, no restarts
    url = await _listen(server, None)
    print(f"fleetgate ready on {url}", flush=True)
    sig = await _wait_for_signal()
    log.info("signal %d: draining (grace %.0f s)", sig, cfg.gateway.shutdown_grace_s)
    await server.stop()


def run_serve(cfg: FleetgateConfig) -> None:
    """``fleetgate serve``."""
    from fleetgate.ops.logging import setup_logging

    setup_logging(cfg.ops.log_level, cfg.ops.log_format)
    _run(serve(cfg))


def _up_config(cfg: FleetgateConfig, model: str, infos: Sequence[ReplicaInfo]) -> FleetgateConfig:
    """The config with ``model``'s deployment served by the local replicas (its other settings kept)."""
    replicas = [ReplicaConfig(name=i.name, url=i.url) for i in infos]
    update: dict[str, Any] = {"replicas": replicas}
    existing = cfg.deployment(model)
    if cfg.local.command is None and (existing is None or existing.cost_profile is None):
        update["cost_profile"] = SIM_COST_PROFILE  # fitted to the simulated engine's default perf model
    if cfg.local.command is None and (existing is None or existing.engine is None):
        update["engine"] = "sim"  # its dialect: vLLM's metric names, always takes a priority
    if existing is not None:
        deployment = existing.model_copy(update=update)
    else:
        deployment = DeploymentConfig(model=model, **update)
    others = [d for d in cfg.deployments if d.model != model]
    return cfg.model_copy(update={"deployments": [*others, deployment]})


async def up(cfg: FleetgateConfig, *, replicas: int, port: int, model: str) -> None:
    """The embedded default: ``replicas`` local simulated engines plus the gateway, until a signal."""
    local = cfg.local
    command = local.command if local.command is not None else sim_engine_command(local.engine_args)
    holder: dict[str, Any] = {}

    async def drain_hook(name: str, timeout_s: float) -> None:
        if "deployment" in holder:
            await drain_replica(holder["deployment"], name, timeout_s)

    def on_change(infos: Sequence[ReplicaInfo]) -> None:
        if "server" in holder:
            sync_deployment(holder["server"], holder["deployment"], infos)

    provider = LocalProcessProvider(
        model=model,
        command=command,
        url_from_output=local.command is None,
        ready_timeout_s=local.ready_timeout_s,
        stop_timeout_s=local.stop_timeout_s,
        on_change=on_change,
        drain_hook=drain_hook,
    )
    server: GatewayServer | None = None
    try:
        infos = await provider.scale_to(replicas)
        for info in infos:
            print(f"replica {info.name} {info.url}", flush=True)
        full = _up_config(cfg, model, infos)
        server = build_gateway(full)
        holder.update(server=server, deployment=server.fleet.get(model), provider=provider)
        if full.gateway.health_checks:
            attach_health(server, {model: provider})  # local replicas: hung or crashed ones are restarted
        if local.autoscaler is not None:
            from fleetgate.core.autoscale import autoscaler_from

            attach_autoscaler(server, model, provider, autoscaler_from(local.autoscaler))
        url = await _listen(server, port)
        print(f"fleetgate ready on {url}", flush=True)
        print(
            f"try: curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' "
            f'-d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}\'',
            flush=True,
        )
        sig = await _wait_for_signal()
        log.info("signal %d: stopping gateway and %d replica(s)", sig, len(infos))
    finally:
        if server is not None:
            await server.stop()
        await provider.stop_all()


def run_up(
    cfg: FleetgateConfig, *, replicas: int = 2, port: int = 8080, model: str = "fleetgate-sim"
) -> None:
    """``fleetgate up``."""
    from fleetgate.ops.logging import setup_logging

    setup_logging(cfg.ops.log_level, cfg.ops.log_format)
    try:
        _run(up(cfg, replicas=replicas, port=port, model=model))
    except KeyboardInterrupt:  # pragma: no cover - a second Ctrl-C during shutdown
        sys.exit(130)
