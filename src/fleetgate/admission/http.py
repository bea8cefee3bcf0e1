"""Admin API routes over an ``AdmissionService`` (mount on the gateway app or on a separate admin app).

- ``GET /admin/tenants``: every tenant's purchase (admin key only).
- ``GET /admin/usage``: an admin sees every tenant; a tenant key sees only its own tenant.
- ``GET /admin/usage/{tenant}``: admin, or that very tenant; any other tenant gets 403 (whether or not the
  name exists, so names cannot be probed).
- ``GET /admin/capacity``: capacity, sold and unsold MU/min per deployment (admin key only).
- ``GET / PUT / DELETE /admin/tenants/{tenant}/reservations`` (``DELETE .../reservations/{model}``): a
  tenant's reservations at run time (admin key only); PUT ``{model: mu_per_min}`` sets those models (0
  removes one) and answers 409 with the shortfall when a GPU pool could not back it (``reservations``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Mapping

import orjson
from aiohttp import web

from fleetgate.admission.reservations import ReservationBook
from fleetgate.admission.service import AdmissionService
from fleetgate.admission.tenants import Tenant
from fleetgate.capacity_loop import PoolLoop
from fleetgate.core.errors import FleetgateError, NotFoundError, PermissionDeniedError
from fleetgate.core.openai import load_json_body
from fleetgate.gateway.errors import error_response
from fleetgate.orjson_codec import ORJSON

SERVICE_KEY: web.AppKey[AdmissionService] = web.AppKey("fleetgate_admission", AdmissionService)
#: the GPU pool loops by pool name (``capacity_loop``), for the pools section of ``/admin/capacity``
POOLS_KEY: web.AppKey[Mapping[str, PoolLoop]] = web.AppKey("fleetgate_pools")


def _json(data: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY),
        content_type="application/json",
        headers=headers,
    )


def _error(exc: FleetgateError) -> web.Response:
    return error_response(exc)


def _caller(request: web.Request) -> tuple[AdmissionService, Tenant]:
    service = request.app[SERVICE_KEY]
    return service, service.authenticate(request.headers.get("Authorization"))


def _admin_only(tenant: Tenant) -> None:
    if not tenant.admin:
        raise PermissionDeniedError("This endpoint needs the admin API key.", code="admin_only")


async def tenants(request: web.Request) -> web.Response:
    try:
        service, caller = _caller(request)
        _admin_only(caller)
        return _json({"tenants": [t.public() for t in service.directory.tenants().values()]})
    except FleetgateError as exc:
        return _error(exc)


async def usage(request: web.Request) -> web.Response:
    try:
        service, caller = _caller(request)
        if caller.admin:
            return _json(await service.overview())
        if service.directory.get(caller.name) is None:  # anonymous (no tenants configured)
            raise PermissionDeniedError("No tenants are configured.", code="no_tenants")
        return _json(await service.usage(caller.name))
    except FleetgateError as exc:
        return _error(exc)


async def tenant_usage(request: web.Request) -> web.Response:
    try:
        service, caller = _caller(request)
        name = request.match_info["tenant"]
        if not caller.admin and caller.name != name:
            raise PermissionDeniedError("A tenant may only read its own usage.", code="forbidden")
        if service.directory.get(name) is None:
            raise NotFoundError(f"No tenant named {name!r}.", code="tenant_not_found")
        return _json(await service.usage(name))
    except FleetgateError as exc:
        return _error(exc)


async def capacity(request: web.Request) -> web.Response:
    try:
        service, caller = _caller(request)
        _admin_only(caller)
        return _json(
            {
                "deployments": service.capacity_overview(),
                "pools": _pools(service, request.app.get(POOLS_KEY, {})),
                "queue_depth": service.queue_depth,
            }
        )
    except FleetgateError as exc:
        return _error(exc)


def _pools(service: AdmissionService, pools: Mapping[str, PoolLoop]) -> list[dict[str, object]]:
    """Each pool's ledger from its last decision: capacity, sold, guaranteed, used, headroom, reclaimed,
    per deployment and tenant (``decided: false`` before the first one). A gateway that does not lead the
    pool shows the leader's last published decision and history (``from_leader: true``; with a Redis
    store, ``FleetLedger.share_pools``), its tenants' used from the fleet-wide ledger."""
    out: list[dict[str, object]] = []
    reserved = {t.name: t.limits.reserved_mu_per_min for t in service.directory.tenants().values()}
    for name, loop in sorted(pools.items()):
        view = loop.last
        used_scope = {m.model: service.used_by_tenant(m.model) for m in loop.plan.members}
        used = {model: by_tenant for model, (by_tenant, _) in used_scope.items()}
        scopes = {scope for _, scope in used_scope.values()}
        scope = "fleet" if scopes == {"fleet"} else "gateway"
        if view is not None:
            report = view.report(used)
            history = loop.recent(loop.clock())
            extra: dict[str, object] = {}
        else:
            doc = None if service.fleet_ledger is None else service.fleet_ledger.pool_view(name)
            if doc is None:
                out.append({"pool": name, "gpus": loop.plan.gpus, "decided": False})
                continue
            published = orjson.loads(doc)
            report = published["report"]
            age = max(0.0, time.time() - float(published["published_s"]))
            keys = ("t", "capacity_mu_per_min", "sold_mu_per_min", "used_mu_per_min", "gpus_used")
            history = [dict(zip(keys, (p[0] - age, *p[1:]), strict=True)) for p in published["history"]]
            for dep in report["deployments"]:
                dep["tenants"] = [
                    {"tenant": t, "used_mu_per_min": mu}
                    for t, mu in sorted(used.get(dep["deployment"], {}).items())
                ]
            extra = {"from_leader": True, "published_s_ago": age}
        for dep in report["deployments"]:  # type: ignore[attr-defined]
            model = dep["deployment"]
            rows = {row["tenant"]: row for row in dep["tenants"]}
            for tenant, mus in reserved.items():
                if model in mus:
                    rows.setdefault(tenant, {"tenant": tenant, "used_mu_per_min": 0.0})
            for tenant, row in rows.items():
                row["reserved_mu_per_min"] = reserved.get(tenant, {}).get(model, 0.0)
            dep["tenants"] = [rows[t] for t in sorted(rows)]
        out.append({**report, "decided": True, "used_scope": scope, "history": history, **extra})
    return out


