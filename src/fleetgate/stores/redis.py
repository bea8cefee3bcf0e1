"""Admission state in Redis, shared by gateway replicas: one limit for the whole fleet of gateways.

The Lua scripts below are the same arithmetic as ``fleetgate.core.admission`` (``drain``, ``threshold``,
``take_all``, ``adjust_all``), run atomically inside Redis. Each bucket is a hash ``{l: level, t: updated}``
whose TTL lasts until it has drained (plus a margin), so idle tenants leave no keys behind. By default the
scripts read Redis' own clock (``TIME``), so gateways with skewed clocks still share one timeline.

Every admitted charge is also a *lease* (``<namespace>:leases``, a sorted set by expiry, and one hash per
lease with the meters and amounts it charged). The gateway renews the leases of requests still running;
settling ends the lease. A gateway killed before settling (kill -9) renews nothing, so its leases lapse
after ``lease_ttl_s`` and the next script run refunds them: a tenant is never left blocked by an estimate
that no one will settle. (Lease hashes are touched by key name from inside the scripts, which is fine on
one Redis or a Sentinel-managed primary, not on Redis Cluster.)

Unreachable Redis raises ``StoreUnavailableError`` quickly (short timeouts; after a failure the store waits
``retry_interval_s`` before trying again instead of stalling every request), and recovers by itself: the next
try after the interval reconnects.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, WatchError

from fleetgate.core.admission import MIN_RETRY_AFTER_S, BucketState, Charge, TakeOutcome
from fleetgate.core.capacity.ledger import USED_BUCKET_S
from fleetgate.stores.base import ReservationChange, SettledUse, StoreUnavailableError

log = logging.getLogger("fleetgate.admission.redis")

# Shared helpers: clock, drain. ARGV[1] = now (negative: use Redis TIME).
_PRELUDE = """
local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local EPS = 1e-9
local MARGIN = 60
local function fmt(x) return string.format('%.17g', x) end
local function load(key, rate)
  local v = redis.call('HMGET', key, 'l', 't')
  local level = tonumber(v[1]) or 0
  local upd = tonumber(v[2]) or now
  local el = now - upd
  if el > 0 then
    level = math.max(0, level - rate * el)
    upd = now
  end
  return level, upd
end
local function store(key, level, upd, rate)
  local t = math.max(now, upd)
  redis.call('HSET', key, 'l', fmt(level), 't', fmt(t))
  redis.call('PEXPIRE', key, math.ceil((level / rate + MARGIN) * 1000))
end
-- Leases: a zset (member = lease id, score = expiry) and per lease a hash (bucket key -> "rate amount").
-- Refund up to 64 lapsed leases (their gateway died before settling).
local function sweep(zkey, hprefix)
  local ids = redis.call('ZRANGEBYSCORE', zkey, '-inf', now, 'LIMIT', 0, 64)
  for _, id in ipairs(ids) do
    local h = hprefix .. id
    local v = redis.call('HGETALL', h)
    for i = 1, #v, 2 do
      local r, a = string.match(v[i + 1], '(%S+) (%S+)')
      local rate, amount = tonumber(r), tonumber(a)
      local level, upd = load(v[i], rate)
      store(v[i], math.max(0, level - amount), upd, rate)
    end
    redis.call('DEL', h)
    redis.call('ZREM', zkey, id)
  end
end
"""

# KEYS: n bucket keys [+ usage key]. ARGV: now, n, then per bucket (rate, burst, amount, enforce),
# then the admitted cost for the usage counters, the lease id ('' for none), its ttl, the lease zset key and
# the lease hash prefix.
# Reply: {allowed, retry_after, now, nblocked, blocked indices..., levels...}; levels are after charging
# when allowed, merely drained when denied.
TAKE_LUA = (
    _PRELUDE
    + """
