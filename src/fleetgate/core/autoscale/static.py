"""Static provisioning for the peak: the cost ceiling every autoscaler is compared to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from fleetgate.core.autoscale.base import (
    AutoscaleContext,
    AutoscaleSummary,
    context_summary,
    replicas_for,
)
from fleetgate.core.autoscale.rails import Rails
from fleetgate.core.plugins import PluginParams


class StaticParams(PluginParams):
    """A fixed count (peak provisioning): ``replicas``, or ``peak_mu_per_min`` with ``capacity_mu_per_min``
    and ``target_utilisation``."""

    replicas: int | None = Field(default=None, description="The count to run.")
    peak_mu_per_min: float | None = Field(default=None, description="Or: size for this peak demand ...")
    capacity_mu_per_min: float = Field(default=100.0, description="... at this capacity per replica ...")
    target_utilisation: float = Field(default=0.7, description="... and this target utilisation.")

    @model_validator(mode="after")
    def _check(self) -> StaticParams:
        if self.replicas is None and self.peak_mu_per_min is None:
            raise ValueError("static autoscaler needs `replicas` or `peak_mu_per_min`")
        return self

    def count(self) -> int:
        if self.replicas is not None:
            return int(self.replicas)
        assert self.peak_mu_per_min is not None
        return max(1, replicas_for(self.peak_mu_per_min, self.capacity_mu_per_min, self.target_utilisation))


@dataclass(frozen=True, slots=True)
class StaticAutoscaler:
    """Always the same count: provisioning for the peak."""

    replicas: int
    name: str = "static"

    @property
    def rails(self) -> Rails:
        return Rails()

    def decide(self, ctx: AutoscaleContext) -> tuple[int, None]:
        return self.rails.bound(self.replicas), None

    def summary(self, ctx: AutoscaleContext, state: Any) -> AutoscaleSummary:
        return context_summary(ctx)
