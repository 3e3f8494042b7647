"""Quotas in Redis, shared by every gateway: one Lua script per verb, so a check and its take are one atomic
step on the server (no check-then-increment race between gateways), timed by the server's clock (``TIME``)
so every gateway agrees on it.

Keys per tenant, in one hash slot (``{tenant_id}``) so the scripts also run on Redis Cluster:
  ``<prefix>{t}:bucket``     hash {level, ts}: the token bucket; expires once it would be full again
  ``<prefix>{t}:leases``     sorted set of request ids scored by lease expiry; expires with its last lease
  ``<prefix>{t}:grant:<id>`` hash {reserved, capacity, rate, remaining}: the unsettled grant of request
                             ``<id>``; settle deletes it, so a missing key means settled already (or
                             expired: lease TTL + GRANT_GRACE_S). While it exists, an acquire for the same
                             request returns 'ok' with the ``remaining`` it recorded and takes nothing: the
                             record of the earlier decision.

Both scripts are therefore safe to run twice for one request, which is what a lost reply makes any client
do (redis-py's Retry re-sends a command whose connection died after it was sent): the retry cannot debit
twice. Every failure that means "Redis cannot serve now" is raised as ``QuotaStoreUnavailable``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript

from sluice.domain import Tenant
from sluice.stores.quota.base import (
    GRANT_GRACE_S,
    MAX_CONCURRENCY_RETRY_S,
    QuotaDenied,
    QuotaGrant,
    QuotaLimit,
    QuotaStore,
    QuotaStoreUnavailable,
    check_acquire_args,
    check_used_tokens,
    concurrency_denied,
    tokens_denied,
    too_large,
    whole_tokens,
)
from sluice.stores.quota.bucket import rate_tokens_per_s

SOURCE = "redis"

# Redis cannot serve now: unreachable, too slow, loading its data set, failing over, a cluster without a
# quorum. (ConnectionError covers BusyLoadingError and MaxConnectionsError too.)
_UNAVAILABLE_TYPES: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterDownError,  # and MasterDownError
    redis.exceptions.TryAgainError,
    TimeoutError,
    OSError,
)
# The same states as error codes, wherever they appear in a reply: at its start (a code redis-py has no
# class for: MISCONF, NOREPLICAS, BUSY) or inside a script's error, as servers before 7 wrap a failed
# redis.call ("ERR Error running script ...: -OOM command not allowed ...").
_UNAVAILABLE_CODES = re.compile(
    r"(?:^|-)(?:OOM|READONLY|LOADING|MASTERDOWN|CLUSTERDOWN|TRYAGAIN|NOREPLICAS|MISCONF|BUSY)\b"
)


def redis_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis cannot serve now (as opposed to a bug in our commands or scripts)."""
    if isinstance(exc, _UNAVAILABLE_TYPES):
        return True
    return isinstance(exc, redis.exceptions.ResponseError) and bool(_UNAVAILABLE_CODES.search(str(exc)))


# NOTE: the bucket arithmetic below mirrors sluice/stores/quota/bucket.py (refill, try_take, give_back,
# seconds_until_full) operation for operation on the same doubles, and the checks run in the order
# InProcessQuotaStore.acquire_now runs them; tests/core/test_quota.py checks both stores agree.
# Numbers go back to Python as '%.17g' strings: Redis would truncate a Lua number to an integer.
_COMMON_LUA = """
local function fmt(x) return string.format('%.17g', x) end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

-- The bucket at `now` (bucket.refill); a missing key is a full bucket (bucket.full).
local function refilled(capacity, rate)
  local b = redis.call('HMGET', KEYS[1], 'level', 'ts')
  local level, last = capacity, now
  if b[1] then level, last = tonumber(b[1]), tonumber(b[2]) end
  if now > last then level, last = math.min(capacity, level + (now - last) * rate), now end
  return level, last
end

-- Once full again the bucket equals a new tenant's, so its key may go (bucket.seconds_until_full).
local function store_bucket(level, last, capacity, rate)
  redis.call('HSET', KEYS[1], 'level', fmt(level), 'ts', fmt(last))
  redis.call('PEXPIRE', KEYS[1], math.ceil(math.max(0, (capacity - level) / rate) * 1000) + 1000)
end
"""

