"""Request bodies to ``ParsedRequest``: cheap checks first, heavy work off the event loop.

Order (issue 22, high #1): the caller has authenticated; then the body's shape is bounded (JSON values,
messages, content parts) and its model looked up (unknown: 404) before anything is tokenized or hashed.
Bodies above ``INLINE_BYTES`` go to the parse lane, one worker process (``gateway.parse_worker``) that does
all of that there; the loop only decodes the already validated body again (bounded by the JSON value cap).
One worker, not a pool: concurrent huge bodies queue behind each other and take one core at most. A worker
that dies is replaced; meanwhile the request is parsed on a thread.

Prefix hashes are tenant-scoped unless the deployment shares its prefix cache between tenants
(``prefix_cache_scope: shared``): each tenant's hashes start from its own salt, so cache-aware routing
never sends one tenant's guess to where another's prompt is cached; the same salt goes to engines that
take one (vLLM ``cache_salt``), so the engine's cache does not answer across tenants either.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from hashlib import blake2b
from typing import Any

import orjson

from fleetgate.core.errors import InvalidRequestError
from fleetgate.core.openai import Endpoint, ParsedRequest, RequestLimits, load_json_body, parse_request
from fleetgate.core.tokenize import PromptTokenizer
from fleetgate.gateway import parse_worker
from fleetgate.gateway.fleet import Deployment, Fleet
from fleetgate.orjson_codec import ORJSON

log = logging.getLogger("fleetgate.gateway")

#: Bodies up to this size are parsed on the loop (the hand-over to the lane costs more than their parse).
INLINE_BYTES = 64 * 1024


def tenant_cache_salt(tenant: str) -> str:
    """The cache salt of ``tenant``: stable across gateway replicas and restarts, one per tenant name.

    Clients never choose it (the gateway overwrites any ``cache_salt`` they send), so knowing how it is
    derived gives no access to another tenant's cache entries.
    """
    return "fg-" + blake2b(b"fleetgate-cache-salt\0" + tenant.encode(), digest_size=16).hexdigest()


class RequestParser:
    """Turns a raw body into ``(deployment, ParsedRequest)`` for one tenant; owns the parse lane."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        tokenizer: PromptTokenizer,
        limits: RequestLimits,
        isolate_tenants: bool,
        hashes_for: Callable[[Deployment], bool] | None = None,
        lane_cache_mb: float = 40.0,
    ) -> None:
        self.fleet = fleet
        self.tokenizer = tokenizer
        self.limits = limits
        #: tenants are configured: scope prefix hashes and engine caches per tenant (else one tenant)
        self.isolate_tenants = isolate_tenants
        self._hashes_for = hashes_for if hashes_for is not None else (lambda deployment: True)
        self._lane_cache_mb = lane_cache_mb
        self._lane: ProcessPoolExecutor | None = None

    def close(self) -> None:
        if self._lane is not None:
            self._lane.shutdown(wait=False, cancel_futures=True)
            self._lane = None

    async def parse(self, raw: bytes, endpoint: Endpoint, tenant: str) -> tuple[Deployment, ParsedRequest]:
        """Bounded decode, model lookup, then count and hash (in the lane for large bodies)."""
        if len(raw) <= INLINE_BYTES:
            return self.parse_inline(raw, endpoint, tenant)
        return await self._parse_large(raw, endpoint, tenant)

    def parse_inline(self, raw: bytes, endpoint: Endpoint, tenant: str) -> tuple[Deployment, ParsedRequest]:
        """``parse`` of a body of at most ``INLINE_BYTES``, on the caller's thread (the proxy calls it
        without a coroutine for the common small body)."""
        body = load_json_body(raw, self.limits, ORJSON)
        deployment = self._deployment(body, endpoint)
        isolate = self.isolate_tenants  # (the common case: one tenant, no salt, no salt field to rewrite)
        salt = self._salt(deployment, tenant).encode() if isolate else b""
        parsed = self._parse_with(body, endpoint, deployment, self._hashes_for(deployment), salt)
        if isolate and deployment.config.cache_salt_field:
            parsed = self._with_salt(deployment, tenant, parsed)
        return deployment, parsed

    async def _parse_large(
        self, raw: bytes, endpoint: Endpoint, tenant: str
    ) -> tuple[Deployment, ParsedRequest]:
        routes = {model: self._route(d, tenant) for model, d in self.fleet.deployments.items()}
        try:
            parsed = await self._in_lane(raw, endpoint, routes)
        except parse_worker.NeedsRealTokenizer:  # its tokenizer lives here: a thread of this process
            parsed = await asyncio.get_running_loop().run_in_executor(
                None, self._parse_raw, raw, endpoint, routes
            )
        body = orjson.loads(raw)  # validated in the lane: a JSON object within the value cap
        deployment = self.fleet.get(parsed.model)
        return deployment, self._with_salt(deployment, tenant, replace(parsed, body=body))

    async def _in_lane(self, raw: bytes, endpoint: Endpoint, routes: parse_worker.Routes) -> ParsedRequest:
        loop = asyncio.get_running_loop()
        lane = self._lane
        if lane is None:
            lane = self._lane = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=parse_worker.init,
                initargs=(self._lane_cache_mb,),
            )
        try:
            return await loop.run_in_executor(
                lane, parse_worker.parse_body, raw, endpoint, self.limits, routes
            )
        except BrokenProcessPool:
            log.warning("the parse lane's worker died; starting a new one (this request: on a thread)")
            if self._lane is lane:
                self._lane = None
                lane.shutdown(wait=False, cancel_futures=True)
            thread: Executor | None = None  # the loop's default thread pool
            return await loop.run_in_executor(thread, self._parse_raw, raw, endpoint, routes)

    def _parse_raw(self, raw: bytes, endpoint: Endpoint, routes: parse_worker.Routes) -> ParsedRequest:
        body = load_json_body(raw, self.limits, ORJSON)
        deployment = self._deployment(body, endpoint)
        hashes, salt, _, _ = routes[deployment.model]
        parsed = self._parse_with(body, endpoint, deployment, hashes, salt)
        return replace(parsed, body={}, prompt_text="")

    def _route(self, deployment: Deployment, tenant: str) -> tuple[bool, bytes, int, bool]:
        """(whether its routing reads prefix hashes, the tenant's salt, block size, real tokenizer?)."""
        salt = self._salt(deployment, tenant).encode()
        return self._hashes_for(deployment), salt, deployment.block_tokens, deployment.tokenizer is not None

    def _salt(self, deployment: Deployment, tenant: str) -> str:
        if self.isolate_tenants and deployment.config.prefix_cache_scope != "shared":
            return tenant_cache_salt(tenant)
        return ""

    def _deployment(self, body: dict[str, Any], endpoint: Endpoint) -> Deployment:
        """The deployment asked for (404 when unknown), checked before any tokenizing."""
        model = body.get("model")
        if isinstance(model, str) and model:
            return self.fleet.get(model)
        parse_request(body, endpoint, hashes=False, limits=self.limits)  # names the problem (a 400)
        raise InvalidRequestError("you must provide a model parameter", param="model")

    def _parse_with(
        self, body: dict[str, Any], endpoint: Endpoint, deployment: Deployment, hashes: bool, salt: bytes
    ) -> ParsedRequest:
        return parse_request(
            body,
            endpoint,
            deployment.block_tokens,
            hashes=hashes,
            tokenizer=deployment.tokenizer,  # the model's real tokenizer, where configured
            prompt_tokenizer=self.tokenizer,
            limits=self.limits,
            salt=salt,
        )

    def _with_salt(self, deployment: Deployment, tenant: str, parsed: ParsedRequest) -> ParsedRequest:
        """The body to forward carries the tenant's cache salt (engines that take one), never the client's."""
        field = deployment.config.cache_salt_field
        if not field or not self.isolate_tenants:
            return parsed
        salt = self._salt(deployment, tenant)
        if not salt and field not in parsed.body:
            return parsed
        body = dict(parsed.body)
        if salt:
            body[field] = salt  # never the client's own value: it could name another tenant's salt
        else:
            body.pop(field, None)  # shared scope: no client-chosen salt either
        return replace(parsed, body=body, body_changed=True)
