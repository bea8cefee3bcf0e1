"""The gateway's operations surface: SLO observation hook, ``GET /admin/status`` and the ``/ui`` page.

Wiring (the composition root, ``runtime.build_gateway``): ``Ops`` is built with what it reports on (fleet,
admission, autoscaler loops) and handed to the proxy, which calls ``Ops.observe`` once per finished request;
``Ops.install`` adds the SLO gauges to the gateway's Prometheus registry and the routes to its app.

Access: ``/admin/status`` needs the admin key (``Authorization: Bearer <admin key>``); in open mode (no
tenants and no admin keys configured, so no key exists at all) it is open like everything else. ``/ui`` is a
static shell that holds no data: it asks for the key (or takes ``?key=`` once, moves it to sessionStorage and
removes it from the address bar) and polls ``/admin/status`` with it. The gateway writes no access log of
query strings.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry

from fleetgate.config import OpsConfig
from fleetgate.core.errors import PermissionDeniedError
from fleetgate.ops.logging import request_context_middleware
from fleetgate.ops.metrics import SloCollector
from fleetgate.ops.slo import SloTracker, classify
from fleetgate.ops.status import TenantInfo, build_status

if TYPE_CHECKING:
    from fleetgate.autoscaler.loop import AutoscalerLoop
    from fleetgate.gateway.admission import Admission
    from fleetgate.gateway.fleet import Fleet

access_log = logging.getLogger("fleetgate.access")

STATUS_CACHE_S = 0.5  # the page polls every 1.5 s; a summary of a full window takes ~0.1 s

_STATIC_TYPES = {".html": "text/html", ".js": "application/javascript", ".css": "text/css"}


def _load_static() -> dict[str, tuple[bytes, str]]:
    files: dict[str, tuple[bytes, str]] = {}
    root = resources.files("fleetgate.ops") / "static"
    for entry in root.iterdir():
        name = entry.name
        suffix = name[name.rfind(".") :] if "." in name else ""
        if suffix in _STATIC_TYPES and entry.is_file():
            files[name] = (entry.read_bytes(), _STATIC_TYPES[suffix])
    return files


class Ops:
    """SLO window, status document and routes of one gateway, built with everything it reports on."""

    def __init__(
        self,
        config: OpsConfig | None = None,
        *,
        fleet: Fleet,
        admission: Admission,
        clock: Callable[[], float],
        autoscalers: Mapping[str, AutoscalerLoop] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.fleet = fleet
        self.admission = admission
        self.autoscalers: Mapping[str, AutoscalerLoop] = dict(autoscalers or {})
        self.config = config or OpsConfig()
        slo = self.config.slo
        self.tracker = SloTracker(
            window_s=slo.window_s,
            ttft_target_s=slo.ttft_target_s,
            tenant_ttft_target_s=dict(slo.tenant_ttft_target_s),
            max_samples=slo.max_samples,
        )
        self.clock = clock
        self.tracker.started_s = self.clock()
        self.wall_clock = wall_clock
        self._static = _load_static() if self.config.ui else {}
        self._status_cache: tuple[float, dict[str, Any]] | None = None

    # -- the request hook ---------------------------------------------------------------------------------

    def observe(
        self,
        *,
        request_id: str,
        tenant: str,
        deployment: str,
        replica: str,
        endpoint: str,
        status: int,
        start: float,
        end: float,
        ttft_s: float | None = None,
        output_tokens: int | None = None,
        mu: float | None = None,
        error_kind: str | None = None,
    ) -> None:
        """One finished request (called by the proxy). Unauthenticated or unknown-model calls are skipped."""
        if tenant and deployment and deployment != "unknown":
            outcome = classify(status, dispatched=bool(replica), error_kind=error_kind)
            self.tracker.record(
                end, tenant, deployment, replica, outcome, end - start, ttft_s, output_tokens, mu or 0.0
            )
        if self.config.access_log and access_log.isEnabledFor(logging.INFO):
            fields = {
                "request_id": request_id,
                "tenant": tenant or None,
                "deployment": deployment,
                "replica": replica or None,
                "endpoint": endpoint,
                "status": status,
                "error_kind": error_kind,
                "ttft_s": None if ttft_s is None else round(ttft_s, 4),
                "e2e_s": round(end - start, 4),
                "output_tokens": output_tokens,
                "mu": None if mu is None else round(mu, 4),
            }
            # makeRecord + handle: what Logger.info does, minus its stack walk for the caller (per request)
            record = access_log.makeRecord(
                access_log.name, logging.INFO, __file__, 0, "request finished", (), None, extra=fields
            )
            access_log.handle(record)

    # -- data ---------------------------------------------------------------------------------------------

    def tenants(self) -> list[TenantInfo]:
        return [
            TenantInfo(name=t.name, priority=t.priority, reserved_mu_per_min=dict(t.reserved_mu_per_min))
            for t in self.admission.tenant_summaries()
        ]

    def reservations(self) -> dict[str, dict[str, float]]:
        return {t.name: dict(t.reserved_mu_per_min or {}) for t in self.tenants()}

    def status(self) -> dict[str, Any]:
        """The status document, computed at most once per ``STATUS_CACHE_S`` (several open pages share it)."""
        now = self.clock()
        cached = self._status_cache
        if cached is not None and 0 <= now - cached[0] < STATUS_CACHE_S:
            return cached[1]
        doc = self._build_status()
        self._status_cache = (now, doc)
        return doc

    def _build_status(self) -> dict[str, Any]:
        info: dict[str, Any] | None = None
        depth = self.admission.queue_length()
        if depth is not None:
            info = {"queue_depth": depth}
            overview = self.admission.capacity_overview()
            if overview is not None:
                info["deployments"] = overview
        return build_status(
            now=self.clock(),
            wall_time=self.wall_clock(),
            fleet=self.fleet,
            tracker=self.tracker,
            tenants=self.tenants(),
            autoscalers=self.autoscalers,
            admission=info,
        )

    # -- HTTP ---------------------------------------------------------------------------------------------

    def authorize(self, request: web.Request) -> None:
        """Admin key only (raises 401/403 as OpenAI-style errors); open when no key is configured at all."""
        admission = self.admission
        if admission.open:
            return  # open mode: no tenants, no admin keys
        caller = admission.authenticate(request.headers.get("Authorization"))
        if not admission.is_admin(caller):
            raise PermissionDeniedError("This endpoint needs the admin API key.", code="admin_only")

    async def handle_status(self, request: web.Request) -> web.Response:
        self.authorize(request)
        body = orjson.dumps(self.status(), option=orjson.OPT_NON_STR_KEYS)
        return web.Response(body=body, content_type="application/json", headers={"Cache-Control": "no-store"})

    async def handle_ui(self, request: web.Request) -> web.Response:
        return self._file("index.html")

    async def handle_static(self, request: web.Request) -> web.Response:
        return self._file(request.match_info["name"])

    def _file(self, name: str) -> web.Response:
        found = self._static.get(name)
        if found is None:
            raise web.HTTPNotFound()
        body, ctype = found
        return web.Response(
            body=body,
            content_type=ctype,
            headers={
                "Cache-Control": "no-cache",
                "Content-Security-Policy": "default-src 'self'; img-src 'self' data:",
                "Referrer-Policy": "no-referrer",
                "X-Content-Type-Options": "nosniff",
            },
        )

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/admin/status", self.handle_status)
        if self.config.ui:
            app.router.add_get("/ui", self.handle_ui)
            app.router.add_get("/ui/", self.handle_ui)
            app.router.add_get("/ui/{name}", self.handle_static)

    def install(self, app: web.Application, registry: CollectorRegistry) -> None:
        """SLO gauges on ``registry``, request ids in log lines, ``/admin/status`` and ``/ui`` on ``app``
        (called once, by the composition root, before the app starts)."""
        SloCollector(
            self.tracker,
            self.clock,
            self.reservations,
            max_tenants=self.config.slo.max_tenant_labels,
            ledger_use=self.admission.tenant_used_mu_per_min,
        ).register(registry)
        app.middlewares.append(request_context_middleware)
        self.add_routes(app)
