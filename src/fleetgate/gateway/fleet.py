"""Live state of deployments and replicas as the gateway sees them.

``ReplicaState`` is the mutable record behind each ``ReplicaSnapshot``: the gateway's own in-flight counters
(changed at dispatch and completion, so the router never reads stale load), the scraper's engine signals and
the prober's health verdict. Control loops (scraper, prober, autoscaler) write here; the router reads frozen
snapshots. Everything runs on one event loop, so no locks are needed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetgate.config import DeploymentConfig
from fleetgate.core.admission.headroom import HeadroomParams, LatencyHeadroom
from fleetgate.core.autoscale import DemandMeter
from fleetgate.core.engine_rates import LearnedRates, engine_rate_learner
from fleetgate.core.errors import NotFoundError
from fleetgate.core.lifecycle import Lifecycle, LifecycleObserver, ReplicaLoad, SortedOutputHistory
from fleetgate.core.routing.base import RoutingPolicy
from fleetgate.core.routing.registry import build_policy
from fleetgate.core.tokenize import PromptTokenizer
from fleetgate.core.tokenizer import Tokenizer
from fleetgate.core.types import HealthState, RandomSource, ReplicaSnapshot, RequestInfo, RouteDecision
from fleetgate.core.units import CostProfile
from fleetgate.engines.dialects import EngineKind, dialect
from fleetgate.engines.metrics import EngineSignals
from fleetgate.hf_tokenizer import load_tokenizer
from fleetgate.profiles import deployment_profile

log = logging.getLogger("fleetgate.gateway")

#: Prefix-block size of the gateway's hashes (tokens or approximate pieces) unless the engine's is known.
DEFAULT_BLOCK_TOKENS = 16


@dataclass(slots=True)
class ReplicaState(ReplicaLoad):
    """One replica: identity, gateway-side load (``ReplicaLoad``, kept by the deployment's lifecycle),
    engine-side load, health."""

    name: str
    url: str
    deployment: str = ""
    capacity_mu_per_min: float = 100.0
    health: HealthState = HealthState.HEALTHY
    draining: bool = False
    engine: EngineSignals | None = None
    engine_prefix_hit_rate: float | None = None
    last_scrape_ok: bool | None = None
    ejected_until_s: float = 0.0
    idle_waiters: list[Callable[[], None]] = field(default_factory=list)

    def snapshot(self, learned: LearnedRates | None = None) -> ReplicaSnapshot:
        """The router's view; ``learned``: the deployment's online estimate of this replica's rates."""
        engine = self.engine
        return ReplicaSnapshot.of(
            self.name,
            self.url,
            self.health,
            self.draining,
            self.inflight_requests,
            self.inflight_mu,
            self.capacity_mu_per_min,
            None if engine is None or engine.waiting is None else int(engine.waiting),
            None if engine is None or engine.running is None else int(engine.running),
            None if engine is None else engine.kv_usage,
            self.engine_prefix_hit_rate,
            self.consecutive_failures,
            self.ejected_until_s,
            None if learned is None else learned.prefill_tokens_per_s,
            None if learned is None else learned.decode_s_per_token,
        )

    def end(self, cost_mu: float, ok: bool, now: float) -> None:
        """``ReplicaLoad.end``, then wake whoever waits for the replica to go idle (draining)."""
        ReplicaLoad.end(self, cost_mu, ok, now)
        if self.inflight_requests == 0 and self.idle_waiters:
            waiters, self.idle_waiters = self.idle_waiters, []
            for wake in waiters:
                wake()


def engine_kind(config: DeploymentConfig) -> EngineKind | None:
    """`engine`, else `sim` for the local provider's default (simulated) engine; None: unknown."""
    if config.engine is None and config.provider.kind == "local" and config.provider.command is None:
        return "sim"
    return config.engine


def sends_priority(config: DeploymentConfig) -> bool:
    """Whether requests carry the tenant's class in `priority`: `engine_priority`, and where it is unset
    the dialect's default (on where the engine honours it without a launch flag)."""
    prio = dialect(engine_kind(config)).priority
    if prio is None:
        return False
    return config.engine_priority if config.engine_priority is not None else not prio.needs_flag


class Deployment:
    """A model served by a set of replicas, with its routing policy, cost profile and request lifecycle.

    ``lifecycle`` (``core.lifecycle.Lifecycle``) keeps the replicas' in-flight counters, the estimate's output
    history (``history``, shared by the fleet's deployments when given), the autoscaler's demand meter, the
    dispatch gate and the policy hooks; ``observers`` see every dispatch, first token and completion.
    """

    def __init__(
        self,
        config: DeploymentConfig,
        policy: RoutingPolicy,
        profile: CostProfile,
        *,
        history: SortedOutputHistory | None = None,
        observers: Sequence[LifecycleObserver] = (),
        tokenizer: Tokenizer | None = None,
        headroom: HeadroomParams | None = None,
    ) -> None:
        self.config = config
        #: the model's real tokenizer (``deployments[].tokenizer``), else the approximation is used; prefix
        #: blocks then follow the engine's KV block size where the dialect knows it
        self.tokenizer = tokenizer
        #: the replicas' engine dialect, and whether requests carry the tenant's class to it
        self.dialect = dialect(engine_kind(config))
        self.sends_priority = sends_priority(config)
        kv_block = self.dialect.kv_block_tokens
        self.block_tokens = kv_block if tokenizer is not None and kv_block else DEFAULT_BLOCK_TOKENS
        self.model = config.model
        self.upstream_model = config.upstream_model or config.model
        self.upstream_headers: dict[str, str] = {"Content-Type": "application/json"}
        if config.upstream_api_key:
            self.upstream_headers["Authorization"] = f"Bearer {config.upstream_api_key}"
        self.policy = policy
        self.profile = profile
        #: each replica's prefill and decode rates learned online (a lifecycle observer; scraper counters)
        self.rates = engine_rate_learner(profile, busy=policy.learns_rates_busy)
        #: reserved and best-effort latency measured here, and the best-effort limit it allows (admission)
        self.headroom = LatencyHeadroom(headroom)
        self.replicas: dict[str, ReplicaState] = {}
        self.lifecycle: Lifecycle[Any] = Lifecycle(
            policy,
            profile,
            snapshots=self.snapshots,
            history=history,
            demand=DemandMeter(window_s=config.demand_window_s),
            observers=(*observers, self.rates, self.headroom),
        )
        #: ``gateway.gate.GateShell`` driving the lifecycle's dispatch gate (made by the proxy on first use)
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
                capacity_mu_per_min=self.profile.capacity_mu_per_min,
            )
            self.replicas[name] = state
        else:
            state.url = url.rstrip("/")
        return state

    def remove_replica(self, name: str) -> ReplicaState | None:
        """Forget a replica (in-flight requests to it finish; they hold their own reference)."""
        self.rates.forget_replica(name)
        return self.replicas.pop(name, None)

    def snapshots(self) -> list[ReplicaSnapshot]:
        learned = self.rates.current
        return [r.snapshot(learned.get(r.name)) for r in self.replicas.values()]

    def pick(
        self, request: RequestInfo, now: float, rng: RandomSource, exclude: frozenset[str]
    ) -> RouteDecision:
        return self.policy.pick(request, self.snapshots(), now, rng, exclude)

    def routable(self) -> bool:
        return any(r.snapshot().routable for r in self.replicas.values())


def build_deployment(
    config: DeploymentConfig,
    *,
    history: SortedOutputHistory | None = None,
    observers: Sequence[LifecycleObserver] = (),
    headroom: HeadroomParams | None = None,
) -> Deployment:
    """A deployment with its cost profile loaded and its routing policy built by name, estimating with that
    profile (``history`` and ``observers``: see ``Deployment``)."""
    profile = deployment_profile(config)  # capacity_mu_per_min, else the profile's own
    policy = build_policy(config.routing.policy, config.routing.params, profile=profile)
    tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer else None
    return Deployment(
        config, policy, profile, history=history, observers=observers, tokenizer=tokenizer, headroom=headroom
    )


class Fleet:
    """All deployments by model name (each with its request lifecycle), and the prompt tokenizer of the
    approximation (its caches are the fleet's, sized from config)."""

    def __init__(
        self, deployments: Iterable[Deployment] = (), *, tokenizer: PromptTokenizer | None = None
    ) -> None:
        self.deployments: dict[str, Deployment] = {d.model: d for d in deployments}
        self.prompt_tokenizer = tokenizer if tokenizer is not None else PromptTokenizer()

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
