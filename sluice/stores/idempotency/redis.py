"""Idempotency records in Redis, shared by every gateway: one Lua script per verb, so a read and its write
are one atomic step on the server (two gateways beginning one key: exactly one gets NEW), timed by the
server's clock (``TIME``) so every gateway agrees on when a running marker expired.

One hash per record: ``<prefix><tenant_id>:<sha256 hex of the Idempotency-Key>`` (the raw key never lands
in a key name; the digest is always 64 hex characters, so no two tenants' names can collide) with fields
fingerprint, attempt, state, deadline (server seconds), output_tokens, result. Its TTL is the record
lifetime described in base.py.

One sorted set per tenant bounds its records: ``<prefix><tenant_id>:lru`` (never 64 hex characters after
the colon, so never a record's name), members the key digests, scores the server time of their last
write. The scripts that write a record update its score in the same step, and ``begin`` pops the
tenant's oldest members past ``max_records_per_tenant`` and deletes their records: one tenant's flood
evicts only its own keys. A member whose record already expired is popped like any other (it is among
the oldest); the set expires with the tenant's longest-lived record.
NOTE: the scripts build evicted records' names from the prefix: one Redis (or one hash slot), not a cluster.

Failures: whatever ``sluice.stores.quota.redis.redis_unavailable`` calls an outage (connection loss, timeouts,
a server out of memory, read-only, loading, failing over, busy, unable to persist; also inside a pre-7
script error) raises ``IdempotencyStoreUnavailableError``; anything else (a bug in a script) propagates
as it is.

The client runs without ``decode_responses``: a stored result comes back as the exact bytes given.
"""

from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from sluice.stores.idempotency.base import (
    ATTEMPT_RECORD_TTL_S,
    DEFAULT_MAX_RECORDS_PER_TENANT,
    Begin,
    BeginKind,
    IdempotencyStore,
    IdempotencyStoreUnavailableError,
    check_begin_args,
    check_complete_args,
    check_max_records,
    check_release_args,
    key_digest,
)

# NOTE: one definition of "Redis cannot serve now" for every Redis-backed store.
from sluice.stores.quota.redis import redis_unavailable

log = logging.getLogger(__name__)


_NOW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""

# Sets r (the record's fields) and returns what begin answers without starting an attempt, if it does.
_EXISTING_LUA = """
local r = redis.call('HMGET', KEYS[1], 'fingerprint', 'attempt', 'state', 'deadline', 'output_tokens')
if r[1] then
  local attempt = tonumber(r[2])
  if r[1] ~= ARGV[1] then return {'mismatch', attempt} end
  if r[3] == 'completed' then return {'completed', attempt, redis.call('HGET', KEYS[1], 'result')} end
  if r[3] == 'running' and now < tonumber(r[4]) then return {'in_progress', attempt} end
end
"""

# A write to the record named by ``member`` in tenant index ``index``: its score, and the index's TTL
# stretched to the record's.
_TOUCH_LUA = """
local function touch(index, member, now, ttl_ms)
  redis.call('ZADD', index, now, member)
  if redis.call('PTTL', index) < ttl_ms then redis.call('PEXPIRE', index, ttl_ms) end
end
"""

# KEYS: record. ARGV: fingerprint. Returns {} when a begin would start a new attempt, else what it
# would answer: {'mismatch', attempt}, {'completed', attempt, result} or {'in_progress', attempt}.
_PEEK_LUA = _NOW_LUA + _EXISTING_LUA + "return {}"

# KEYS: record, tenant index. ARGV: fingerprint, running_ttl_s, attempt_record_ttl_s, key digest,
# max_records_per_tenant, the prefix of the tenant's record names.
# Returns {'new', attempt, superseded_output_tokens}, or what peek returns otherwise. Only 'new' writes.
_BEGIN_LUA = (
    _NOW_LUA
    + _TOUCH_LUA
    + _EXISTING_LUA
    + """
local attempt, superseded = 0, 0
if r[1] then
  attempt = tonumber(r[2])
  if r[3] == 'released' then superseded = tonumber(r[5]) end
end
attempt = attempt + 1
local running_ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'attempt', attempt, 'state', 'running',
  'deadline', string.format('%.17g', now + running_ttl), 'output_tokens', 0)
local ttl_ms = math.ceil(math.max(running_ttl, tonumber(ARGV[3])) * 1000)
redis.call('PEXPIRE', KEYS[1], ttl_ms)
touch(KEYS[2], ARGV[4], now, ttl_ms)
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[5])
if excess > 0 then
  local evicted = redis.call('ZPOPMIN', KEYS[2], excess)
  for i = 1, #evicted, 2 do redis.call('DEL', ARGV[6] .. evicted[i]) end
end
return {'new', attempt, superseded}
"""
)

# KEYS: record, tenant index. ARGV: attempt, result, ttl_s, key digest. Returns 1 if completed (now or
# before), 0 if not.
_COMPLETE_LUA = (
    _NOW_LUA
    + _TOUCH_LUA
    + """
local r = redis.call('HMGET', KEYS[1], 'attempt', 'state')
if not r[1] or tonumber(r[1]) ~= tonumber(ARGV[1]) then return 0 end
if r[2] == 'completed' then return 1 end
if r[2] ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'completed', 'result', ARGV[2])
local ttl_ms = math.ceil(tonumber(ARGV[3]) * 1000)
redis.call('PEXPIRE', KEYS[1], ttl_ms)
touch(KEYS[2], ARGV[4], now, ttl_ms)
return 1
"""
)

