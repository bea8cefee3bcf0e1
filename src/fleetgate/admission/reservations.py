"""Reservations changed at run time (``PUT/DELETE /admin/tenants/{name}/reservations``, issue 18 item 4).

A change is checked against the GPU pools first: the floors of every pool (the replicas backing what was
sold on its deployments, ``config_checks.pool_shortfalls``, the same arithmetic as config load) must still
fit, else it is refused with the shortfall in GPUs and MU/min (409). An accepted change goes to the admission
store (Redis when configured: every gateway replica reads it and a restart loses none; the in-memory store
otherwise) and into the tenant directory, which admission, the capacity ledger and the pool allocator read.
Every gateway replica re-reads the store every ``refresh_s``, so a change made through one is enforced by
all within that time. The check and the write are one atomic step in the store
(``AdmissionStore.update_reservations``: Redis WATCH/MULTI over the reservations hash, retried when another
writer got in between; a lock in the memory store): of two replicas accepting conflicting changes at the
same instant, one writes and the other decides again on what it wrote, so no pool is oversold.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping

from fleetgate.admission.tenants import TenantDirectory
from fleetgate.config import FleetgateConfig
from fleetgate.config_checks import pool_shortfalls
from fleetgate.core.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    ServiceUnavailableError,
)
from fleetgate.periodic import Periodic
from fleetgate.stores import AdmissionStore, StoreUnavailableError
from fleetgate.stores.base import ReservationChange

log = logging.getLogger("fleetgate.admission.reservations")


class ReservationBook:
    """Checks, stores and applies tenants' reservation changes; keeps every gateway replica in step."""

    def __init__(
        self,
        cfg: FleetgateConfig,
        store: AdmissionStore,
        directory: TenantDirectory,
        *,
        refresh_s: float = 1.0,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.directory = directory
        self.refresh_s = refresh_s
        self.models = {d.model for d in cfg.deployments}
        self._loop = Periodic("reservations", self.refresh, refresh_s, quiet=(StoreUnavailableError,))

    def sold(self) -> dict[str, float]:
        """MU/min reserved per deployment, as the directory has it now."""
        sold: dict[str, float] = {}
        for tenant in self.directory.tenants().values():
            for model, mu in tenant.limits.reserved_mu_per_min.items():
                sold[model] = sold.get(model, 0.0) + mu
        return sold

    async def refresh(self) -> None:
        """Apply the run-time reservations in the store (tenants no longer configured are ignored)."""
        self._apply(await self.store.reservations())

    def _apply(self, stored: Mapping[str, Mapping[str, float]]) -> None:
        for name, reserved in stored.items():
            tenant = self.directory.get(name)
            if tenant is not None and dict(tenant.limits.reserved_mu_per_min) != reserved:
                self.directory.set_reservations(name, reserved)
                log.info("reservations of tenant %s now %s", name, reserved)

    async def start(self) -> None:
        """Refresh now (a restart sees what was changed before it), then every ``refresh_s``."""
        if not self._loop.running:
            with contextlib.suppress(StoreUnavailableError):
                await self.refresh()
            self._loop.start()

    async def stop(self) -> None:
        """Stop refreshing; a refresh under way finishes first (``periodic.Periodic``)."""
        await self._loop.stop()

    def current(self, name: str) -> dict[str, float]:
        tenant = self.directory.get(name)
        if tenant is None:
            raise NotFoundError(f"No tenant named {name!r}.", code="tenant_not_found")
        return dict(tenant.limits.reserved_mu_per_min)

    async def put(self, name: str, changes: object) -> dict[str, float]:
        """Set the MU/min of each model in ``changes`` (0 removes it); the others stay. Returns the
        tenant's reservations after the change."""
        self.current(name)
        wanted = self._parse(changes)

        def change(stored: dict[str, dict[str, float]]) -> dict[str, float]:
            self._apply(stored)  # check against what every gateway replica sold, as of this very read
            new = {**self.current(name), **wanted}
            new = {m: mu for m, mu in new.items() if mu > 0}
            self._check(name, new)
            return new

        return await self._write(name, change)

    async def delete(self, name: str, model: str | None = None) -> dict[str, float]:
        """Drop the tenant's reservation on ``model`` (``None``: all of them); never oversells."""
        self.current(name)

        def change(stored: dict[str, dict[str, float]]) -> dict[str, float]:
            self._apply(stored)
            return {} if model is None else {m: mu for m, mu in self.current(name).items() if m != model}

        return await self._write(name, change)

    # -- internals ---------------------------------------------------------------------------------------

    def _parse(self, changes: object) -> dict[str, float]:
        if not isinstance(changes, Mapping) or not changes:
            raise InvalidRequestError(
                'The body must be a JSON object of model -> MU per minute, e.g. {"chat": 300}.',
                code="invalid_reservations",
            )
        out: dict[str, float] = {}
        for model, mu in changes.items():
            if not isinstance(model, str) or model not in self.models:
                raise InvalidRequestError(
                    f"No deployment serves {model!r}.", param=str(model), code="model_not_found"
                )
            try:
                value = float(mu) if isinstance(mu, int | float) and not isinstance(mu, bool) else math.nan
            except OverflowError:  # an integer too large for a float
                value = math.nan
            if not math.isfinite(value) or value < 0:
                raise InvalidRequestError(
                    f"The reservation on {model!r} must be a number of MU per minute >= 0.",
                    param=model,
                    code="invalid_reservations",
                )
            out[model] = value
        return out

    def _check(self, name: str, new: Mapping[str, float]) -> None:
        """Refuse a change that leaves a pool whose deployments it raises unable to back its floors."""
        old = self.current(name)
        sold = self.sold()
        for model in set(old) | set(new):
            sold[model] = sold.get(model, 0.0) - old.get(model, 0.0) + new.get(model, 0.0)
        raised = {m for m in new if new[m] > old.get(m, 0.0)}
        pools = {d.pool for d in self.cfg.deployments if d.model in raised and d.pool is not None}
        for short in pool_shortfalls(self.cfg, sold):
            if short.pool in pools:
                raise ConflictError(
                    f"Pool {short.pool!r} cannot back this reservation: its reservations would need "
                    f"{short.need_gpus} GPUs, it has {short.gpus} (short by {short.short_gpus} GPUs and "
                    f"{short.short_mu_per_min:.1f} MU/min).",
                    code="pool_oversold",
                    details={"shortfall": short.public()},
                )

    async def _write(self, name: str, change: ReservationChange) -> dict[str, float]:
        try:
            new = await self.store.update_reservations(name, change)
        except StoreUnavailableError as exc:
            raise ServiceUnavailableError(
                f"The admission store is unreachable; reservations cannot change now ({exc})."
            ) from exc
        self.directory.set_reservations(name, new)
        log.info("reservations of tenant %s set to %s", name, new)
        return new
