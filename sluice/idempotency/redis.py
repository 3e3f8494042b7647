"""Idempotency records in Redis, shared by every gateway: one Lua script per verb, so a read and its write
are one atomic step on the server (two gateways beginning one key: exactly one gets NEW), timed by the
server's clock (``TIME``) so every gateway agrees on when a running marker expired.

One hash per record: ``<prefix><tenant_id>:<sha256 hex of the Idempotency-Key>`` (the raw key never lands
in a key name; the digest is always 64 hex characters, so no two tenants' names can collide) with fields
fingerprint, attempt, state, deadline (server seconds), output_tokens, result. Its TTL is the record
lifetime described in base.py.

The client runs without ``decode_responses``: a stored result comes back as the exact bytes given.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError

from sluice.idempotency.base import (
    ATTEMPT_RECORD_TTL_S,
    Begin,
    BeginKind,
    IdempotencyStore,
    check_begin_args,
    check_complete_args,
    check_release_args,
    key_digest,
)

# KEYS: record. ARGV: fingerprint, running_ttl_s, attempt_record_ttl_s.
# Returns {'new', attempt, superseded_output_tokens}, {'completed', attempt, result}, {'in_progress',
# attempt} or {'mismatch', attempt}. Only 'new' writes.
_BEGIN_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local running_ttl = tonumber(ARGV[2])
local r = redis.call('HMGET', KEYS[1], 'fingerprint', 'attempt', 'state', 'deadline', 'output_tokens')
local attempt, superseded = 0, 0
if r[1] then
  attempt = tonumber(r[2])
  if r[1] ~= ARGV[1] then return {'mismatch', attempt} end
  if r[3] == 'completed' then return {'completed', attempt, redis.call('HGET', KEYS[1], 'result')} end
  if r[3] == 'running' and now < tonumber(r[4]) then return {'in_progress', attempt} end
  if r[3] == 'released' then superseded = tonumber(r[5]) end
end
attempt = attempt + 1
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'attempt', attempt, 'state', 'running',
  'deadline', string.format('%.17g', now + running_ttl), 'output_tokens', 0)
redis.call('PEXPIRE', KEYS[1], math.ceil(math.max(running_ttl, tonumber(ARGV[3])) * 1000))
return {'new', attempt, superseded}
"""

# KEYS: record. ARGV: attempt, result, ttl_s. Returns 1 if completed (now or before), 0 if not.
_COMPLETE_LUA = """
local r = redis.call('HMGET', KEYS[1], 'attempt', 'state')
if not r[1] or tonumber(r[1]) ~= tonumber(ARGV[1]) then return 0 end
if r[2] == 'completed' then return 1 end
if r[2] ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'completed', 'result', ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3]) * 1000))
return 1
"""

# KEYS: record. ARGV: attempt, output_tokens, attempt_record_ttl_s. Returns 1 if released now, else 0.
_RELEASE_LUA = """
local r = redis.call('HMGET', KEYS[1], 'attempt', 'state')
if not r[1] or tonumber(r[1]) ~= tonumber(ARGV[1]) or r[2] ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'released', 'output_tokens', ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3]) * 1000))
return 1
"""


class RedisIdempotencyStore(IdempotencyStore):
    def __init__(self, url: str, key_prefix: str = "sluice:idem:", socket_timeout_s: float = 1.0) -> None:
        self._url = url
        self._key_prefix = key_prefix
        self._socket_timeout_s = socket_timeout_s  # a replayed result may be large: more than quota's
        self._client: aioredis.Redis | None = None
        self._begin_script: AsyncScript | None = None
        self._complete_script: AsyncScript | None = None
        self._release_script: AsyncScript | None = None

    async def open(self) -> None:
        """Connect and check Redis answers (raises ``redis.exceptions.ConnectionError`` if not)."""
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
        self._begin_script = self._client.register_script(_BEGIN_LUA)
        self._complete_script = self._client.register_script(_COMPLETE_LUA)
        self._release_script = self._client.register_script(_RELEASE_LUA)
        await self._client.ping()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def record_key(self, tenant_id: str, key: str) -> str:
        """The Redis key holding (tenant_id, key)'s record."""
        return f"{self._key_prefix}{tenant_id}:{key_digest(key)}"

    async def begin(self, tenant_id: str, key: str, fingerprint: str, running_ttl_s: float) -> Begin:
        check_begin_args(running_ttl_s)
        reply = await self._script(self._begin_script)(
            keys=[self.record_key(tenant_id, key)],
            args=[fingerprint, repr(float(running_ttl_s)), repr(ATTEMPT_RECORD_TTL_S)],
        )
        kind, attempt = BeginKind(reply[0].decode()), int(reply[1])
        if kind is BeginKind.NEW:
            return Begin(kind, attempt, superseded_output_tokens=int(reply[2]))
        if kind is BeginKind.COMPLETED:
            return Begin(kind, attempt, result=bytes(reply[2]))
        return Begin(kind, attempt)

    async def complete(self, tenant_id: str, key: str, attempt: int, result: bytes, ttl_s: float) -> bool:
        check_complete_args(attempt, ttl_s)
        reply = await self._script(self._complete_script)(
            keys=[self.record_key(tenant_id, key)], args=[attempt, bytes(result), repr(float(ttl_s))]
        )
        return bool(reply)

    async def release(self, tenant_id: str, key: str, attempt: int, output_tokens: int) -> None:
        check_release_args(attempt, output_tokens)
        await self._script(self._release_script)(
            keys=[self.record_key(tenant_id, key)],
            args=[attempt, output_tokens, repr(ATTEMPT_RECORD_TTL_S)],
        )

    def _script(self, script: AsyncScript | None) -> AsyncScript:
        if script is None:
            raise RuntimeError("RedisIdempotencyStore used before open()")
        return script
