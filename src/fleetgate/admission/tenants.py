"""Tenants and API keys: ``Authorization: Bearer <key>`` -> tenant. Keys are only ever held as SHA-256.

API keys are long random secrets, so one unsalted SHA-256 is the usual choice (as for GitHub or Stripe
tokens): a leaked config or Redis dump does not reveal them, and lookup stays one hash and one dict probe.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from fleetgate.config import TenantConfig
from fleetgate.core.admission import ANONYMOUS, TenantLimits
from fleetgate.core.errors import AuthenticationError
from fleetgate.core.types import Priority


def hash_api_key(key: str) -> str:
    """``sha256:<hex>`` of a plain key (the form the config keeps)."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Tenant:
    """An authenticated caller: its ``limits`` drive admission; ``admin`` may use the admin API."""

    name: str
    limits: TenantLimits = field(default=ANONYMOUS)
    admin: bool = False

    @property
    def priority(self) -> Priority:
        return self.limits.priority

    def public(self) -> dict[str, object]:
        """What the admin API shows about a tenant (never key hashes)."""
        lim = self.limits
        be = lim.best_effort_mu_per_min
        return {
            "name": self.name,
            "priority": str(lim.priority),
            "reserved_mu_per_min": dict(lim.reserved_mu_per_min),
            "best_effort_mu_per_min": be if math.isfinite(be) else None,
            "requests_per_minute": lim.requests_per_minute,
            "tokens_per_minute": lim.tokens_per_minute,
            "weight": lim.weight,
        }


ANONYMOUS_TENANT = Tenant("anonymous", ANONYMOUS)
ADMIN_TENANT = Tenant("admin", TenantLimits(name="admin", unlimited=True), admin=True)


def bearer_token(authorization_header: str | None) -> str | None:
    """The key in ``Authorization: Bearer <key>`` (scheme case-insensitive), else ``None``."""
    if not authorization_header:
        return None
    scheme, _, token = authorization_header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


class TenantDirectory:
    """Key hash -> tenant. With no tenants configured everyone is the anonymous, unlimited tenant."""

    def __init__(self, tenants: Iterable[tuple[Tenant, Iterable[str]]], admin_key_hashes: Iterable[str] = ()):
        self._by_hash: dict[str, Tenant] = {}
        self._tenants: dict[str, Tenant] = {}
        for tenant, hashes in tenants:
            self._tenants[tenant.name] = tenant
            for h in hashes:
                self._by_hash[h] = tenant
        for h in admin_key_hashes:
            self._by_hash[h] = ADMIN_TENANT
        self._keyed = False  # keys were set from a key file: never open again, even if the file empties

    @property
    def open(self) -> bool:
        """No tenants and no admin keys: no authentication at all."""
        return not self._by_hash and not self._keyed

    def set_keys(self, tenant: str | None, key_hashes: Iterable[str]) -> None:
        """Replace every key of ``tenant`` (``None``: the admin keys), e.g. after a key file changed. A hash
        that another tenant owns is a ``ValueError`` and nothing changes."""
        owner = ADMIN_TENANT if tenant is None else self._tenants[tenant]
        wanted = set(key_hashes)
        for h in wanted:
            current = self._by_hash.get(h)
            if current is not None and current is not owner:
                raise ValueError(f"a key of {owner.name!r} is already the key of {current.name!r}")
        for h in [h for h, t in self._by_hash.items() if t is owner and h not in wanted]:
            del self._by_hash[h]
        for h in wanted:
            self._by_hash[h] = owner
        self._keyed = True

    def set_reservations(self, name: str, reserved: Mapping[str, float]) -> Tenant:
        """Replace the tenant's reservations (MU/min per model), its keys kept; returns the new tenant."""
        old = self._tenants[name]
        new = Tenant(old.name, replace(old.limits, reserved_mu_per_min=dict(reserved)), old.admin)
        self._tenants[name] = new
        for h in [h for h, t in self._by_hash.items() if t is old]:
            self._by_hash[h] = new
        return new

    def tenants(self) -> Mapping[str, Tenant]:
        return dict(self._tenants)

    def get(self, name: str) -> Tenant | None:
        return self._tenants.get(name)

    def authenticate(self, authorization_header: str | None) -> Tenant:
        """The tenant owning the bearer key; raises ``AuthenticationError`` (401) otherwise."""
        if self.open:
            return ANONYMOUS_TENANT
        token = bearer_token(authorization_header)
        if token is None:
            raise AuthenticationError(
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
                code="missing_api_key",
            )
        tenant = self._by_hash.get(hash_api_key(token))
        if tenant is None:
            shown = (
                token[:3] + "*" * max(0, min(len(token), 12) - 7) + token[-4:] if len(token) > 8 else "****"
            )
            raise AuthenticationError(f"Incorrect API key provided: {shown}.")
        return tenant

    def sold_mu_per_min(self, model: str) -> float:
        """Sum of the reservations on ``model`` (the capacity ledger's 'sold')."""
        return math.fsum(t.limits.reservation(model) for t in self._tenants.values())

    @classmethod
    def from_config(
        cls, tenants: Iterable[TenantConfig], admin_key_hashes: Iterable[str] = ()
    ) -> TenantDirectory:
        """Build from ``config.TenantConfig`` objects (keys already hashed by the config)."""
        rows: list[tuple[Tenant, list[str]]] = []
        for tc in tenants:
            name: str = tc.name
            be = tc.best_effort_mu_per_min
            limits = TenantLimits(
                name=name,
                priority=Priority(tc.priority),
                reserved_mu_per_min=dict(tc.reserved_mu_per_min),
                best_effort_mu_per_min=math.inf if be is None else float(be),
                requests_per_minute=tc.requests_per_minute,
                tokens_per_minute=tc.tokens_per_minute,
                weight=tc.weight,
                burst_s=tc.burst_s,
            )
            rows.append((Tenant(name, limits), list(tc.api_keys)))
        return cls(rows, admin_key_hashes)
