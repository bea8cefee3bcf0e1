"""Round robin over the candidates in the order given (scores ignored).

The cursor is the name picked last, not an index, so replicas joining, leaving or being filtered out do not
make it skip or repeat others: the next pick is the first candidate after that name in stable name order.
"""

from __future__ import annotations

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.pipeline import PickContext, StageBase
from fleetgate.core.types import ReplicaSnapshot


class RoundRobinParams(PluginParams):
    """Round robin in stable name order."""


class RoundRobinPicker(StageBase):
    name = "round_robin"

    def __init__(self) -> None:
        self._last: str | None = None

    def pick(self, candidates: list[ReplicaSnapshot], scores: list[float] | None, ctx: PickContext) -> int:
        last = self._last
        best_i = -1
        best_name = ""
        first_i = 0
        first_name = candidates[0].name
        for i, r in enumerate(candidates):
            name = r.name
            if name < first_name:
                first_i, first_name = i, name
            if last is not None and name > last and (best_i < 0 or name < best_name):
                best_i, best_name = i, name
        i = best_i if best_i >= 0 else first_i
        self._last = candidates[i].name
        return i
