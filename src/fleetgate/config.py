"""One validated configuration tree, loaded from YAML plus environment overrides; no side effects.

Environment overrides use ``FLEETGATE__SECTION__KEY=value`` (double underscores separate levels, values are
parsed as YAML scalars), e.g. ``FLEETGATE__GATEWAY__PORT=9000``. The environment is passed in explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "FLEETGATE__"

RoutingPolicyName = Literal["random", "round_robin", "least_requests", "p2c", "cache_aware", "fleetgate"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReplicaConfig(_Strict):
    """One engine replica reachable over HTTP (an OpenAI-compatible server)."""

    name: str = Field(min_length=1, description="Unique replica name, used in metrics and logs.")
    url: str = Field(description="Base URL of the engine, e.g. http://127.0.0.1:8001 (no /v1).")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")


class RoutingConfig(_Strict):
    """Which routing policy a deployment uses, by name, and its parameters."""

    policy: RoutingPolicyName = Field(default="fleetgate", description="Routing policy name.")
    params: dict[str, Any] = Field(default_factory=dict, description="Policy-specific parameters.")


class DeploymentConfig(_Strict):
    """A model served by a set of replicas."""

    model: str = Field(min_length=1, description="Model name clients ask for.")
    upstream_model: str | None = Field(
        default=None, description="Model name sent to the engines (default: the same as `model`)."
    )
    replicas: list[ReplicaConfig] = Field(default_factory=list, description="Static replica list.")
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    cost_profile: str | None = Field(
        default=None, description="Cost profile name or JSON path (model units); default profile if unset."
    )
    capacity_mu_per_min: float = Field(default=100.0, gt=0, description="MU one replica serves per minute.")

    @model_validator(mode="after")
    def _unique_replicas(self) -> DeploymentConfig:
        names = [r.name for r in self.replicas]
        if len(names) != len(set(names)):
            raise ValueError(f"replica names must be unique within deployment {self.model!r}")
        return self


class GatewayConfig(_Strict):
    """The HTTP front and its upstream client."""

    host: str = Field(default="127.0.0.1", description="Listen address.")
    port: int = Field(default=8080, ge=0, le=65535, description="Listen port (0 picks a free one).")
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0, description="Largest accepted request body.")
    connect_timeout_s: float = Field(default=2.0, gt=0, description="Upstream connect timeout.")
    first_byte_timeout_s: float = Field(
        default=120.0, gt=0, description="Longest wait for an upstream's response headers/first byte."
    )
    stream_idle_timeout_s: float = Field(
        default=30.0, gt=0, description="Longest silence between two upstream stream chunks."
    )
    max_attempts: int = Field(default=3, ge=1, le=10, description="Tries per request before the first byte.")
    shutdown_grace_s: float = Field(default=30.0, ge=0, description="Time to finish in-flight on SIGTERM.")
    client_header_timeout_s: float = Field(default=10.0, gt=0, description="Slow-client header timeout.")


class FleetgateConfig(_Strict):
    """The whole configuration tree."""

    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    deployments: list[DeploymentConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_models(self) -> FleetgateConfig:
        models = [d.model for d in self.deployments]
        if len(models) != len(set(models)):
            raise ValueError("deployment model names must be unique")
        return self

    def deployment(self, model: str) -> DeploymentConfig | None:
        """The deployment serving ``model``, if any."""
        for dep in self.deployments:
            if dep.model == model:
                return dep
        return None


class ConfigError(Exception):
    """A configuration that cannot be loaded; the message lists every problem, one per line."""


def _apply_env(data: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    for key, raw in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        path = [part.lower() for part in key[len(ENV_PREFIX) :].split("__") if part]
        if not path:
            continue
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[path[-1]] = yaml.safe_load(raw)
    return data


def format_validation_error(exc: ValidationError) -> str:
    """One readable line per problem: ``gateway.port: Input should be less than or equal to 65535``."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        lines.append(f"{loc}: {err['msg']}")
    return "\n".join(lines)


def parse_config(data: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> FleetgateConfig:
    """Validate a config mapping (plus env overrides) into a ``FleetgateConfig``."""
    merged = _apply_env(dict(data or {}), env or {})
    try:
        return FleetgateConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from exc


def load_config(path: str | Path | None, env: Mapping[str, str] | None = None) -> FleetgateConfig:
    """Load YAML from ``path`` (or start empty) and apply ``env`` overrides."""
    data: Any = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
    return parse_config(data, env)
