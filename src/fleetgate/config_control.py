"""Per-deployment control plane in config: where replicas come from (``provider``), who scales them
(``autoscaler``) and what is done to a hung or crashed one (``remediation``). One schema for ``fleetgate
serve`` and ``fleetgate up`` (``up`` is ``serve`` with a local provider)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StaticProviderConfig(_Strict):
    """`kind: static`: the deployment's `replicas` list, as written (no scaling, no restarts)."""

    kind: Literal["static"] = "static"


class LocalProviderConfig(_Strict):
    """`kind: local`: engine processes started on this machine by the gateway (restarted when they hang)."""

    kind: Literal["local"] = "local"
    command: list[str] | None = Field(
        default=None,
        description="Command template of one replica ({port}, {model}, {name} are filled in; ready when "
        "GET {url}{health path of `engine`} answers 200). Default: the simulated engine.",
    )
    engine_args: list[str] = Field(
        default_factory=list,
        description="Extra arguments of the default simulated engine, e.g. ['--time-scale', '0.5'].",
    )
    replicas: int = Field(default=2, ge=0, description="Replicas started with the gateway.")
    ready_timeout_s: float = Field(default=60.0, gt=0, description="Longest wait for a replica to be ready.")
    stop_timeout_s: float = Field(default=5.0, gt=0, description="SIGTERM-to-SIGKILL delay when stopping.")


class KubernetesProviderConfig(_Strict):
    """`kind: kubernetes`: an engine Deployment scaled through its `scale` subresource; its replicas are
    the ready endpoints of a Service (EndpointSlices)."""

    kind: Literal["kubernetes"] = "kubernetes"
    namespace: str | None = Field(
        default=None, min_length=1, description="Namespace (default: the gateway pod's own)."
    )
    deployment: str = Field(min_length=1, description="The engine Deployment that is scaled.")
    service: str = Field(min_length=1, description="Service whose EndpointSlices list the replicas.")
    port: str | int | None = Field(
        default=None, description="Named (or numbered) Service port of the engines (default: the first)."
    )


ProviderConfig = Annotated[
    StaticProviderConfig | LocalProviderConfig | KubernetesProviderConfig, Field(discriminator="kind")
]

#: What the prober does to a hung or crashed replica: nothing beyond taking it out of routing, restart the
#: process (local), delete the pod so its ReplicaSet replaces it (kubernetes).
Remediation = Literal["none", "restart", "delete_pod"]

#: The remediation each provider kind gets when `remediation` is not set.
DEFAULT_REMEDIATION: dict[str, Remediation] = {
    "static": "none",
    "local": "restart",
    "kubernetes": "delete_pod",
}
#: The provider kind each remediation needs.
REMEDIATION_NEEDS: dict[str, str] = {"restart": "local", "delete_pod": "kubernetes"}


class LeaderElectionConfig(_Strict):
    """Which gateway replica runs the deployment's autoscaler and remediation when several serve it.

    `auto` (default): a Kubernetes provider elects through the Lease `fleetgate-<deployment>`; other providers
    elect nobody (a static list is not scaled; local processes are each gateway's own). `lease`: the Lease
    (Kubernetes provider only). `redis`: a lock in the admission store's Redis (`admission.store.kind:
    redis`), e.g. where the gateways may not write Leases. `none`: every gateway acts (one gateway only).
    """

    kind: Literal["auto", "lease", "redis", "none"] = "auto"
    lease_duration_s: float = Field(
        default=10.0, gt=0, description="How long a lease lasts unrenewed: the others take over after it."
    )
    renew_deadline_s: float = Field(
        default=7.0, gt=0, description="The leader stops acting when it could not renew for this long."
    )
    retry_period_s: float = Field(default=2.0, gt=0, description="Renewal and retry interval.")

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElectionConfig:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("need retry_period_s < renew_deadline_s < lease_duration_s")
        return self


def election_kind(election: LeaderElectionConfig, provider_kind: str) -> str:
    """The election a deployment gets: `lease`, `redis` or `none` (``auto`` resolved)."""
    if election.kind == "auto":
        return "lease" if provider_kind == "kubernetes" else "none"
    return election.kind


def election_problems(
    where: str, election: LeaderElectionConfig, provider_kind: str, store: str
) -> list[str]:
    """A Lease without the Kubernetes provider, or a Redis lock without a Redis admission store."""
    kind = election_kind(election, provider_kind)
    if kind == "lease" and provider_kind != "kubernetes":
        return [f"{where}.leader_election: kind lease needs `provider: {{kind: kubernetes}}`"]
    if kind == "redis" and store != "redis":
        return [f"{where}.leader_election: kind redis needs `admission.store: {{kind: redis, url: ...}}`"]
    return []
