"""Routing policies by name: the same names in the gateway, the simulator and the CLI.

``POLICIES`` maps a policy name to (factory, Params); ``POLICY_NAMES`` is its list of names, and config
validates ``routing`` through a discriminated union on ``policy`` built from it (``fleetgate.config``), so a
name or parameter that does not exist fails at start-up with the field's path, not silently.
``build_policy(name, params, profile=...)`` returns a fresh policy object (policies keep state: never share
one between deployments); ``profile`` is the deployment's cost profile (loaded outside core). Every policy
has an ``outlier`` block (``{"enabled": false}`` turns ejection off). The parts policies are made of
(filters, scorers, pickers) are registered in ``core.routing.parts``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator, model_validator

from fleetgate.core.plugins import PluginParams, Registry
from fleetgate.core.routing.base import RoutingPolicy
from fleetgate.core.routing.cache_aware import CacheAwarePolicy
from fleetgate.core.routing.fleetgate import FleetgateParams, FleetgatePolicy
from fleetgate.core.routing.outlier import OutlierParams
from fleetgate.core.routing.parts import (
    FILTERS,
    PICKERS,
    SCORERS,
    PartContext,
    ScorerSpec,
    build_scorers,
    scorer_list,
)
from fleetgate.core.routing.pickers.max_score import TieBreak
from fleetgate.core.routing.pipeline import PipelinePolicy, Scorer
from fleetgate.core.units import DEFAULT_PROFILE, CostProfile


class _PolicyParams(PluginParams):
    outlier: OutlierParams = Field(default_factory=OutlierParams, description="Outlier ejection.")


class RandomPolicyParams(_PolicyParams):
    """Uniform random choice among routable replicas."""


class RoundRobinPolicyParams(_PolicyParams):
    """Round robin over routable replicas in stable name order."""


class _ScoredParams(_PolicyParams):
    scorers: list[ScorerSpec] = Field(
        default_factory=list,
        description="Weighted scorers (`[{type: kv_usage, weight: 1}]`, or the short form "
        "`{kv_usage: 1, queue_length: 1}`); empty: the policy's default scorer.",
    )

    _short_form = field_validator("scorers", mode="before")(scorer_list)

    @model_validator(mode="after")
    def _some_weight(self) -> _ScoredParams:
        if self.scorers and not any(s.weight > 0 for s in self.scorers):
            raise ValueError("at least one scorer needs a positive weight")
        return self


class LeastRequestsParams(_ScoredParams):
    """Highest weighted score among routable replicas (default scorer: `inflight_requests`)."""

    tie_break: TieBreak = Field(default="random", description="Ties: `random` (seeded) or `first` (stable).")


class P2cParams(_ScoredParams):
    """Power of `choices` choices: the best-scoring of a random sample (default scorer: `queue_length`)."""

    choices: int = Field(default=2, ge=1, description="Replicas sampled per request.")


class CacheAwareParams(_PolicyParams):
    """SGLang-router-style cache-aware routing (`core.routing.cache_aware`), with its launch defaults."""

    cache_threshold: float = Field(default=0.3, ge=0, le=1, description="Match ratio that routes by cache.")
    balance_abs_threshold: int = Field(default=64, ge=0, description="Imbalance: max - min in-flight above.")
    balance_rel_threshold: float = Field(default=1.5, ge=1, description="Imbalance: and max above x min.")
    eviction_interval_s: float = Field(default=60.0, description="Seconds between tree trims.")
    max_tree_size: int = Field(default=2**26, description="Tree size after a trim (characters).")


POLICIES: Registry[RoutingPolicy] = Registry("routing policy")


def _pipeline(
    name: str,
    params: _PolicyParams,
    profile: CostProfile,
    filters: list[tuple[str, Mapping[str, Any]]],
    picker: tuple[str, Mapping[str, Any]],
    default_scorer: str | None = None,
) -> PipelinePolicy:
    """A ``PipelinePolicy`` of registered parts (``default_scorer`` when ``params`` lists no scorers)."""
    ctx = PartContext(profile=profile, outliers=params.outlier.detector())
    parts = [FILTERS.build(f, p, ctx) for f, p in filters]
    scorers: list[tuple[Scorer, float]] = []
    if isinstance(params, _ScoredParams) and params.scorers:
        scorers = build_scorers(params.scorers, ctx)
    elif default_scorer is not None:
        scorers = [(SCORERS.build(default_scorer, None, ctx), 1.0)]
    return PipelinePolicy(
        name, parts, scorers, PICKERS.build(picker[0], picker[1], ctx), outliers=ctx.outliers
    )


@POLICIES.register("random", RandomPolicyParams)
def _random(params: RandomPolicyParams, profile: CostProfile = DEFAULT_PROFILE) -> RoutingPolicy:
    return _pipeline("random", params, profile, [("routable", {})], ("random", {}))


@POLICIES.register("round_robin", RoundRobinPolicyParams)
def _round_robin(params: RoundRobinPolicyParams, profile: CostProfile = DEFAULT_PROFILE) -> RoutingPolicy:
    return _pipeline("round_robin", params, profile, [("routable", {})], ("round_robin", {}))


@POLICIES.register("least_requests", LeastRequestsParams)
def _least_requests(params: LeastRequestsParams, profile: CostProfile = DEFAULT_PROFILE) -> RoutingPolicy:
    return _pipeline(
        "least_requests",
        params,
        profile,
        [("routable", {})],
        ("max_score", {"tie_break": params.tie_break}),
        "inflight_requests",
    )


@POLICIES.register("p2c", P2cParams)
def _p2c(params: P2cParams, profile: CostProfile = DEFAULT_PROFILE) -> RoutingPolicy:
    return _pipeline(
        "p2c",
        params,
        profile,
        [("routable", {}), ("random_sample", {"k": params.choices})],
        ("max_score", {"tie_break": "random"}),
        "queue_length",
    )


@POLICIES.register("cache_aware", CacheAwareParams)
def _cache_aware(params: CacheAwareParams, profile: CostProfile = DEFAULT_PROFILE) -> RoutingPolicy:
    return CacheAwarePolicy(
        cache_threshold=params.cache_threshold,
        balance_abs_threshold=params.balance_abs_threshold,
        balance_rel_threshold=params.balance_rel_threshold,
        eviction_interval_s=params.eviction_interval_s,
        max_tree_size=params.max_tree_size,
        outliers=params.outlier.detector(),
    )


@POLICIES.register("fleetgate", FleetgateParams)
def _fleetgate(params: FleetgateParams, profile: CostProfile = DEFAULT_PROFILE) -> RoutingPolicy:
    ctx = PartContext(profile=profile, rate_tau_s=params.rate_tau_s)
    return FleetgatePolicy(
        params, profile, outliers=params.outlier.detector(), scorers=build_scorers(params.scorers, ctx)
    )


POLICY_NAMES: tuple[str, ...] = POLICIES.names()


def build_policy(name: str, params: Any = None, *, profile: CostProfile = DEFAULT_PROFILE) -> RoutingPolicy:
    """A new policy called ``name`` (one of ``POLICY_NAMES``) configured by ``params`` (its ``Params`` or a
    mapping validated as one), estimating costs with ``profile`` (the deployment's)."""
    return POLICIES.build(name, params, profile)
