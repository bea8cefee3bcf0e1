"""Config of the latency-headroom admission gate (`admission.latency_headroom`; docs/admission.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClassLatencyTargets(_Strict):
    """Latency targets of one tenant class (docs/admission.md, "Latency headroom")."""

    ttft_p95_s: float | None = Field(
        default=None,
        gt=0,
        description="Time to first token, p95 (s). Unset: reserved -> learned, `tolerance` above what "
        "reserved requests get with no best-effort work on the engines; best-effort -> no target.",
    )
    otps_p10: float | None = Field(
        default=None,
        gt=0,
        description="Output tokens per second of a stream, p10. Unset: reserved -> learned, `tolerance` "
        "below the solo figure; best-effort -> no target.",
    )


class LatencyHeadroomConfig(_Strict):
    """Best-effort admitted only while the replicas' measured latency headroom allows (docs/admission.md).

    While reserved traffic is active on a deployment, best-effort requests in flight there are limited by
    an AIMD controller that keeps reserved TTFT p95 and OTPS p10 within their targets, measured by the
    gateway itself (first-token and completion times); beyond the limit best-effort waits in the admission
    queue and gets 503 with Retry-After at its deadline. Reserved tenants are never held by it.
    """

    enabled: bool = Field(default=True, description="false: best-effort is bounded by the MU meters only.")
    reserved: ClassLatencyTargets = Field(default_factory=ClassLatencyTargets)
    best_effort: ClassLatencyTargets = Field(
        default_factory=ClassLatencyTargets,
        description="Best-effort targets are measured and reported (`/admin/capacity`, `/metrics`), not "
        "enforced: best-effort promises no latency.",
    )
    tolerance: float = Field(
        default=0.10, gt=0, lt=1, description="Learned targets: this share worse than solo (0.10: 10%)."
    )
    open_headroom: float = Field(
        default=0.5, description="Grow the best-effort limit while headroom (in tolerances) is at least this."
    )
    close_headroom: float = Field(
        default=0.2, description="Halve the best-effort limit when headroom falls below this."
    )
    min_samples: int = Field(
        default=8, ge=2, description="Reserved samples since the last change before the next decision."
    )
    otps_min_tokens: int = Field(
        default=16,
        ge=2,
        description="Streams shorter than this (output tokens) give no OTPS sample (their rate is jitter).",
    )
    active_s: float = Field(
        default=5.0,
        gt=0,
        description="Reserved traffic counts as active this long after its last request; with none active "
        "best-effort has no latency limit (only the MU meters).",
    )

    @model_validator(mode="after")
    def _band(self) -> LatencyHeadroomConfig:
        if self.close_headroom > self.open_headroom:
            raise ValueError("close_headroom must not exceed open_headroom")
        return self
