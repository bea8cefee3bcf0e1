"""Per-deployment control plane in config: where replicas come from (``provider``), who scales them
(``autoscaler``) and what is done to a hung or crashed one (``remediation``). One schema for ``fleetgate
serve`` and ``fleetgate up`` (``up`` is ``serve`` with a local provider)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


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
