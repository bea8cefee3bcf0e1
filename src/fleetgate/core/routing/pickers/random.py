"""Uniform random choice with the injected rng (scores ignored)."""

from __future__ import annotations

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.pipeline import PickContext, StageBase
from fleetgate.core.types import ReplicaSnapshot


class RandomPickerParams(PluginParams):
    """A uniform random choice."""


class RandomPicker(StageBase):
    name = "random"

    def pick(self, candidates: list[ReplicaSnapshot], scores: list[float] | None, ctx: PickContext) -> int:
        n = len(candidates)
        return int(ctx.rng.random() * n) % n
