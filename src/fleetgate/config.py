"""One validated configuration tree, loaded from YAML plus environment overrides; no side effects.

Environment overrides use ``FLEETGATE__SECTION__KEY=value`` (double underscores separate levels, values are
parsed as YAML scalars), e.g. ``FLEETGATE__GATEWAY__PORT=9000``; numeric parts index lists
(``FLEETGATE__TENANTS__0__API_KEYS__0=...``). The environment is passed in explicitly.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fleetgate.config_control import (
    LeaderElectionConfig,
    ProviderConfig,
    Remediation,
    StaticProviderConfig,
)
from fleetgate.config_latency import LatencyHeadroomConfig
from fleetgate.core.autoscale.registry import AutoscalerConfig
from fleetgate.core.plugins import PluginParams, tagged_union
from fleetgate.core.routing.registry import POLICIES
from fleetgate.engines.dialects import EngineKind

ENV_PREFIX = "FLEETGATE__"


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


class _RoutingBase(_Strict):
    """Which routing policy a deployment uses, by name (`policy`), and its parameters (`params`)."""


#: One config model per routing policy (``core.routing.registry.POLICIES``), told apart by ``policy``.
ROUTING_VARIANTS: dict[str, type[BaseModel]] = POLICIES.variants(
    tag="policy",
    params_field="params",
    base=_RoutingBase,
    suffix="Routing",
    tag_default=True,
    doc=lambda p: f"Routing with `policy: {p.name}`: {' '.join((p.params.__doc__ or '').split())}",
)

if TYPE_CHECKING:

    class RoutingConfig(_RoutingBase):
        policy: str
        params: PluginParams

else:
    RoutingConfig = tagged_union(list(ROUTING_VARIANTS.values()), "policy", default="fleetgate")


class FailoverConfig(_Strict):
    """Mid-stream failover: a stream whose replica breaks after the first byte is continued on another
    replica (plain text only; see docs/gateway.md for the cases that end with an SSE error instead)."""

    enabled: bool = Field(default=True, description="Continue broken plain-text streams on another replica.")
    max_continuations: int = Field(
        default=2, ge=0, le=10, description="Continuations per request before the stream ends with an error."
    )
    timeout_s: float = Field(
        default=30.0, gt=0, description="Longest wait for a continuation's first event (then try the next)."
    )
    non_stream: bool = Field(
        default=False,
        description="Stream plain-text non-streamed requests from the engine and answer them in one body, so "
        "that a failure mid-generation is continued like a stream (costs the gateway about 5 us per token).",
    )


class DeploymentConfig(_Strict):
    """A model served by a set of replicas."""

    model: str = Field(min_length=1, description="Model name clients ask for.")
    upstream_model: str | None = Field(
        default=None, description="Model name sent to the engines (default: the same as `model`)."
    )
    replicas: list[ReplicaConfig] = Field(default_factory=list, description="Static replica list.")
    routing: RoutingConfig = Field(  # type: ignore[assignment]
        default_factory=ROUTING_VARIANTS["fleetgate"],
        description="Routing policy and its parameters; one section per policy below.",
    )
    cost_profile: str | None = Field(
        default=None, description="Cost profile name or JSON path (model units); default profile if unset."
    )
    capacity_mu_per_min: float | None = Field(
        default=None,
        gt=0,
        description="MU one replica serves per minute (its pool floors, autoscaler and admission capacity). "
        "Unset: its cost profile's `capacity_mu_per_min` (100 for the bundled profiles).",
    )
    pool: str | None = Field(
        default=None,
        description="GPU pool (`pools[].name`) its replicas run in; its reservations must fit there "
        "(docs/capacity.md). Unset: no pool, replicas are not counted against one.",
    )
    gpus_per_replica: int = Field(default=1, ge=1, description="GPUs one replica occupies in its pool.")
    upstream_api_key: str | None = Field(
        default=None,
        description="Bearer key the gateway sends to the engines (e.g. vLLM --api-key); clients' keys are "
        "never forwarded.",
    )
    engine: EngineKind | None = Field(
        default=None,
        description="Engine dialect of the replicas (`engines.dialects`): its metric names, request "
        "priority field, probe and health path. `openai` is any other OpenAI-compatible server. Unset: "
        "metric names are detected from /metrics; requests and probes are as for `openai`.",
    )
    upstream_api_key_file: str | None = Field(
        default=None,
        description="File holding `upstream_api_key` (e.g. a mounted Kubernetes Secret); re-read while the "
        "gateway runs (`gateway.secret_files_interval_s`), so a rotated key applies without a restart.",
    )
    prefix_cache_scope: Literal["tenant", "shared"] = Field(
        default="tenant",
        description="`tenant`: each tenant's prompts get their own prefix hashes in routing and their own "
        "engine cache salt, so no tenant can probe another's cached prompts (cached_tokens, time to first "
        "token). `shared`: tenants share cache entries (a common system prompt hits across tenants); opt in "
        "only where every tenant may learn what the others send. Only applies when tenants are configured.",
    )
    cache_salt_field: str | None = Field(
        default="cache_salt",
        description="Request field with the tenant's cache salt (vLLM: `cache_salt`); null for engines that "
        "reject unknown fields (their cache is then shared: docs/reliability.md).",
    )
    engine_priority: bool | None = Field(
        default=None,
        description="Forward the tenant's priority class to the engine's `priority` request field, in "
        "the engine's own order (vLLM: lower first, needs `--scheduling-policy priority`; SGLang: higher "
        "first, needs `--enable-priority-scheduling`; the simulated engine always honours it, llama.cpp "
        "takes none). Health probes then carry the highest priority too. Unset: on where the engine "
        "honours it without a launch flag (`engine: sim`, and the local provider's default simulated "
        "engine), off elsewhere (set true once vLLM/SGLang run with their flag).",
    )

    tokenizer: str | None = Field(
        default=None,
        description="Path to the model's Hugging Face `tokenizer.json` (or its folder): prompt tokens for "
        "MU estimates and token limits, and prefix-block hashes (of token ids, in the engine's KV block size "
        "where its dialect knows it) come from it. Unset: a fast approximation (about 4 characters per "
        "token; far off for Chinese).",
    )
    context_tokens: int = Field(
        default=131072,
        gt=0,
        description="The engines' context length (vLLM `--max-model-len`, llama.cpp `--ctx-size`): the most "
        "tokens a request can produce without `max_tokens`. Bounds admission budgets and the usage an "
        "engine may report for a request (more is counted as an anomaly and not charged).",
    )
    failover: FailoverConfig = Field(default_factory=FailoverConfig)
    provider: ProviderConfig = Field(
        default_factory=StaticProviderConfig,
        description="Where the replicas come from: `{kind: static}` (the `replicas` list), `{kind: local, "
        "...}` (processes on this machine) or `{kind: kubernetes, ...}`; sections below.",
    )
    autoscaler: AutoscalerConfig | None = Field(
        default=None,
        description="Scale the provider's replicas: `{policy: fleetgate, min_replicas: 1, max_replicas: 16}` "
        "(or `kpa`, `static`; typed parameters below); none (null): keep the count fixed.",
    )
    demand_window_s: float = Field(
        default=60.0,
        gt=0,
        description="Window of the demand meter the autoscaler reads (MU settled over it, per minute).",
    )
    leader_election: LeaderElectionConfig = Field(
        default_factory=LeaderElectionConfig,
        description="With several gateway replicas: which one runs the autoscaler and remediation (`auto`: "
        "the Kubernetes Lease `fleetgate-<deployment>` for a Kubernetes provider; `redis`; `none`).",
    )
    remediation: Remediation | None = Field(
        default=None,
        description="What happens to a hung or crashed replica besides leaving routing: `restart` (local), "
        "`delete_pod` (kubernetes) or `none`. Default: the provider's (static: none).",
    )

    @field_validator("autoscaler", mode="before")
    @classmethod
    def _no_autoscaler(cls, value: Any) -> Any:
        return None if value == "none" else value

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
    max_messages: int = Field(default=2048, ge=1, description="Most chat messages in one request (else 400).")
    max_content_parts: int = Field(default=4096, ge=1, description="Most content parts in one request (400).")
    max_json_values: int = Field(default=300_000, ge=1, description="Most JSON values in one body (400).")
    tokenizer_cache_mb: float = Field(default=40.0, ge=0, description="Prompt tokenizer caches' memory (MB).")
    client_body_timeout_s: float = Field(
        default=60.0, gt=0, description="Longest time to receive a request body once its head arrived (408)."
    )
    max_connections: int | None = Field(
        default=None, ge=1, description="Most open client connections (default: the fd limit less a quarter)."
    )
    metrics_auth: Literal["admin", "none"] = Field(
        default="admin", description="Who reads GET /metrics: `admin` (key, with tenants) or `none`."
    )
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="Port serving only GET /metrics, keyless (Prometheus)."
    )
    metrics_host: str = Field(default="127.0.0.1", description="Listen address of `metrics_port`.")
    connect_timeout_s: float = Field(default=2.0, gt=0, description="Upstream connect timeout.")
    first_byte_timeout_s: float = Field(
        default=120.0, gt=0, description="Longest wait for an upstream's response headers/first byte."
    )
    stream_idle_timeout_s: float = Field(
        default=30.0, gt=0, description="Longest silence between two upstream stream chunks."
    )
    non_stream_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Longest time for a whole non-streamed upstream response (headers and body); not retried "
        "when it runs out (the engine was working on it: another try would do that work again).",
    )
    max_upstream_body_bytes: int = Field(
        default=64 * 1024 * 1024, gt=0, description="Largest non-streamed upstream response body (else 502)."
    )
    max_attempts: int = Field(default=3, ge=1, le=10, description="Tries per request before the first byte.")
    shutdown_grace_s: float = Field(default=30.0, ge=0, description="Time to finish in-flight on SIGTERM.")
    client_header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Slow-client header timeout: once a request's first bytes arrived, its whole request "
        "head (line and headers) must arrive within this time or the connection is closed.",
    )
    client_keepalive_timeout_s: float = Field(
        default=75.0, gt=0, description="An idle keep-alive client connection is closed after this time."
    )
    shutdown_linger_s: float = Field(
        default=1.0,
        ge=0,
        description="After SIGTERM, requests arriving on already-open keep-alive connections are still "
        "served (with `Connection: close`) for this long, so no request the gateway read is reset.",
    )
    stream_usage: bool = Field(
        default=True,
        description="Ask engines for usage on streams whose client did not (exact cost settlement); "
        "the extra usage-only chunk is not forwarded to such clients.",
    )
    scrape_interval_s: float = Field(default=1.0, gt=0, description="Engine /metrics scrape period.")
    scrape_timeout_s: float = Field(default=1.0, gt=0, description="Timeout of one /metrics scrape.")
    cors_allowed_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins allowed to call the gateway (CORS), e.g. "
        "['https://playground.example']; '*' allows any. Empty: no CORS headers.",
    )
    models_require_key: bool = Field(
        default=True,
        description="GET /v1/models and /v1/models/{model} need a valid API key when tenants are configured.",
    )
    secret_files_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="How often key files (`api_keys_file`, `admin_api_keys_file`, `upstream_api_key_file`) "
        "are re-read; a changed file applies at once.",
    )
    health_checks: bool = Field(
        default=True,
        description="Black-box probes and hang detection of the replicas (fleetgate.health): hung or "
        "crashed replicas leave routing at once (and are restarted where `remediation` says so). Probes are "
        "minimal /v1/completions requests; turn off for engines that do not serve that endpoint.",
    )


def hash_api_key(value: str) -> str:
    """Keys are kept only as ``sha256:<hex>``; plain keys (demos) are hashed at load."""
    import hashlib

    if value.startswith("sha256:"):
        digest = value[len("sha256:") :].lower()
        if len(digest) != 64 or any(ch not in "0123456789abcdef" for ch in digest):
            raise ValueError("a sha256: key must be followed by 64 hex digits")
        return "sha256:" + digest
    if not value:
        raise ValueError("API keys must not be empty")
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()


class TenantConfig(_Strict):
    """A tenant: its API keys, what it bought (MU/min per deployment) and its priority class."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="Tenant name (metrics, admin).")
    api_keys: list[str] = Field(
        default_factory=list,
        description="API keys as `sha256:<hex>`; plain keys are accepted (demos) and hashed at load.",
    )
    priority: Literal["interactive", "batch", "best_effort"] = Field(
        default="interactive", description="Class of its reserved traffic; best_effort = no reservation."
    )
    reserved_mu_per_min: dict[str, float] = Field(
        default_factory=dict, description="Guaranteed MU per minute, per deployment (model name)."
    )
    best_effort_mu_per_min: float | None = Field(
        default=0.0,
        ge=0,
        description="Best-effort allowance beyond the reservation (idle capacity only); null = no own cap.",
    )
    requests_per_minute: float | None = Field(default=None, gt=0, description="Optional requests/min limit.")
    tokens_per_minute: float | None = Field(default=None, gt=0, description="Optional tokens/min limit.")
    weight: float = Field(default=1.0, gt=0, description="Fair-share weight within its priority class.")
    burst_s: float | None = Field(
        default=None, ge=0, description="Burst in seconds of its rates (default: admission.burst_s)."
    )

    api_keys_file: str | None = Field(
        default=None,
        description="File with more API keys, one per line (`#` comments; plain or `sha256:<hex>`), e.g. a "
        "mounted Kubernetes Secret; re-read while the gateway runs, so keys rotate without a restart.",
    )

    @field_validator("api_keys", mode="before")
    @classmethod
    def _one_key(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value  # FLEETGATE__TENANTS__0__API_KEYS=<one key>

    @field_validator("api_keys")
    @classmethod
    def _hash_keys(cls, value: list[str]) -> list[str]:
        return [hash_api_key(v) for v in value]

    @field_validator("reserved_mu_per_min")
    @classmethod
    def _non_negative(cls, value: dict[str, float]) -> dict[str, float]:
        for model, mu in value.items():
            if not mu >= 0:
                raise ValueError(f"reservation for {model!r} must be >= 0")
        return value


class AdmissionStoreConfig(_Strict):
    """Where admission state (buckets, usage) lives: this process, or Redis shared by gateway replicas."""

    kind: Literal["memory", "redis"] = Field(default="memory", description="memory (default) or redis.")
    url: str = Field(default="redis://127.0.0.1:6379/0", description="Redis URL (kind: redis).")
    namespace: str = Field(default="fleetgate", min_length=1, description="Prefix of every Redis key.")
    fail_open: bool = Field(
        default=False,
        description="When Redis is unreachable: true admits (unlimited), false rejects with 503.",
    )
    timeout_s: float = Field(default=0.25, gt=0, description="Redis connect/command timeout.")
    server_time: bool = Field(
        default=True, description="Use Redis' clock in the scripts (one clock for all gateway replicas)."
    )
    lease_ttl_s: float = Field(
        default=60.0,
        gt=0,
        description="Redis: an admitted request's charge is a lease that its gateway renews while the "
        "request runs; a gateway that dies (kill -9) leaves leases that lapse after this long, refunded.",
    )


class AdmissionConfig(_Strict):
    """Admission: queue bounds, deadlines, bursts, best-effort ceiling, admin keys and the state store."""

    store: AdmissionStoreConfig = Field(default_factory=AdmissionStoreConfig)
    admin_api_keys: list[str] = Field(
        default_factory=list, description="Admin API keys (`sha256:<hex>` or plain, hashed at load)."
    )
    admin_api_keys_file: str | None = Field(
        default=None,
        description="File with more admin API keys, one per line (re-read like `api_keys_file`).",
    )
    queue_max: int = Field(default=1000, ge=0, description="Requests that may wait for admission at once.")
    deadline_s: float = Field(default=10.0, ge=0, description="Longest wait in the admission queue.")
    burst_s: float = Field(
        default=0.0, ge=0, description="Burst in seconds of a tenant's rate (0: one request at a time)."
    )
    best_effort_max_utilization: float = Field(
        default=0.8, gt=0, le=1, description="Best-effort admitted while the fleet is below this use."
    )
    fleet_burst_s: float = Field(default=2.0, ge=0, description="Burst of the fleet meter (s).")
    latency_headroom: LatencyHeadroomConfig = Field(default_factory=LatencyHeadroomConfig)

    @field_validator("admin_api_keys", mode="before")
    @classmethod
    def _one_key(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("admin_api_keys")
    @classmethod
    def _hash_keys(cls, value: list[str]) -> list[str]:
        return [hash_api_key(v) for v in value]


class LocalConfig(_Strict):
    """Deprecated (read by `fleetgate up` for one release): write the deployment's `provider: {kind: local,
    ...}` and `autoscaler:` instead (the same keys)."""

    engine_args: list[str] = Field(
        default_factory=list,
        description="Extra arguments for each `fleetgate engine sim` replica, e.g. ['--time-scale', '0.5'].",
    )
    command: list[str] | None = Field(
        default=None,
        description="Command template of one replica instead of the simulated engine ({port}, {model}, "
        "{name} are filled in; readiness is a 200 from GET /health).",
    )
    ready_timeout_s: float = Field(default=60.0, gt=0, description="Longest wait for a replica to be ready.")
    stop_timeout_s: float = Field(default=5.0, gt=0, description="SIGTERM-to-SIGKILL delay when stopping.")
    autoscaler: AutoscalerConfig | None = Field(
        default=None,
        description="Autoscale the local replicas: the policy and its parameters, e.g. `{policy: fleetgate, "
        "min_replicas: 1, max_replicas: 4}` (none: keep --replicas fixed). The older form `autoscaler: NAME` "
        "with `autoscaler_params: {...}` is still read.",
    )

    @model_validator(mode="before")
    @classmethod
    def _autoscaler_by_name(cls, data: Any) -> Any:
        """``autoscaler: fleetgate`` + ``autoscaler_params: {...}`` (the older form) -> one typed mapping."""
        if not isinstance(data, Mapping) or (
            "autoscaler_params" not in data and not isinstance(data.get("autoscaler"), str)
        ):
            return data
        data = dict(data)
        params = data.pop("autoscaler_params", None) or {}
        name = data.get("autoscaler")
        if isinstance(name, str):
            if not isinstance(params, Mapping):
                raise ValueError("autoscaler_params must be a mapping")
            data["autoscaler"] = {**params, "policy": name}
        elif params:
            raise ValueError("autoscaler_params needs `autoscaler: NAME` (or put them in `autoscaler:`)")
        return data


class ImageTargetConfig(_Strict):
    """What a deployment's vision encoder wants: size cap, output encoding, patch geometry (image tokens)."""

    max_edge: int = Field(default=336, ge=16, le=16384, description="Longest side after resizing (px).")
    output_format: Literal["jpeg", "png", "webp", "original"] = Field(
        default="jpeg",
        description="Re-encoding sent to the engine; `original` forwards unchanged bytes if "
        "no resize was needed.",
    )
    jpeg_quality: int = Field(default=90, ge=1, le=100, description="JPEG/WebP quality of the re-encoding.")
    patch_size: int = Field(default=14, ge=1, description="Vision encoder patch size (px).")
    merge_size: int = Field(default=1, ge=1, description="Patches merged per side per token (Qwen2-VL: 2).")
    fixed_tokens: int | None = Field(
        default=None, ge=1, description="Tokens per image regardless of size (LLaVA-1.5: 576)."
    )
    extra_tokens: int = Field(default=0, ge=0, description="Begin/end marker tokens per image.")


class MultimodalConfig(_Strict):
    """Image preprocessing: limits, URL fetching policy and the worker process pool."""

    mode: Literal["pool", "naive", "off"] = Field(
        default="pool",
        description="pool: worker processes sized from the container's CPU budget; naive: PIL on the event "
        "loop (a baseline for benchmarks only); off: image parts are forwarded untouched.",
    )
    max_pixels: int = Field(
        default=40_000_000, gt=0, description="Largest decoded image (w*h), checked from the header first."
    )
    max_image_bytes: int = Field(default=10 * 1024 * 1024, gt=0, description="Largest encoded image.")
    max_images_per_request: int = Field(default=16, ge=1, description="Image parts allowed in one request.")
    tenant_image_concurrency: int | None = Field(
        default=None, ge=1, description="One tenant's image requests at once (default: half the workers)."
    )
    allowed_formats: list[str] = Field(
        default_factory=lambda: ["JPEG", "PNG", "WEBP", "GIF", "BMP"],
        description="Pillow format names accepted (anything else is a 400).",
    )
    target: ImageTargetConfig = Field(default_factory=ImageTargetConfig)
    per_model: dict[str, ImageTargetConfig] = Field(
        default_factory=dict, description="Per-deployment overrides of `target`, by model name."
    )
    workers: int | None = Field(default=None, ge=1, description="Worker processes (default: CPU budget).")
    task_timeout_s: float = Field(default=10.0, gt=0, description="Longest processing of one image.")
    worker_memory_mb: int | None = Field(
        default=2048, ge=64, description="Address-space cap of a worker (RLIMIT_AS); null: none."
    )
    worker_nice: int = Field(
        default=5,
        ge=0,
        le=19,
        description="CPU niceness of workers (and SCHED_BATCH when > 0): the event loop is scheduled first.",
    )
    backend: Literal["pillow", "vips", "auto"] = Field(
        default="pillow",
        description="JPEG decoder: pillow (draft, measured as fast as libvips here), vips or auto (pyvips "
        "when installed: `pip install fleetgate[vips]`). Header checks and other formats always use Pillow.",
    )
    prestart: bool = Field(default=False, description="Start the workers with the gateway, not lazily.")
    fetch_urls: bool = Field(default=True, description="Fetch http(s) image URLs (else only data: URLs).")
    fetch_timeout_s: float = Field(default=5.0, gt=0, description="Whole-download limit of one URL.")
    fetch_max_redirects: int = Field(default=3, ge=0, le=10, description="Redirects followed per URL.")
    url_allow: list[str] = Field(
        default_factory=list,
        description="When non-empty, the only hosts/IPs/CIDRs fetched (private ones included), e.g. "
        "['127.0.0.1'] or ['.images.example.com'].",
    )
    url_deny: list[str] = Field(default_factory=list, description="Hosts, IPs or CIDRs always refused.")
    allow_private_networks: bool = Field(
        default=False, description="Allow private, loopback and link-local targets (metadata stays denied)."
    )


class SloConfig(_Strict):
    """Service-level tracking (fleetgate.ops): the sliding window and the time-to-first-token targets."""

    window_s: float = Field(default=60.0, gt=0, description="Sliding window of the SLO figures (s).")
    ttft_target_s: float = Field(
        default=2.0, gt=0, description="Default time-to-first-token target; attainment = share within it."
    )
    tenant_ttft_target_s: dict[str, float] = Field(
        default_factory=dict, description="Per-tenant TTFT targets (s), by tenant name."
    )
    max_tenant_labels: int = Field(
        default=20, ge=1, description="Tenants named in Prometheus labels (the rest are `other`)."
    )
    max_samples: int = Field(default=100_000, ge=100, description="Requests kept in the window at most.")


class OpsConfig(_Strict):
    """Operations: SLO tracking, the /admin/status and /ui pages, structured logs."""

    slo: SloConfig = Field(default_factory=SloConfig)
    ui: bool = Field(default=True, description="Serve the status page at /ui (data needs the admin key).")
    log_format: Literal["json", "text"] = Field(default="json", description="Log line format.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description="Log level.")
    access_log: bool = Field(
        default=True,
        description="One log line per proxied request (request id, tenant, replica, status, timings, MU; "
        "never prompt text or keys).",
    )


class PoolConfig(_Strict):
    """A finite set of GPUs shared by the deployments that name it (docs/capacity.md)."""

    name: str = Field(min_length=1, description="Pool name deployments refer to (`deployments[].pool`).")
    gpus: int = Field(ge=1, description="GPUs in the pool.")
    reclaim_after_s: float = Field(
        default=60.0,
        ge=0,
        description="Under `fleetgate serve`: a deployment below its fair share of the pool this long "
        "reclaims replicas (drained first) from those above theirs; floors never wait.",
    )
    lend_idle_gpus: bool = Field(
        default=True,
        description="Under `fleetgate serve`: GPUs left idle after floors and demand run warm headroom "
        "replicas of the deployments with an autoscaler (up to its `max_replicas`), drained first when a "
        "demand or a floor needs the GPUs.",
    )


class FleetgateConfig(_Strict):
    """The whole configuration tree."""

    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    pools: list[PoolConfig] = Field(
        default_factory=list,
        description="GPU pools; reservations on their deployments may not oversell them.",
    )
    deployments: list[DeploymentConfig] = Field(default_factory=list)
    local: LocalConfig = Field(
        default_factory=LocalConfig, description="Deprecated: `deployments[].provider` with `kind: local`."
    )
    tenants: list[TenantConfig] = Field(default_factory=list, description="Tenants (none: no auth).")
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    multimodal: MultimodalConfig = Field(default_factory=MultimodalConfig)
    ops: OpsConfig = Field(default_factory=OpsConfig, description="SLOs, status page, logs.")

    def deployment(self, model: str) -> DeploymentConfig | None:
        """The deployment serving ``model``, if any."""
        for dep in self.deployments:
            if dep.model == model:
                return dep
        return None


class ConfigError(Exception):
    """A configuration that cannot be loaded; the message lists every problem, one per line."""


def _apply_env(data: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Apply ``FLEETGATE__A__B=value`` overrides. A numeric part indexes a list
    (``FLEETGATE__TENANTS__0__API_KEYS__0``): an existing item is updated, the next index appends one."""
    overrides = []
    for key, raw in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        path = [part.lower() for part in key[len(ENV_PREFIX) :].split("__") if part]
        if path:
            overrides.append((path, key, raw))
    # Lower indexes first, so that ..._0 and ..._1 build a list in order whatever the environment's order.
    overrides.sort(key=lambda o: [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in o[0]])
    for path, key, raw in overrides:
        node: Any = data
        for depth, part in enumerate(path):
            last = depth == len(path) - 1
            fresh: Any = None if last else ([] if path[depth + 1].isdigit() else {})
            if part.isdigit():
                if not isinstance(node, list):
                    raise ConfigError(f"{key}: {'.'.join(path[:depth]) or '<root>'} is not a list")
                index = int(part)
                if index > len(node):
                    raise ConfigError(f"{key}: index {index} skips items (the list has {len(node)})")
                if index == len(node):
                    node.append(fresh)
                if last:
                    node[index] = yaml.safe_load(raw)
                elif not isinstance(node[index], dict | list):
                    node[index] = fresh
                node = node[index]
            else:
                if not isinstance(node, dict):
                    raise ConfigError(f"{key}: {'.'.join(path[:depth]) or '<root>'} is not a mapping")
                if last:
                    node[part] = yaml.safe_load(raw)
                elif not isinstance(node.get(part), dict | list):
                    node[part] = fresh
                node = node[part]
    return data


def format_validation_error(exc: ValidationError) -> str:
    """One readable line per problem: ``gateway.port: Input should be less than or equal to 65535``."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        lines.append(f"{loc}: {err['msg']}")
    return "\n".join(lines)


def parse_config(data: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> FleetgateConfig:
    """Validate a config mapping (plus env overrides) into a ``FleetgateConfig``; every problem is
    reported at once, each with its path (field checks, then the cross-field ones of ``config_problems``)."""
    merged = _apply_env(copy.deepcopy(dict(data or {})), env or {})
    try:
        cfg = FleetgateConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from exc
    from fleetgate.config_checks import config_problems

    problems = config_problems(cfg)
    if problems:
        raise ConfigError("\n".join(problems))
    return cfg


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
