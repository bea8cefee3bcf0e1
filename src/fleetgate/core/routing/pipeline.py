"""The plug-in pipeline: filters, then weighted scorers in [0, 1], then a picker.

Modelled on the Gateway API Inference Extension's scheduler: each stage is a small object built by name from
config, so a policy is a list of parts rather than a class hierarchy. The pipeline is a ``RoutingPolicy``.

Speed matters because the fleet simulator calls ``pick`` millions of times: every stage works on plain lists,
the common one-scorer case skips the weighted sum, and nothing is allocated per replica beyond those lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from fleetgate.core.errors import ServiceUnavailableError
from fleetgate.core.routing.base import PolicyBase
from fleetgate.core.routing.outlier import OutlierDetector
from fleetgate.core.types import RandomSource, ReplicaSnapshot, RequestInfo, RouteDecision


@dataclass(slots=True)
class PickContext:
    """Per-call inputs every stage may need (one small object per pick)."""

    now: float
    rng: RandomSource
    exclude: frozenset[str]


class _Hooks(Protocol):
    """The request hooks every stage has (``StageBase`` gives no-op defaults)."""

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> Any: ...

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None: ...

    def on_complete(
        self, request: RequestInfo, replica: str, now: float, cost_mu: float, ok: bool
    ) -> None: ...


class Filter(_Hooks, Protocol):
    """Drops candidates; returns the survivors in their original order (may return the input list)."""

    name: str

    def filter(
        self, request: RequestInfo, candidates: list[ReplicaSnapshot], ctx: PickContext
    ) -> list[ReplicaSnapshot]: ...


class Scorer(_Hooks, Protocol):
    """Scores each candidate in [0, 1], higher is better; same order and length as ``candidates``."""

    name: str

    def score(
        self, request: RequestInfo, candidates: list[ReplicaSnapshot], ctx: PickContext
    ) -> list[float]: ...


class Picker(_Hooks, Protocol):
    """Chooses the index of one candidate given the combined scores (``None`` when there are no scorers)."""

    name: str

    def pick(
        self, candidates: list[ReplicaSnapshot], scores: list[float] | None, ctx: PickContext
    ) -> int: ...


class StageBase:
    """No-op request hooks for pipeline stages; a stateful stage (a prefix record, the TTFT estimate)
    overrides the ones it needs and the pipeline forwards exactly those. ``uses_prefix_hashes``: the stage
    reads ``RequestInfo.prefix_hashes`` (the gateway hashes prompts only for policies that need it)."""

    uses_prefix_hashes = False

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> Any:
        return None

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        return None

    def on_complete(self, request: RequestInfo, replica: str, now: float, cost_mu: float, ok: bool) -> None:
        return None


def _overrides(part: object) -> tuple[bool, bool, bool]:
    """Which of (on_dispatch, on_first_token, on_complete) ``part`` defines itself rather than inheriting
    ``StageBase``'s no-op."""
    if not isinstance(part, StageBase):
        return (False, False, False)
    cls = type(part)
    return (
        cls.on_dispatch is not StageBase.on_dispatch,
        cls.on_first_token is not StageBase.on_first_token,
        cls.on_complete is not StageBase.on_complete,
    )


def no_replica_error(total: int, model: str) -> ServiceUnavailableError:
    """The one error every policy raises when nothing is routable."""
    return ServiceUnavailableError(
        f"no routable replica for model {model!r} ({total} known; all excluded, draining, ejected "
        "or unhealthy)",
        retry_after_s=1.0,
    )


class PipelinePolicy(PolicyBase):
    """A ``RoutingPolicy`` assembled from filters, weighted scorers and a picker.

    ``outliers`` (optional) is fed with every outcome through ``on_complete`` and consulted by the routable
    filter, so ejection needs no extra wiring in the gateway or the simulator.
    """

    def __init__(
        self,
        name: str,
        filters: Sequence[Filter],
        scorers: Sequence[tuple[Scorer, float]],
        picker: Picker,
        *,
        outliers: OutlierDetector | None = None,
    ) -> None:
        self.name = name
        self.filters = tuple(filters)
        self.scorers = tuple((s, float(w)) for s, w in scorers if w > 0)
        self.picker = picker
        self.outliers = outliers
        self._weight_sum = sum(w for _, w in self.scorers) or 1.0
        parts: list[object] = [*self.filters, *(s for s, _ in self.scorers), picker]
        #: Whether any stage reads the prompt's prefix hashes (declared by each stage).
        self.uses_prefix_hashes = any(isinstance(p, StageBase) and p.uses_prefix_hashes for p in parts)
        hooks = [(cast(StageBase, p), _overrides(p)) for p in parts]
        self._on_dispatch = tuple(p for p, h in hooks if h[0])
        self._on_first_token = tuple(p for p, h in hooks if h[1])
        self._on_complete = tuple(p for p, h in hooks if h[2])

    def pick(
        self,
        request: RequestInfo,
        replicas: Sequence[ReplicaSnapshot],
        now: float,
        rng: RandomSource,
        exclude: frozenset[str] = frozenset(),
    ) -> RouteDecision:
        ctx = PickContext(now, rng, exclude)
        candidates = replicas if isinstance(replicas, list) else list(replicas)
        for f in self.filters:
            candidates = f.filter(request, candidates, ctx)
            if not candidates:
                raise no_replica_error(len(replicas), request.model)
        if len(candidates) == 1 and not self.scorers:
            return RouteDecision(candidates[0].name, reason=self.name)
        per_scorer: list[list[float]] = []
        total: list[float] | None = None
        if len(self.scorers) == 1:
            total = self.scorers[0][0].score(request, candidates, ctx)
            per_scorer.append(total)
        elif self.scorers:
            total = [0.0] * len(candidates)
            inv = 1.0 / self._weight_sum
            for scorer, weight in self.scorers:
                scores = scorer.score(request, candidates, ctx)
                per_scorer.append(scores)
                w = weight * inv
                total = [t + w * s for t, s in zip(total, scores, strict=True)]
        i = self.picker.pick(candidates, total, ctx)
        explain = {s.name: sc[i] for (s, _), sc in zip(self.scorers, per_scorer, strict=True)}
        return RouteDecision(candidates[i].name, scores=explain, reason=self.name)

    def on_dispatch(self, request: RequestInfo, replica: str, now: float) -> None:
        for part in self._on_dispatch:
            part.on_dispatch(request, replica, now)

    def on_first_token(self, request: RequestInfo, replica: str, now: float) -> None:
        for part in self._on_first_token:
            part.on_first_token(request, replica, now)

    def on_complete(self, request: RequestInfo, replica: str, now: float, cost_mu: float, ok: bool) -> None:
        if self.outliers is not None:
            self.outliers.record(replica, ok, now)
        for part in self._on_complete:
            part.on_complete(request, replica, now, cost_mu, ok)