# KEYS: bucket, leases, grant. ARGV: tokens, capacity (-1: none), rate, max_leases (-1: none), lease_ttl_s,
# request_id, grant_grace_s, max_concurrency_retry_s.
# Returns {'ok', level after the take} ({'ok'} without a token budget),
# {'concurrent_requests', num_in_flight, soonest_expiry_in_s}, or {'tokens_per_minute', level, retry_after_s}.
# A denial writes nothing (bar dropping expired leases). A request that holds an unsettled grant already
# gets {'ok', the level its grant recorded} again, and nothing more is taken.
_ACQUIRE_LUA = (
    _COMMON_LUA
    + """
local tokens, capacity, rate = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local max_leases, lease_ttl = tonumber(ARGV[4]), tonumber(ARGV[5])

if redis.call('EXISTS', KEYS[3]) == 1 then
  if capacity < 0 then return {'ok'} end
  local remaining = redis.call('HGET', KEYS[3], 'remaining')
  -- A grant written before 'remaining' was recorded: the level now instead (read only).
  if not remaining then remaining = fmt((refilled(capacity, rate))) end
  return {'ok', remaining}
end

if max_leases >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', fmt(now))
  local n = redis.call('ZCARD', KEYS[2])
  if n >= max_leases then
    local wait = tonumber(ARGV[8])
    local soonest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    if soonest[2] then wait = tonumber(soonest[2]) - now end
    return {'concurrent_requests', n, fmt(wait)}
  end
end

local remaining = nil
if capacity >= 0 then
  local level, last = refilled(capacity, rate)
  if level < tokens then
    return {'tokens_per_minute', fmt(level), fmt((tokens - level) / rate)}
  end
  store_bucket(level - tokens, last, capacity, rate)
  remaining = fmt(level - tokens)
end

if max_leases >= 0 then
  redis.call('ZADD', KEYS[2], fmt(now + lease_ttl), ARGV[6])
  local ttl_ms = math.ceil(lease_ttl * 1000) + 1000
  if redis.call('PTTL', KEYS[2]) < ttl_ms then redis.call('PEXPIRE', KEYS[2], ttl_ms) end
end
local reserved = 0
if capacity >= 0 then reserved = tokens end
redis.call('HSET', KEYS[3], 'reserved', reserved, 'capacity', ARGV[2], 'rate', ARGV[3])
if remaining then redis.call('HSET', KEYS[3], 'remaining', remaining) end
redis.call('PEXPIRE', KEYS[3], math.ceil((lease_ttl + tonumber(ARGV[7])) * 1000))
if remaining then return {'ok', remaining} end
return {'ok'}
"""
)

# KEYS: bucket, leases, grant. ARGV: request_id, used_tokens. Returns 1 if settled now, 0 if not found.
_SETTLE_LUA = (
    _COMMON_LUA
    + """
local g = redis.call('HMGET', KEYS[3], 'reserved', 'capacity', 'rate')
if not g[1] then return 0 end
redis.call('DEL', KEYS[3])
redis.call('ZREM', KEYS[2], ARGV[1])
local capacity, rate = tonumber(g[2]), tonumber(g[3])
if capacity >= 0 then
  local level, last = refilled(capacity, rate)
  store_bucket(math.min(capacity, level + (tonumber(g[1]) - tonumber(ARGV[2]))), last, capacity, rate)
end
return 1
"""
)


