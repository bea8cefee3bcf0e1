"""Build routing policies by name from config: the same names in the gateway, the simulator and the CLI.

``build_policy(name, params)`` returns a fresh policy object (policies keep state: never share one between
deployments). Every policy accepts ``outlier`` (a mapping of ``OutlierConfig`` fields, ``{"enabled": false}``
to turn ejection off); the other parameters are per policy and listed in docs/routing.md. Unknown names or
parameters raise ``ValueError`` so a typo in config fails at start-up, not silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fleetgate.core.routing.base import RoutingPolicy
from fleetgate.core.routing.filters import RandomSampleFilter, RoutableFilter
from fleetgate.core.routing.outlier import OutlierConfig, OutlierDetector
from fleetgate.core.routing.pickers import MaxScorePicker, RandomPicker, RoundRobinPicker
from fleetgate.core.routing.pipeline import PipelinePolicy, Scorer
from fleetgate.core.routing.scorers import InflightRequestsScorer, KvUsageScorer, QueueLengthScorer

POLICY_NAMES: tuple[str, ...] = ("random", "round_robin", "least_requests", "p2c", "cache_aware", "fleetgate")


#: Scorer plug-ins by name: ``least_requests`` and ``p2c`` accept ``scorers: {name: weight}``.
SCORERS: dict[str, Callable[[], Scorer]] = {
    "inflight_requests": InflightRequestsScorer,
    "queue_length": QueueLengthScorer,
    "kv_usage": KvUsageScorer,
}


def _scorers(params: dict[str, Any], default: str) -> list[tuple[Scorer, float]]:
    spec = params.pop("scorers", None) or {default: 1.0}
    if not isinstance(spec, Mapping):
        raise ValueError("scorers must map scorer names to weights")
    out = []
    for name, weight in spec.items():
        if name not in SCORERS:
            raise ValueError(f"unknown scorer {name!r}; choose from: {', '.join(sorted(SCORERS))}")
        if float(weight) < 0:
            raise ValueError("scorer weights must be >= 0")
        out.append((SCORERS[name](), float(weight)))
    if not any(w > 0 for _, w in out):
        raise ValueError("at least one scorer needs a positive weight")
    return out


def _outliers(params: dict[str, Any]) -> OutlierDetector | None:
    cfg = OutlierConfig.from_params(params.pop("outlier", None))
    return OutlierDetector(cfg) if cfg.enabled else None


def _check_empty(name: str, params: Mapping[str, Any]) -> None:
    if params:
        raise ValueError(f"unknown parameter(s) for routing policy {name!r}: {', '.join(sorted(params))}")


def _random(params: dict[str, Any]) -> RoutingPolicy:
    det = _outliers(params)
    _check_empty("random", params)
    return PipelinePolicy("random", [RoutableFilter(det)], [], RandomPicker(), outliers=det)


def _round_robin(params: dict[str, Any]) -> RoutingPolicy:
    det = _outliers(params)
    _check_empty("round_robin", params)
    return PipelinePolicy("round_robin", [RoutableFilter(det)], [], RoundRobinPicker(), outliers=det)


def _least_requests(params: dict[str, Any]) -> RoutingPolicy:
    det = _outliers(params)
    tie_break = params.pop("tie_break", "random")
    scorers = _scorers(params, "inflight_requests")
    _check_empty("least_requests", params)
    return PipelinePolicy(
        "least_requests",
        [RoutableFilter(det)],
        scorers,
        MaxScorePicker(tie_break),
        outliers=det,
    )


def _p2c(params: dict[str, Any]) -> RoutingPolicy:
    det = _outliers(params)
    k = int(params.pop("choices", 2))
    scorers = _scorers(params, "queue_length")
    _check_empty("p2c", params)
    return PipelinePolicy(
        "p2c",
        [RoutableFilter(det), RandomSampleFilter(k)],
        scorers,
        MaxScorePicker("random"),
        outliers=det,
    )


def _cache_aware(params: dict[str, Any]) -> RoutingPolicy:
    from fleetgate.core.routing.cache_aware import build_cache_aware

    return build_cache_aware(params, _outliers(params))


def _fleetgate(params: dict[str, Any]) -> RoutingPolicy:
    from fleetgate.core.routing.fleetgate import build_fleetgate

    return build_fleetgate(params, _outliers(params))


_BUILDERS: dict[str, Callable[[dict[str, Any]], RoutingPolicy]] = {
    "random": _random,
    "round_robin": _round_robin,
    "least_requests": _least_requests,
    "p2c": _p2c,
    "cache_aware": _cache_aware,
    "fleetgate": _fleetgate,
}


def build_policy(name: str, params: Mapping[str, Any] | None = None) -> RoutingPolicy:
    """A new policy called ``name`` (one of ``POLICY_NAMES``) configured by ``params``."""
    builder = _BUILDERS.get(name)
    if builder is None:
        raise ValueError(f"unknown routing policy {name!r}; choose one of: {', '.join(POLICY_NAMES)}")
    return builder(dict(params or {}))