# KEYS: record, tenant index. ARGV: attempt, output_tokens, attempt_record_ttl_s, key digest. Returns 1 if
# released now, else 0.
_RELEASE_LUA = (
    _NOW_LUA
    + _TOUCH_LUA
    + """
local r = redis.call('HMGET', KEYS[1], 'attempt', 'state')
if not r[1] or tonumber(r[1]) ~= tonumber(ARGV[1]) or r[2] ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'released', 'output_tokens', ARGV[2])
local ttl_ms = math.ceil(tonumber(ARGV[3]) * 1000)
redis.call('PEXPIRE', KEYS[1], ttl_ms)
touch(KEYS[2], ARGV[4], now, ttl_ms)
return 1
"""
)


class RedisIdempotencyStore(IdempotencyStore):
    def __init__(
        self,
        url: str,
        key_prefix: str = "sluice:idem:",
        socket_timeout_s: float = 1.0,
        max_records_per_tenant: int = DEFAULT_MAX_RECORDS_PER_TENANT,
    ) -> None:
        check_max_records(max_records_per_tenant)
        self._url = url
        self._key_prefix = key_prefix
        self._socket_timeout_s = socket_timeout_s  # a replayed result may be large: more than quota's
        self._max_records_per_tenant = max_records_per_tenant
        self._client: aioredis.Redis | None = None
        self._scripts: dict[str, AsyncScript] = {}

    async def open(self) -> None:
        """Connect and check Redis answers. An unreachable Redis does not fail the start (logged): every
        verb raises ``IdempotencyStoreUnavailableError`` until it answers."""
        self._client = aioredis.Redis.from_url(
            self._url,
            decode_responses=False,
            socket_timeout=self._socket_timeout_s,
            socket_connect_timeout=self._socket_timeout_s,
            # One immediate retry, on a connection error only (a pooled connection died with a Redis
            # restart). NOTE: never on a timeout: the script may have run, and begin run twice answers its
            # own caller IN_PROGRESS. complete and release are safe to repeat.
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        for name, lua in (
            ("peek", _PEEK_LUA),
            ("begin", _BEGIN_LUA),
            ("complete", _COMPLETE_LUA),
            ("release", _RELEASE_LUA),
        ):
            self._scripts[name] = self._client.register_script(lua)
        try:
            await self._client.ping()
        except (RedisError, OSError) as exc:
            if not redis_unavailable(exc):
                raise
            log.warning(
                "idempotency store: Redis unavailable at start (%s: %s); requests with an Idempotency-Key"
                " get 503 until it answers",
                type(exc).__name__,
                exc,
            )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def record_key(self, tenant_id: str, key: str) -> str:
        """The Redis key holding (tenant_id, key)'s record."""
        return f"{self._key_prefix}{tenant_id}:{key_digest(key)}"

    def index_key(self, tenant_id: str) -> str:
        """The Redis key of the tenant's bound: its records' digests by last write."""
        return f"{self._key_prefix}{tenant_id}:lru"

    async def peek(self, tenant_id: str, key: str, fingerprint: str) -> Begin | None:
        reply = await self._run("peek", [self.record_key(tenant_id, key)], [fingerprint])
        return _begin_from(reply) if reply else None

    async def begin(self, tenant_id: str, key: str, fingerprint: str, running_ttl_s: float) -> Begin:
        check_begin_args(running_ttl_s)
        reply = await self._run(
            "begin",
            [self.record_key(tenant_id, key), self.index_key(tenant_id)],
            [
                fingerprint,
                repr(float(running_ttl_s)),
                repr(ATTEMPT_RECORD_TTL_S),
                key_digest(key),
                self._max_records_per_tenant,
                f"{self._key_prefix}{tenant_id}:",
            ],
        )
        return _begin_from(reply)

    async def complete(self, tenant_id: str, key: str, attempt: int, result: bytes, ttl_s: float) -> bool:
        check_complete_args(attempt, ttl_s)
        reply = await self._run(
            "complete",
            [self.record_key(tenant_id, key), self.index_key(tenant_id)],
            [attempt, bytes(result), repr(float(ttl_s)), key_digest(key)],
        )
        return bool(reply)

    async def release(self, tenant_id: str, key: str, attempt: int, output_tokens: int) -> None:
        check_release_args(attempt, output_tokens)
        await self._run(
            "release",
            [self.record_key(tenant_id, key), self.index_key(tenant_id)],
            [attempt, output_tokens, repr(ATTEMPT_RECORD_TTL_S), key_digest(key)],
        )

    async def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run one script; Redis failing to answer is ``IdempotencyStoreUnavailableError``."""
        script = self._scripts.get(name)
        if script is None:
            raise RuntimeError("RedisIdempotencyStore used before open()")
        try:
            return await script(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            if not redis_unavailable(exc):
                raise  # not an outage: a bug in a script or a command, never hidden as a 503
            raise IdempotencyStoreUnavailableError(f"Redis: {type(exc).__name__}: {exc}") from exc


def _begin_from(reply: list[Any]) -> Begin:
    kind, attempt = BeginKind(reply[0].decode()), int(reply[1])
    if kind is BeginKind.NEW:
        return Begin(kind, attempt, superseded_output_tokens=int(reply[2]))
    if kind is BeginKind.COMPLETED:
        return Begin(kind, attempt, result=bytes(reply[2]))
    return Begin(kind, attempt)