class RedisQuotaStore(QuotaStore):
    def __init__(self, url: str, key_prefix: str = "sluice:quota:", socket_timeout_s: float = 0.25) -> None:
        self._url = url
        self._key_prefix = key_prefix
        self._socket_timeout_s = socket_timeout_s
        self._client: aioredis.Redis | None = None
        self._acquire_script: AsyncScript | None = None
        self._settle_script: AsyncScript | None = None

    async def open(self) -> None:
        """Connect and check Redis answers (raises ``redis.exceptions.ConnectionError`` if not; the store
        is usable anyway once Redis comes back)."""
        self._client = aioredis.Redis.from_url(
            self._url,
            decode_responses=True,
            socket_timeout=self._socket_timeout_s,
            socket_connect_timeout=self._socket_timeout_s,
            # One immediate retry on a fresh connection, for a connection that died (a pooled one may have
            # died with a Redis restart). Safe: both scripts are idempotent per request (above). Not on a
            # timeout: Redis is slow, not gone, and a second wait would only delay failing open.
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)),
        )
        self._acquire_script = self._client.register_script(_ACQUIRE_LUA)
        self._settle_script = self._client.register_script(_SETTLE_LUA)
        await self._call(self._client.ping())

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _keys(self, tenant_id: str, request_id: str) -> list[str]:
        base = f"{self._key_prefix}{{{tenant_id}}}"
        return [f"{base}:bucket", f"{base}:leases", f"{base}:grant:{request_id}"]

    async def acquire(
        self, tenant: Tenant, tokens: int, lease_ttl_s: float, *, request_id: str
    ) -> QuotaGrant | QuotaDenied:
        check_acquire_args(tokens, lease_ttl_s, request_id)
        if (denied := too_large(tenant, tokens)) is not None:
            return denied
        grant = QuotaGrant(
            tenant_id=tenant.tenant_id,
            request_id=request_id,
            reserved_tokens=tokens if tenant.tokens_per_minute is not None else 0,
            has_lease=tenant.max_concurrent_requests is not None,
            source=SOURCE,
            remaining_tokens=None,  # set from the script's reply
        )
        if grant.holds_nothing:
            return grant  # an unlimited tenant: nothing to count, no round trip
        capacity = tenant.tokens_per_minute
        # NOTE: if the caller is cancelled while this awaits, the script may still have run: its lease
        # expires by its TTL and its reservation is refunded by refill, as for a gateway that died.
        script = self._script(self._acquire_script)
        reply = await self._call(
            script(
                keys=self._keys(tenant.tenant_id, request_id),
                args=[
                    tokens,
                    -1 if capacity is None else capacity,
                    repr(rate_tokens_per_s(capacity)) if capacity is not None else "0",
                    -1 if tenant.max_concurrent_requests is None else tenant.max_concurrent_requests,
                    repr(float(lease_ttl_s)),
                    request_id,
                    repr(GRANT_GRACE_S),
                    repr(MAX_CONCURRENCY_RETRY_S),
                ],
            )
        )
        verdict = reply[0]
        if verdict == "ok":
            remaining_tokens = whole_tokens(float(reply[1])) if len(reply) > 1 else None
            return dataclasses.replace(grant, remaining_tokens=remaining_tokens)
        if verdict == QuotaLimit.CONCURRENT_REQUESTS:
            return concurrency_denied(tenant, int(reply[1]), float(reply[2]))
        if verdict == QuotaLimit.TOKENS_PER_MINUTE:
            return tokens_denied(tenant, tokens, float(reply[1]), float(reply[2]))
        raise RuntimeError(f"unexpected reply from the acquire script: {reply!r}")

    async def settle(self, grant: QuotaGrant, used_tokens: int) -> None:
        check_used_tokens(used_tokens)
        if grant.holds_nothing:
            return
        script = self._script(self._settle_script)
        await self._call(
            script(keys=self._keys(grant.tenant_id, grant.request_id), args=[grant.request_id, used_tokens])
        )

    async def _call(self, command: Any) -> Any:
        """Await a client call; Redis unable to serve raises ``QuotaStoreUnavailable``."""
        try:
            return await command
        except (redis.exceptions.RedisError, OSError) as exc:
            if not redis_unavailable(exc):
                raise
            raise QuotaStoreUnavailable(f"{type(exc).__name__}: {exc}") from exc

    def _script(self, script: AsyncScript | None) -> AsyncScript:
        if script is None:
            raise RuntimeError("RedisQuotaStore used before open()")
        return script
