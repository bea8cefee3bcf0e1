"""Highest combined score wins; ties broken by the injected rng or by stable (input) order."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.pipeline import PickContext, StageBase
from fleetgate.core.types import ReplicaSnapshot

TieBreak = Literal["random", "first"]


class MaxScoreParams(PluginParams):
    """The highest combined score wins."""

    tie_break: TieBreak = Field(default="random", description="Ties: `random` (seeded) or `first` (stable).")


class MaxScorePicker(StageBase):
    """Index of the best score; ``tie_break`` ``random`` spreads equal candidates, ``first`` is stable."""

    name = "max_score"

    def __init__(self, tie_break: TieBreak = "random", tolerance: float = 1e-9) -> None:
        if tie_break not in ("random", "first"):
            raise ValueError("tie_break must be 'random' or 'first'")
        self.tie_break = tie_break
        self.tolerance = tolerance

    def pick(self, candidates: list[ReplicaSnapshot], scores: list[float] | None, ctx: PickContext) -> int:
        n = len(candidates)
        if scores is None:
            return int(ctx.rng.random() * n) % n if self.tie_break == "random" else 0
        best = max(scores)
        if self.tie_break == "first":
            return scores.index(best)
        floor = best - self.tolerance
        ties = [i for i, s in enumerate(scores) if s >= floor]
        if len(ties) == 1:
            return ties[0]
        return ties[int(ctx.rng.random() * len(ties)) % len(ties)]
