"""The routing plug-ins by kind: filters, scorers and pickers, each a type name -> (factory, Params).

A factory takes its validated ``Params`` and the ``PartContext`` of the policy being built: the cost profile
(the deployment's), the outlier detector, and state that parts of one policy share (the replica loads, the
TTFT estimate), created on first use so that e.g. a load guard and a TTFT scorer of one policy read the same
fluid queues. Policies (``registry.POLICIES``) are assembled from these parts; config validates scorer lists
through ``ScorerSpec``, a discriminated union on ``type`` generated from ``SCORERS``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

from fleetgate.core.plugins import PluginParams, Registry
from fleetgate.core.routing.filters.affinity import AffinityFilter, AffinityParams
from fleetgate.core.routing.filters.load_guard import LoadGuard, LoadGuardParams
from fleetgate.core.routing.filters.routable import RoutableFilter, RoutableParams
from fleetgate.core.routing.filters.sample import RandomSampleFilter, RandomSampleParams
from fleetgate.core.routing.filters.tail_bound import TailBound, TailBoundParams
from fleetgate.core.routing.outlier import OutlierDetector
from fleetgate.core.routing.pickers.max_score import MaxScoreParams, MaxScorePicker
from fleetgate.core.routing.pickers.random import RandomPicker, RandomPickerParams
from fleetgate.core.routing.pickers.round_robin import RoundRobinParams, RoundRobinPicker
from fleetgate.core.routing.pipeline import Filter, Picker, Scorer
from fleetgate.core.routing.rates import DecayingRates, ReplicaLoads
from fleetgate.core.routing.scorers.active_sessions import ActiveSessionsParams, ActiveSessionsScorer
from fleetgate.core.routing.scorers.inflight import InflightRequestsParams, InflightRequestsScorer
from fleetgate.core.routing.scorers.kv_pressure import KvPressureParams, KvPressureScorer
from fleetgate.core.routing.scorers.kv_usage import KvUsageParams, KvUsageScorer
from fleetgate.core.routing.scorers.queue import QueueLengthParams, QueueLengthScorer
from fleetgate.core.routing.scorers.ttft import TtftEstimate, TtftEstimateParams
from fleetgate.core.units import DEFAULT_PROFILE, CostProfile


@dataclass
class PartContext:
    """What the parts of one policy are built with (see the module docstring)."""

    profile: CostProfile = DEFAULT_PROFILE
    outliers: OutlierDetector | None = None
    rate_tau_s: float = 60.0
    _loads: ReplicaLoads | None = None
    _estimate: TtftEstimate | None = None
    _key_rates: DecayingRates[int] | None = None

    @property
    def loads(self) -> ReplicaLoads:
        if self._loads is None:
            self._loads = ReplicaLoads(self.rate_tau_s)
        return self._loads

    @property
    def key_rates(self) -> DecayingRates[int]:
        if self._key_rates is None:
            self._key_rates = DecayingRates(self.rate_tau_s)
        return self._key_rates

    def estimate(self, params: TtftEstimateParams | None = None) -> TtftEstimate:
        """The policy's TTFT estimate (the first call's parameters make it). In a plain pipeline there is no
        dispatch gate, so ``first_token_feedback: auto`` means off."""
        if self._estimate is None:
            p = params or TtftEstimateParams()
            self._estimate = TtftEstimate(
                p, self.profile, self.loads, feedback=p.first_token_feedback == "on"
            )
        return self._estimate


FILTERS: Registry[Filter] = Registry("routing filter")
SCORERS: Registry[Scorer] = Registry("routing scorer")
PICKERS: Registry[Picker] = Registry("routing picker")

FILTERS.add("routable", RoutableParams, lambda p, ctx: RoutableFilter(ctx.outliers))
FILTERS.add("random_sample", RandomSampleParams, lambda p, ctx: RandomSampleFilter(p.k))
FILTERS.add("affinity", AffinityParams, lambda p, ctx: AffinityFilter(p, ctx.loads, ctx.key_rates))
FILTERS.add("load_guard", LoadGuardParams, lambda p, ctx: LoadGuard(p, ctx.loads, ctx.estimate()))
FILTERS.add("tail_bound", TailBoundParams, lambda p, ctx: TailBound(p, ctx.loads))

SCORERS.add("inflight_requests", InflightRequestsParams, lambda p, ctx: InflightRequestsScorer())
SCORERS.add("queue_length", QueueLengthParams, lambda p, ctx: QueueLengthScorer())
SCORERS.add("kv_usage", KvUsageParams, lambda p, ctx: KvUsageScorer())
SCORERS.add("kv_pressure", KvPressureParams, lambda p, ctx: KvPressureScorer(p))
SCORERS.add("active_sessions", ActiveSessionsParams, lambda p, ctx: ActiveSessionsScorer(p))
SCORERS.add("ttft_estimate", TtftEstimateParams, lambda p, ctx: ctx.estimate(p))

PICKERS.add("max_score", MaxScoreParams, lambda p, ctx: MaxScorePicker(p.tie_break))
PICKERS.add("random", RandomPickerParams, lambda p, ctx: RandomPicker())
PICKERS.add("round_robin", RoundRobinParams, lambda p, ctx: RoundRobinPicker())


class ScorerWeight(PluginParams):
    """A scorer in a policy's ``scorers`` list: its ``type``, its ``weight`` and its own parameters."""

    weight: float = Field(default=1.0, ge=0, description="Weight of this scorer (0: off).")


if TYPE_CHECKING:
    ScorerSpec = ScorerWeight
else:
    ScorerSpec = SCORERS.union(tag="type", base=ScorerWeight, suffix="Scorer")


def scorer_list(value: Any) -> Any:
    """The short form ``{name: weight, ...}`` as the list form ``[{type: name, weight: w}, ...]``."""
    if isinstance(value, Mapping):
        return [{"type": name, "weight": weight} for name, weight in value.items()]
    return value


def build_scorers(specs: Sequence[ScorerWeight], ctx: PartContext) -> list[tuple[Scorer, float]]:
    """The configured scorers with their weights (validated by ``ScorerSpec``)."""
    out = []
    for spec in specs:
        name = spec.type  # type: ignore[attr-defined]
        params = SCORERS.get(name).params.model_validate(spec.model_dump(exclude={"type", "weight"}))
        out.append((SCORERS.get(name).factory(params, ctx), float(spec.weight)))
    return out