def _pool_documents(pools: Mapping[str, PoolLoop]) -> dict[str, bytes]:
    """What this gateway publishes for followers: per pool it leads now, its last decision's report (no
    tenants: each gateway adds them from the fleet-wide ledger) and its history, rounded (compact)."""
    out: dict[str, bytes] = {}
    wall = time.time()
    for name, loop in pools.items():
        view = loop.last
        if view is None or (loop.leading is not None and not loop.leading()):
            continue
        now = loop.clock()
        history = [
            [round(t - now, 3), round(c, 3), round(s, 3), round(u, 3), g] for t, c, s, u, g in loop.history
        ]
        out[name] = orjson.dumps({"published_s": wall, "report": view.report(), "history": history})
    return out


def _book(service: AdmissionService) -> ReservationBook:
    if service.reservations is None:
        raise NotFoundError("Reservations cannot be changed on this gateway.", code="no_reservation_book")
    return service.reservations


#: A reservation handler: the request, the gateway's reservation book and the tenant named in the path;
#: answers that tenant's reservations after the call.
ReservationHandler = Callable[[web.Request, ReservationBook, str], Awaitable[Mapping[str, float]]]


def _reservation_route(handler: ReservationHandler) -> Callable[[web.Request], Awaitable[web.Response]]:
    """Admin key only; ``{tenant, reserved_mu_per_min}`` on success, else the error's OpenAI-style body."""

    @functools.wraps(handler)
    async def route(request: web.Request) -> web.Response:
        try:
            service, caller = _caller(request)
            _admin_only(caller)
            name = request.match_info["tenant"]
            reserved = await handler(request, _book(service), name)
            return _json({"tenant": name, "reserved_mu_per_min": dict(reserved)})
        except FleetgateError as exc:
            return _error(exc)

    return route


@_reservation_route
async def get_reservations(request: web.Request, book: ReservationBook, name: str) -> Mapping[str, float]:
    return book.current(name)


@_reservation_route
async def put_reservations(request: web.Request, book: ReservationBook, name: str) -> Mapping[str, float]:
    return await book.put(name, load_json_body(await request.read(), codec=ORJSON))


@_reservation_route
async def delete_reservations(request: web.Request, book: ReservationBook, name: str) -> Mapping[str, float]:
    return await book.delete(name, request.match_info.get("model"))


def add_admin_routes(
    app: web.Application,
    service: AdmissionService,
    *,
    with_capacity: bool = True,
    pools: Mapping[str, PoolLoop] | None = None,
) -> None:
    """Mount the admin routes on ``app`` (set ``with_capacity=False`` if the app serves its own;
    ``pools``: the GPU pool loops ``/admin/capacity`` reports)."""
    app[SERVICE_KEY] = service
    app[POOLS_KEY] = pools or {}
    if pools and service.fleet_ledger is not None:  # a shared store: every gateway shows the leader's pools
        service.fleet_ledger.share_pools(sorted(pools), functools.partial(_pool_documents, pools))
    app.router.add_get("/admin/tenants", tenants)
    app.router.add_get("/admin/usage", usage)
    app.router.add_get("/admin/usage/{tenant}", tenant_usage)
    reservations = "/admin/tenants/{tenant}/reservations"
    app.router.add_get(reservations, get_reservations)
    app.router.add_put(reservations, put_reservations)
    app.router.add_delete(reservations, delete_reservations)
    app.router.add_delete(reservations + "/{model}", delete_reservations)
    if with_capacity:
        app.router.add_get("/admin/capacity", capacity)


def build_admin_app(service: AdmissionService) -> web.Application:
    """A stand-alone admin app (for a separate admin port)."""
    app = web.Application()
    add_admin_routes(app, service)
    return app
