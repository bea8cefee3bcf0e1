"""Live state of deployments and replicas as the gateway sees them.

``ReplicaState`` is the mutable record behind each ``ReplicaSnapshot``: the gateway's own in-flight counters
(changed at dispatch and completion, so the router never reads stale load), the scraper's engine signals and
the prober's health verdict. Control loops (scraper, prober, autoscaler) write here; the router reads frozen
snapshots. Everything runs on one event loop, so no locks are needed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fleetgate.config import DeploymentConfig
from fleetgate.core.errors import NotFoundError
from fleetgate.core.routing.base import RoutingPolicy
from fleetgate.core.routing.registry import build_policy
from fleetgate.core.types import HealthState, RandomSource, ReplicaSnapshot, RequestInfo, RouteDecision
from fleetgate.core.units import CostProfile, OutputHistory, load_profile
from fleetgate.engines.metrics import EngineSignals

log = logging.getLogger("fleetgate.gateway")


@dataclass(slots=True)
class ReplicaState:
    """One replica: identity, gateway-side load, engine-side load, health."""

    name: str
    url: str
    deployment: str = ""
    capacity_mu_per_min: float = 100.0
    health: HealthState = HealthState.HEALTHY
    draining: bool = False
    inflight_requests: int = 0
    inflight_mu: float = 0.0
    engine: EngineSignals | None = None
    engine_prefix_hit_rate: float | None = None
    last_scrape_ok: bool | None = None
    consecutive_failures: int = 0
    ejected_until_s: float = 0.0
    completed: int = 0
    failed: int = 0
    last_success_s: float | None = None
    idle_waiters: list[Callable[[], None]] = field(default_factory=list)

    def snapshot(self) -> ReplicaSnapshot:
        engine = self.engine
        return ReplicaSnapshot(
            name=self.name,
            url=self.url,
            health=self.health,
            draining=self.draining,
            inflight_requests=self.inflight_requests,
            inflight_mu=self.inflight_mu,
            capacity_mu_per_min=self.capacity_mu_per_min,
            engine_waiting=None if engine is None or engine.waiting is None else int(engine.waiting),
            engine_running=None if engine is None or engine.running is None else int(engine.running),
            engine_kv_usage=None if engine is None else engine.kv_usage,
            engine_prefix_hit_rate=self.engine_prefix_hit_rate,
            consecutive_failures=self.consecutive_failures,
            ejected_until_s=self.ejected_until_s,
        )

    def begin(self, cost_mu: float) -> None:
        self.inflight_requests += 1
        self.inflight_mu += cost_mu

    def end(self, cost_mu: float, ok: bool, now: float) -> None:
        self.inflight_requests -= 1
        self.inflight_mu = max(self.inflight_mu - cost_mu, 0.0) if self.inflight_requests else 0.0
        if ok:
            self.completed += 1
            self.consecutive_failures = 0
            self.last_success_s = now
        else:
            self.failed += 1
            self.consecutive_failures += 1
        if self.inflight_requests == 0 and self.idle_waiters:
            waiters, self.idle_waiters = self.idle_waiters, []
            for wake in waiters:
                wake()


class Deployment:
    """A model served by a set of replicas, with its routing policy and cost profile."""

    def __init__(self, config: DeploymentConfig, policy: RoutingPolicy, profile: CostProfile) -> None:
        self.config = config
        self.model = config.model
        self.upstream_model = config.upstream_model or config.model
        self.upstream_headers: dict[str, str] = {"Content-Type": "application/json"}
        if config.upstream_api_key:
            self.upstream_headers["Authorization"] = f"Bearer {config.upstream_api_key}"
        self.policy = policy
        self.profile = profile
        self.replicas: dict[str, ReplicaState] = {}
        #: ``gateway.gate.GateShell`` driving the policy's dispatch gate (made by the proxy on first use)
        self.gate_shell: Any = None
        for replica in config.replicas:
            self.add_replica(replica.name, replica.url)

    def add_replica(self, name: str, url: str) -> ReplicaState:
        """Add (or re-point) a replica; it becomes routable at once unless its health says otherwise."""
        state = self.replicas.get(name)
        if state is None:
            state = ReplicaState(
                name=name,
                url=url.rstrip("/"),
                deployment=self.model,
                capacity_mu_per_min=self.config.capacity_mu_per_min,
            )
            self.replicas[name] = state
        else:
            state.url = url.rstrip("/")
        return state

    def remove_replica(self, name: str) -> ReplicaState | None:
        """Forget a replica (in-flight requests to it finish; they hold their own reference)."""
        return self.replicas.pop(name, None)

    def snapshots(self) -> list[ReplicaSnapshot]:
        return [r.snapshot() for r in self.replicas.values()]

    def pick(
        self, request: RequestInfo, now: float, rng: RandomSource, exclude: frozenset[str]
    ) -> RouteDecision:
        return self.policy.pick(request, self.snapshots(), now, rng, exclude)

    def routable(self) -> bool:
        return any(r.snapshot().routable for r in self.replicas.values())


def build_deployment(config: DeploymentConfig) -> Deployment:
    """A deployment with its routing policy built by name and its cost profile loaded."""
    try:
        policy = build_policy(config.routing.policy, config.routing.params)
    except ImportError as exc:  # a policy module not delivered yet: keep serving with round robin
        log.warning("routing policy %r unavailable (%s); using round_robin", config.routing.policy, exc)
        policy = build_policy("round_robin")
    profile = load_profile(config.cost_profile)
    if profile.capacity_mu_per_min != config.capacity_mu_per_min:
        profile = profile.with_capacity(config.capacity_mu_per_min)
    return Deployment(config, policy, profile)


class Fleet:
    """All deployments by model name, plus per-tenant output history for cost estimates."""

    def __init__(self, deployments: Iterable[Deployment] = ()) -> None:
        self.deployments: dict[str, Deployment] = {d.model: d for d in deployments}
        self.output_history = OutputHistory()
        self._p90: dict[str, tuple[float | None, int]] = {}  # tenant -> (p90, observations when computed)
        self._observed: dict[str, int] = {}

    def observe_output(self, tenant: str, output_tokens: int) -> None:
        """Record a finished request's output length (feeds future cost estimates)."""
        self.output_history.observe(tenant, output_tokens)
        self._observed[tenant] = self._observed.get(tenant, 0) + 1

    def output_p90(self, tenant: str, refresh_every: int = 16) -> float | None:
        """The tenant's recent output p90, recomputed every ``refresh_every`` observations (it sorts)."""
        seen = self._observed.get(tenant, 0)
        cached = self._p90.get(tenant)
        if cached is not None and seen - cached[1] < refresh_every:
            return cached[0]
        value = self.output_history.p90(tenant)
        self._p90[tenant] = (value, seen)
        return value

    def get(self, model: str) -> Deployment:
        deployment = self.deployments.get(model)
        if deployment is None:
            raise NotFoundError(f"The model `{model}` does not exist.", param="model")
        return deployment

    def add(self, deployment: Deployment) -> None:
        self.deployments[deployment.model] = deployment

    def replicas(self) -> Iterator[tuple[Deployment, ReplicaState]]:
        for deployment in self.deployments.values():
            for replica in deployment.replicas.values():
                yield deployment, replica

    def inflight(self) -> int:
        return sum(r.inflight_requests for _, r in self.replicas())