local n = tonumber(ARGV[2])
local lease, ttl = ARGV[4 + n * 4], tonumber(ARGV[5 + n * 4])
local zkey, hprefix = ARGV[6 + n * 4], ARGV[7 + n * 4]
sweep(zkey, hprefix)
local levels, upds, rates, amounts = {}, {}, {}, {}
local blocked = {}
local maxwait = 0
for i = 1, n do
  local b = 2 + (i - 1) * 4
  local rate, burst = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local amount, enforce = tonumber(ARGV[b + 3]), ARGV[b + 4] == '1'
  local level, upd = load(KEYS[i], rate)
  levels[i], upds[i], rates[i], amounts[i] = level, upd, rate, amount
  if enforce then
    local excess = level - math.max(burst - amount, 0)
    if excess > EPS then
      blocked[#blocked + 1] = tostring(i)
      local w = excess / rate
      if w > maxwait then maxwait = w end
    end
  end
end
local allowed = 0
if #blocked == 0 then
  allowed = 1
  for i = 1, n do
    levels[i] = math.max(0, levels[i] + amounts[i])
    store(KEYS[i], levels[i], upds[i], rates[i])
  end
  if #KEYS > n then
    redis.call('HINCRBY', KEYS[n + 1], 'requests', 1)
    redis.call('HINCRBYFLOAT', KEYS[n + 1], 'admitted_mu', ARGV[3 + n * 4])
  end
  if lease ~= '' and n > 0 then
    local h = hprefix .. lease
    for i = 1, n do
      redis.call('HSET', h, KEYS[i], fmt(rates[i]) .. ' ' .. fmt(amounts[i]))
    end
    redis.call('ZADD', zkey, now + ttl, lease)
  end
end
local reply = {tostring(allowed), fmt(maxwait), fmt(now), tostring(#blocked)}
for _, b in ipairs(blocked) do reply[#reply + 1] = b end
for i = 1, n do reply[#reply + 1] = fmt(levels[i]) end
return reply
"""
)

# KEYS: n bucket keys [+ usage key]. ARGV: now, n, per bucket (rate, delta, charged), the lease id ('' for
# none), the lease zset key and hash prefix, then field/value pairs. A lease that had lapsed (refunded) gets
# its charge back: delta + charged.
ADJUST_LUA = (
    _PRELUDE
    + """
local n = tonumber(ARGV[2])
local lease, zkey, hprefix = ARGV[3 + n * 3], ARGV[4 + n * 3], ARGV[5 + n * 3]
sweep(zkey, hprefix)
local live = true
if lease ~= '' then
  live = redis.call('ZREM', zkey, lease) == 1
  redis.call('DEL', hprefix .. lease)
end
for i = 1, n do
  local b = 2 + (i - 1) * 3
  local rate, delta, charged = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  if not live then delta = delta + charged end
  if delta ~= 0 then
    local level, upd = load(KEYS[i], rate)
    store(KEYS[i], math.max(0, level + delta), upd, rate)
  end
end
if #KEYS > n then
  local j = 6 + n * 3
  while j < #ARGV do
    redis.call('HINCRBYFLOAT', KEYS[n + 1], ARGV[j], ARGV[j + 1])
    j = j + 2
  end
end
return fmt(now)
"""
)

# ARGV: now, ttl, lease zset key, lease ids... Extends the leases that still exist.
RENEW_LUA = (
    _PRELUDE
    + """
local ttl, zkey = tonumber(ARGV[2]), ARGV[3]
for j = 4, #ARGV do
  if redis.call('ZSCORE', zkey, ARGV[j]) then redis.call('ZADD', zkey, now + ttl, ARGV[j]) end
end
return fmt(now)
"""
)

# KEYS: n bucket keys. ARGV: now, n, rates... Reply: {now, level, updated, ...} (drained, not written).
PEEK_LUA = (
    _PRELUDE
    + """
local n = tonumber(ARGV[2])
local reply = {fmt(now)}
for i = 1, n do
  local level, upd = load(KEYS[i], tonumber(ARGV[2 + i]))
  reply[#reply + 1] = fmt(level)
  reply[#reply + 1] = fmt(upd)
end
return reply
"""
)

# The fleet-wide capacity ledger (``core.capacity.ledger``'s buckets): one hash per bucket of
# ``bucket_s`` seconds, field = JSON [deployment, tenant], value = settled MU; and [deployment, tenant, "n"]
# = settled requests. ARGV: now, bucket_s, ttl, key prefix, then field/amount pairs.
USED_ADD_LUA = (
    _PRELUDE
    + """
local bucket_s, ttl, prefix = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local key = prefix .. string.format('%d', math.floor(now / bucket_s))
for j = 5, #ARGV - 1, 2 do
  redis.call('HINCRBYFLOAT', key, ARGV[j], ARGV[j + 1])
end
redis.call('EXPIRE', key, ttl)
return fmt(now)
"""
)

# ARGV: now, bucket_s, window_s, key prefix. The buckets overlapping (now - window, now], the oldest
# weighted by its share inside the window (``window_buckets``). Reply: {now, field, sum, field, sum, ...}.
USED_READ_LUA = (
    _PRELUDE
    + """
local bucket_s, window_s, prefix = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local start = now - window_s
local sums, order = {}, {}
for b = math.floor(start / bucket_s), math.floor(now / bucket_s) do
  local w = math.min(1, math.max(0, ((b + 1) * bucket_s - start) / bucket_s))
  if w > 0 then
    local v = redis.call('HGETALL', prefix .. string.format('%d', b))
    for i = 1, #v, 2 do
      if sums[v[i]] == nil then
        sums[v[i]] = 0
        order[#order + 1] = v[i]
      end
      sums[v[i]] = sums[v[i]] + w * tonumber(v[i + 1])
    end
  end
end
local reply = {fmt(now)}
for _, f in ipairs(order) do
  reply[#reply + 1] = f
  reply[#reply + 1] = fmt(sums[f])
end
return reply
"""
)

_UNAVAILABLE = (RedisError, OSError, TimeoutError, ConnectionError)
#: Seconds of settled MU the fleet-wide ledger keeps in Redis (windows read are at most this long).
_USED_KEEP_S = 300.0
#: Tries of one reservation change while other writers keep changing reservations under it.
_RESERVATION_TRIES = 32


class RedisStore:
    """Admission state in one Redis (or a Sentinel-managed primary): atomic Lua scripts, namespaced keys."""

    kind = "redis"
    shared = True  #: every gateway replica reads and writes the same state

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 0.25,
        server_time: bool = True,
        retry_interval_s: float = 1.0,
        client: aioredis.Redis | None = None,
        max_connections: int = 64,
        namespace: str = "fleetgate",
        lease_ttl_s: float = 60.0,
    ) -> None:
        self.url = url
        self.lease_ttl_s: float | None = lease_ttl_s
        self._leases_key = f"{namespace}:leases"
        self._reservations_key = f"{namespace}:reservations"  # hash: tenant -> JSON {model: MU/min}
        self._lease_prefix = f"{namespace}:lease:"
        self._used_prefix = f"{namespace}:used:"  # + bucket number: settled MU per deployment and tenant
        self._pool_prefix = f"{namespace}:pool:"  # + pool name: the pool leader's recent decisions
        self.server_time = server_time
        self.retry_interval_s = retry_interval_s
        if client is None:
            # A blocking pool: a burst of concurrent admissions waits (up to timeout_s) for a connection
            # instead of failing with "Too many connections" and marking the store unavailable.
            pool = aioredis.BlockingConnectionPool.from_url(
                url,
                max_connections=max_connections,
                timeout=timeout_s,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 1),
                decode_responses=True,
            )
            client = aioredis.Redis.from_pool(pool)
        self._redis: aioredis.Redis = client
        self._take = self._redis.register_script(TAKE_LUA)
        self._adjust = self._redis.register_script(ADJUST_LUA)
        self._peek = self._redis.register_script(PEEK_LUA)
        self._renew = self._redis.register_script(RENEW_LUA)
        self._used_add = self._redis.register_script(USED_ADD_LUA)
        self._used_read = self._redis.register_script(USED_READ_LUA)
        self.available = True
        self.errors_total = 0
        self.outages_total = 0
        self._down_until = 0.0

    def _now_arg(self, now: float) -> str:
        return "-1" if self.server_time else repr(float(now))

    def _refuse_while_down(self) -> None:
        """Fail fast while the store is marked down and its retry interval has not passed."""
        if not self.available and time.monotonic() < self._down_until:
            raise StoreUnavailableError(f"redis at {self.url} unreachable (retrying shortly)")

    def _unreachable(self, exc: BaseException) -> StoreUnavailableError:
        return StoreUnavailableError(f"redis at {self.url} unreachable: {exc}")

    async def _call(self, script: Any, keys: list[str], args: list[str]) -> Any:
        self._refuse_while_down()
        try:
            result = await script(keys=keys, args=args)
        except _UNAVAILABLE as exc:
            self.errors_total += 1
            self._down_until = time.monotonic() + self.retry_interval_s
            if self.available:
                self.available = False
                self.outages_total += 1
                log.warning("admission store unreachable: redis %s: %s", self.url, exc)
            raise self._unreachable(exc) from exc
        if not self.available:
            self.available = True
            log.warning("admission store reachable again: redis %s", self.url)
        return result

    async def take(
        self,
        charges: Sequence[Charge],
        now: float,
        usage_key: str | None = None,
        cost_mu: float = 0.0,
        lease: str | None = None,
    ) -> TakeOutcome:
        keys = [c.key for c in charges]
        args = [self._now_arg(now), str(len(charges))]
        for c in charges:
            enforce = "1" if c.enforce else "0"
            args += [repr(c.params.rate_per_s), repr(c.params.burst), repr(c.amount), enforce]
        args += [repr(cost_mu), lease or "", repr(self.lease_ttl_s), self._leases_key, self._lease_prefix]
        if usage_key is not None:
            keys.append(usage_key)
        r = await self._call(self._take, keys, args)
        allowed, retry, at = r[0] == "1", float(r[1]), float(r[2])
        nblocked = int(r[3])
        blocked_idx = [int(x) - 1 for x in r[4 : 4 + nblocked]]
        levels = [float(x) for x in r[4 + nblocked :]]
        states = {c.key: BucketState(levels[i], at) for i, c in enumerate(charges)}
        if not allowed:
            retry = max(retry, MIN_RETRY_AFTER_S)
        blocked = tuple(keys[i] for i in blocked_idx)
        return TakeOutcome(allowed, 0.0 if allowed else retry, blocked, states, at)

    async def adjust(
        self,
        deltas: Sequence[Charge],
        now: float,
        usage_key: str | None = None,
        usage: Mapping[str, float] | None = None,
        lease: str | None = None,
        charged: Sequence[Charge] = (),
    ) -> None:
        # every meter the admission charged (a lapsed lease gets its charge back), then any other delta
        meters: dict[str, tuple[float, float, float]] = {
            c.key: (c.params.rate_per_s, 0.0, c.amount) for c in charged
        }
        for c in deltas:
            rate, _d, amount = meters.get(c.key, (c.params.rate_per_s, 0.0, 0.0))
            meters[c.key] = (rate, c.amount, amount)
        keys = list(meters)
        args = [self._now_arg(now), str(len(keys))]
        for rate, delta, amount in meters.values():
            args += [repr(rate), repr(delta), repr(amount)]
        args += [lease or "", self._leases_key, self._lease_prefix]
        if usage_key is not None and usage:
            keys.append(usage_key)
            for name, value in usage.items():
                args += [name, repr(float(value))]
        if keys or lease:
            await self._call(self._adjust, keys, args)

    async def renew(self, leases: Sequence[str], now: float) -> None:
        if leases:
            args = [self._now_arg(now), repr(self.lease_ttl_s), self._leases_key, *leases]
            await self._call(self._renew, [], args)

    async def peek(self, charges: Sequence[Charge], now: float) -> dict[str, BucketState]:
        if not charges:
            return {}
        args = [self._now_arg(now), str(len(charges))] + [repr(c.params.rate_per_s) for c in charges]
        r = await self._call(self._peek, [c.key for c in charges], args)
        at = float(r[0])
        return {c.key: BucketState(float(r[1 + 2 * i]), at) for i, c in enumerate(charges)}

    async def usage(self, usage_key: str) -> dict[str, float]:
        self._refuse_while_down()
        try:
            raw = await self._redis.hgetall(usage_key)
        except _UNAVAILABLE as exc:
            raise self._unreachable(exc) from exc
        return {str(k): float(v) for k, v in raw.items()}

    async def reservations(self) -> dict[str, dict[str, float]]:
        self._refuse_while_down()
        try:
            raw = await self._redis.hgetall(self._reservations_key)
        except _UNAVAILABLE as exc:
            raise self._unreachable(exc) from exc
        return self._decode_reservations(raw)

    async def update_reservations(self, tenant: str, change: ReservationChange) -> dict[str, float]:
        """Optimistic: WATCH the reservations hash, read it, decide, write in MULTI/EXEC; a write by anyone
        else in between aborts the EXEC (``WatchError``) and the change is decided again on fresh data."""
        key = self._reservations_key
        for _ in range(_RESERVATION_TRIES):
            try:
                async with self._redis.pipeline(transaction=True) as pipe:
                    await pipe.watch(key)
                    new = {
                        m: float(v)
                        for m, v in change(self._decode_reservations(await pipe.hgetall(key))).items()
                    }
                    pipe.multi()
                    pipe.hset(key, tenant, json.dumps(dict(sorted(new.items()))))
                    await pipe.execute()
                    return new
            except WatchError:
                continue
            except _UNAVAILABLE as exc:
                raise self._unreachable(exc) from exc
        raise StoreUnavailableError(
            f"reservations in redis at {self.url} changed under every one of {_RESERVATION_TRIES} tries"
        )

    def _decode_reservations(self, raw: Mapping[Any, Any]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for tenant, blob in raw.items():
            try:
                out[str(tenant)] = {str(m): float(v) for m, v in json.loads(blob).items()}
            except (ValueError, AttributeError, TypeError):
                log.warning(
                    "ignoring unreadable reservations of tenant %s in %s", tenant, self._reservations_key
                )
        return out

    async def set_reservations(self, tenant: str, reserved: Mapping[str, float]) -> None:
        blob = json.dumps({m: float(v) for m, v in sorted(reserved.items())})
        try:
            await self._redis.hset(self._reservations_key, tenant, blob)
        except _UNAVAILABLE as exc:
            raise self._unreachable(exc) from exc

    async def add_used(self, settled: Sequence[SettledUse], now: float) -> None:
        if not settled:
            return
        ttl = math.ceil(_USED_KEEP_S + 2 * USED_BUCKET_S)
        args = [self._now_arg(now), repr(USED_BUCKET_S), str(ttl), self._used_prefix]
        for s in settled:
            args += [json.dumps([s.deployment, s.tenant]), repr(float(s.mu))]
            args += [json.dumps([s.deployment, s.tenant, "n"]), repr(float(s.requests))]
        await self._call(self._used_add, [], args)

    async def used(self, window_s: float, now: float) -> list[SettledUse]:
        if window_s > _USED_KEEP_S:
            raise ValueError(f"the fleet-wide ledger keeps {_USED_KEEP_S} s, not {window_s}")
        args = [self._now_arg(now), repr(USED_BUCKET_S), repr(float(window_s)), self._used_prefix]
        r = await self._call(self._used_read, [], args)
        sums: dict[tuple[str, str], list[float]] = {}
        for field, value in zip(r[1::2], r[2::2], strict=True):
            try:
                deployment, tenant, *count = json.loads(field)
            except (ValueError, TypeError):
                continue  # not written by this version
            sums.setdefault((str(deployment), str(tenant)), [0.0, 0.0])[1 if count else 0] += float(value)
        return [SettledUse(d, t, mu, n) for (d, t), (mu, n) in sorted(sums.items())]

    async def put_pool_views(self, views: Mapping[str, bytes], ttl_s: float) -> None:
        if not views:
            return
        self._refuse_while_down()
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for name, doc in views.items():
                    pipe.set(self._pool_prefix + name, doc, px=max(1, int(ttl_s * 1000)))
                await pipe.execute()
        except _UNAVAILABLE as exc:
            raise self._unreachable(exc) from exc

    async def pool_views(self, pools: Sequence[str]) -> dict[str, bytes]:
        if not pools:
            return {}
        self._refuse_while_down()
        try:
            raw = await self._redis.mget([self._pool_prefix + name for name in pools])
        except _UNAVAILABLE as exc:
            raise self._unreachable(exc) from exc
        return {
            name: bytes(v) if not isinstance(v, str) else v.encode()
            for name, v in zip(pools, raw, strict=True)
            if v is not None
        }

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except _UNAVAILABLE:
            return False

    async def close(self) -> None:
        await self._redis.aclose()
