"""Idempotency keys: the store contract over every backend (in-process and the real Redis): peek, begin,
complete, release, exactly one NEW among concurrent begins (two gateways for Redis), and a bound on records
per tenant that one tenant's flood cannot push another's out of; each backend's own duties (hashed key
names, record TTLs, and every way Redis can fail to answer becoming ``IdempotencyStoreUnavailableError``;
expiry by the injected clock in process).

Redis is ``TEST_REDIS_URL`` (default 127.0.0.1:6379). Keys live under a prefix unique to this run, deleted at
the end (never FLUSHDB: the server is shared). The Redis params skip, saying why, only when it is down.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import cast

import pytest
import redis
import redis.asyncio
from redis_faults import (
    BUSY,
    CLUSTERDOWN,
    LOADING,
    MASTERDOWN,
    MISCONF,
    NOREPLICAS,
    OOM,
    OOM_IN_SCRIPT_BEFORE_7,
    READONLY,
    SCRIPT_BUG,
    TRYAGAIN,
    FaultyRedis,
)
from redis_run import REDIS_URL, RUN_PREFIX, need_redis
from tcp_proxy import TcpProxy

from sluice.settings import load_settings
from sluice.stores.idempotency.base import (
    ATTEMPT_RECORD_TTL_S,
    Begin,
    BeginKind,
    IdempotencyStore,
    IdempotencyStoreUnavailableError,
)
from sluice.stores.idempotency.inprocess import InProcessIdempotencyStore
from sluice.stores.idempotency.redis import RedisIdempotencyStore
from sluice.stores.openers import open_idempotency_store

KEY_PREFIX = f"{RUN_PREFIX}idem:"
RUNNING_TTL_S = 30.0
RESULT_TTL_S = 3600.0
BODY = hashlib.sha256(b'{"model": "dev", "messages": []}').hexdigest()
OTHER_BODY = hashlib.sha256(b'{"model": "dev", "messages": [1]}').hexdigest()
# Not UTF-8, with NUL, CR/LF and every byte value: replays must be byte-exact.
BINARY_RESULT = b"\xff\xfe\x00data: {}\r\n\r\n\x80" + bytes(range(256))


def new_tenant() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def new_key() -> str:
    return f"key-{uuid.uuid4()}"


class FakeClock:
    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def is_new(begin: Begin, attempt: int, superseded_output_tokens: int = 0) -> None:
    assert begin == Begin(BeginKind.NEW, attempt, superseded_output_tokens=superseded_output_tokens)


# --- the contract, over every store -------------------------------------------------------------------


MakeStore = Callable[..., Awaitable[IdempotencyStore]]


@pytest.fixture(params=["inprocess", "redis"])
async def make_store(request: pytest.FixtureRequest, redis_up: str | None) -> AsyncIterator[MakeStore]:
    """Opened stores of the param's backend: ``make_store(max_records_per_tenant=...)``; closed after."""
    if request.param == "redis":
        need_redis(redis_up)
    opened: list[IdempotencyStore] = []

    async def make(max_records_per_tenant: int = 10_000) -> IdempotencyStore:
        s: IdempotencyStore
        if request.param == "redis":
            s = RedisIdempotencyStore(REDIS_URL, KEY_PREFIX, max_records_per_tenant=max_records_per_tenant)
        else:
            s = InProcessIdempotencyStore(max_records_per_tenant)
        await s.open()
        opened.append(s)
        return s

    yield make
    for s in opened:
        await s.close()


@pytest.fixture
async def store(make_store: MakeStore) -> IdempotencyStore:
    return await make_store()


pytestmark = pytest.mark.anyio


async def test_a_new_key_is_attempt_1_and_a_retry_while_it_runs_is_in_progress(
    store: IdempotencyStore,
) -> None:
    tenant, key = new_tenant(), new_key()
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)
    assert await store.begin(tenant, key, BODY, RUNNING_TTL_S) == Begin(BeginKind.IN_PROGRESS, 1)


async def test_a_retry_after_completion_replays_the_result(store: IdempotencyStore) -> None:
    tenant, key = new_tenant(), new_key()
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)
    assert await store.complete(tenant, key, 1, b'{"id": "cmpl-1"}', RESULT_TTL_S)
    for _ in range(2):
        replay = await store.begin(tenant, key, BODY, RUNNING_TTL_S)
        assert replay == Begin(BeginKind.COMPLETED, 1, result=b'{"id": "cmpl-1"}')


async def test_result_bytes_round_trip_exactly(store: IdempotencyStore) -> None:
    tenant, key = new_tenant(), new_key()
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)
    assert await store.complete(tenant, key, 1, BINARY_RESULT, RESULT_TTL_S)
    replay = await store.begin(tenant, key, BODY, RUNNING_TTL_S)
    assert replay.kind is BeginKind.COMPLETED
    assert replay.result == BINARY_RESULT and type(replay.result) is bytes


async def test_an_empty_result_is_a_result(store: IdempotencyStore) -> None:
    tenant, key = new_tenant(), new_key()
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)
    assert await store.complete(tenant, key, 1, b"", RESULT_TTL_S)
    assert await store.begin(tenant, key, BODY, RUNNING_TTL_S) == Begin(BeginKind.COMPLETED, 1, result=b"")


async def test_a_different_body_under_the_key_is_a_mismatch_in_every_state(store: IdempotencyStore) -> None:
    tenant, key = new_tenant(), new_key()
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)
    assert await store.begin(tenant, key, OTHER_BODY, RUNNING_TTL_S) == Begin(BeginKind.MISMATCH, 1)
    await store.release(tenant, key, 1, output_tokens=7)
    assert await store.begin(tenant, key, OTHER_BODY, RUNNING_TTL_S) == Begin(BeginKind.MISMATCH, 1)
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 2, superseded_output_tokens=7)
    assert await store.complete(tenant, key, 2, b"done", RESULT_TTL_S)
    assert await store.begin(tenant, key, OTHER_BODY, RUNNING_TTL_S) == Begin(BeginKind.MISMATCH, 2)
    # The mismatches changed nothing.
    assert await store.begin(tenant, key, BODY, RUNNING_TTL_S) == Begin(
        BeginKind.COMPLETED, 2, result=b"done"
    )


async def test_a_released_attempt_starts_over_and_reports_its_tokens_as_waste(
    store: IdempotencyStore,
) -> None:
    tenant, key = new_tenant(), new_key()
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)
    await store.release(tenant, key, 1, output_tokens=42)
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 2, superseded_output_tokens=42)
    assert await store.begin(tenant, key, BODY, RUNNING_TTL_S) == Begin(BeginKind.IN_PROGRESS, 2)
    await store.release(tenant, key, 2, output_tokens=0)
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 3, superseded_output_tokens=0)
    assert await store.complete(tenant, key, 3, b"third time", RESULT_TTL_S)
    assert await store.begin(tenant, key, BODY, RUNNING_TTL_S) == Begin(
        BeginKind.COMPLETED, 3, result=b"third time"
    )


async def test_release_of_a_stale_completed_or_released_attempt_does_nothing(store: IdempotencyStore) -> None:
    tenant, key = new_tenant(), new_key()
    await store.release(tenant, key, 1, output_tokens=5)  # no record: nothing to release
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)
    await store.release(tenant, key, 2, output_tokens=5)  # not the latest attempt
    assert await store.begin(tenant, key, BODY, RUNNING_TTL_S) == Begin(BeginKind.IN_PROGRESS, 1)
    await store.release(tenant, key, 1, output_tokens=5)
    await store.release(tenant, key, 1, output_tokens=99)  # released already: the first count stays
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 2, superseded_output_tokens=5)
    assert await store.complete(tenant, key, 2, b"ok", RESULT_TTL_S)
    await store.release(tenant, key, 2, output_tokens=5)  # completed: stays completed
    assert await store.begin(tenant, key, BODY, RUNNING_TTL_S) == Begin(BeginKind.COMPLETED, 2, result=b"ok")


async def test_complete_by_a_stale_or_released_attempt_is_refused(store: IdempotencyStore) -> None:
    tenant, key = new_tenant(), new_key()
    assert not await store.complete(tenant, key, 1, b"no record", RESULT_TTL_S)
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)
    await store.release(tenant, key, 1, output_tokens=3)
    assert not await store.complete(tenant, key, 1, b"released", RESULT_TTL_S)
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 2, superseded_output_tokens=3)
    assert not await store.complete(tenant, key, 1, b"stale", RESULT_TTL_S)
    assert await store.begin(tenant, key, BODY, RUNNING_TTL_S) == Begin(BeginKind.IN_PROGRESS, 2)
    assert await store.complete(tenant, key, 2, b"latest", RESULT_TTL_S)
    assert await store.complete(tenant, key, 2, b"again", RESULT_TTL_S)  # a repeated call: still True
    assert await store.begin(tenant, key, BODY, RUNNING_TTL_S) == Begin(
        BeginKind.COMPLETED, 2, result=b"latest"
    )


async def test_an_expired_running_marker_lets_a_retry_start_over(store: IdempotencyStore) -> None:
    tenant, key = new_tenant(), new_key()
    is_new(await store.begin(tenant, key, BODY, running_ttl_s=0.3), 1)
    assert await store.begin(tenant, key, BODY, RUNNING_TTL_S) == Begin(BeginKind.IN_PROGRESS, 1)
    await asyncio.sleep(0.4)
    # The first attempt's gateway is presumed dead: it never said what it generated.
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 2, superseded_output_tokens=0)
    # The first attempt turns out alive after all: it can neither complete nor release the key.
    assert not await store.complete(tenant, key, 1, b"late", RESULT_TTL_S)
    await store.release(tenant, key, 1, output_tokens=9)
    assert await store.begin(tenant, key, BODY, RUNNING_TTL_S) == Begin(BeginKind.IN_PROGRESS, 2)
    assert await store.complete(tenant, key, 2, b"second", RESULT_TTL_S)
    assert await store.begin(tenant, key, BODY, RUNNING_TTL_S) == Begin(
        BeginKind.COMPLETED, 2, result=b"second"
    )


async def test_an_expired_marker_whose_attempt_still_completes_first_keeps_its_result(
    store: IdempotencyStore,
) -> None:
    tenant, key = new_tenant(), new_key()
    is_new(await store.begin(tenant, key, BODY, running_ttl_s=0.2), 1)
    await asyncio.sleep(0.3)
    # Past its deadline, but no retry started a newer attempt: its result is still the latest.
    assert await store.complete(tenant, key, 1, b"slow but done", RESULT_TTL_S)
    assert await store.begin(tenant, key, BODY, RUNNING_TTL_S) == Begin(
        BeginKind.COMPLETED, 1, result=b"slow but done"
    )


async def test_a_completed_result_is_forgotten_after_its_ttl(store: IdempotencyStore) -> None:
    tenant, key = new_tenant(), new_key()
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)
    assert await store.complete(tenant, key, 1, b"short-lived", ttl_s=0.3)
    assert (await store.begin(tenant, key, BODY, RUNNING_TTL_S)).kind is BeginKind.COMPLETED
    await asyncio.sleep(0.4)
    is_new(await store.begin(tenant, key, OTHER_BODY, RUNNING_TTL_S), 1)  # a new record: any body


async def test_tenants_are_isolated(store: IdempotencyStore) -> None:
    acme, globex, key = new_tenant(), new_tenant(), new_key()
    is_new(await store.begin(acme, key, BODY, RUNNING_TTL_S), 1)
    is_new(await store.begin(globex, key, OTHER_BODY, RUNNING_TTL_S), 1)
    assert await store.complete(acme, key, 1, b"acme's", RESULT_TTL_S)
    assert await store.begin(globex, key, OTHER_BODY, RUNNING_TTL_S) == Begin(BeginKind.IN_PROGRESS, 1)
    await store.release(globex, key, 1, output_tokens=4)
    assert await store.begin(acme, key, BODY, RUNNING_TTL_S) == Begin(
        BeginKind.COMPLETED, 1, result=b"acme's"
    )
    is_new(await store.begin(globex, key, OTHER_BODY, RUNNING_TTL_S), 2, superseded_output_tokens=4)


async def test_concurrent_begins_with_one_key_give_exactly_one_new(store: IdempotencyStore) -> None:
    tenant, key = new_tenant(), new_key()
    begins = await asyncio.gather(*(store.begin(tenant, key, BODY, RUNNING_TTL_S) for _ in range(50)))
    assert sorted(b.kind for b in begins) == [BeginKind.IN_PROGRESS] * 49 + [BeginKind.NEW]
    assert {b.attempt for b in begins} == {1}


async def test_peek_answers_what_begin_would_without_writing(store: IdempotencyStore) -> None:
    tenant, key = new_tenant(), new_key()
    assert await store.peek(tenant, key, BODY) is None  # begin would start attempt 1 ...
    assert await store.peek(tenant, key, OTHER_BODY) is None
    is_new(await store.begin(tenant, key, OTHER_BODY, RUNNING_TTL_S), 1)  # ... and nothing was written
    assert await store.peek(tenant, key, OTHER_BODY) == Begin(BeginKind.IN_PROGRESS, 1)
    assert await store.peek(tenant, key, BODY) == Begin(BeginKind.MISMATCH, 1)
    await store.release(tenant, key, 1, output_tokens=3)
    assert await store.peek(tenant, key, OTHER_BODY) is None  # released: a retry starts over
    assert await store.peek(tenant, key, BODY) == Begin(BeginKind.MISMATCH, 1)
    is_new(await store.begin(tenant, key, OTHER_BODY, RUNNING_TTL_S), 2, superseded_output_tokens=3)
    assert await store.complete(tenant, key, 2, b"two", RESULT_TTL_S)
    for _ in range(2):
        assert await store.peek(tenant, key, OTHER_BODY) == Begin(BeginKind.COMPLETED, 2, result=b"two")


async def test_an_expired_running_marker_peeks_as_startable(store: IdempotencyStore) -> None:
    tenant, key = new_tenant(), new_key()
    is_new(await store.begin(tenant, key, BODY, running_ttl_s=0.2), 1)
    assert await store.peek(tenant, key, BODY) == Begin(BeginKind.IN_PROGRESS, 1)
    await asyncio.sleep(0.3)
    assert await store.peek(tenant, key, BODY) is None
    assert await store.peek(tenant, key, OTHER_BODY) == Begin(BeginKind.MISMATCH, 1)


async def test_one_tenants_flood_of_keys_never_evicts_another_tenants_records(make_store: MakeStore) -> None:
    store = await make_store(max_records_per_tenant=3)
    flooder, quiet = new_tenant(), new_tenant()
    is_new(await store.begin(quiet, "order-1", BODY, RUNNING_TTL_S), 1)
    assert await store.complete(quiet, "order-1", 1, b"quiet's", RESULT_TTL_S)
    for i in range(20):
        is_new(await store.begin(flooder, f"k{i}", BODY, RUNNING_TTL_S), 1)
    assert await store.peek(quiet, "order-1", BODY) == Begin(BeginKind.COMPLETED, 1, result=b"quiet's")
    for i in range(17, 20):  # the flooder keeps its 3 newest records ...
        assert await store.peek(flooder, f"k{i}", BODY) == Begin(BeginKind.IN_PROGRESS, 1)
    for i in range(17):  # ... and forgot its older ones: a retry of one is a new request
        assert await store.peek(flooder, f"k{i}", BODY) is None
    is_new(await store.begin(flooder, "k0", OTHER_BODY, RUNNING_TTL_S), 1)


async def test_the_bound_forgets_the_least_recently_written_record(make_store: MakeStore) -> None:
    store = await make_store(max_records_per_tenant=3)
    tenant = new_tenant()
    for key in ("a", "b", "c"):
        is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)
    assert await store.complete(tenant, "a", 1, b"a's", RESULT_TTL_S)  # written last now: b is the oldest
    assert await store.peek(tenant, "b", BODY) == Begin(BeginKind.IN_PROGRESS, 1)  # a read changes nothing
    is_new(await store.begin(tenant, "d", BODY, RUNNING_TTL_S), 1)
    assert await store.peek(tenant, "b", BODY) is None
    assert await store.peek(tenant, "a", BODY) == Begin(BeginKind.COMPLETED, 1, result=b"a's")
    for key in ("c", "d"):
        assert await store.peek(tenant, key, BODY) == Begin(BeginKind.IN_PROGRESS, 1)


async def test_bad_arguments_are_refused(store: IdempotencyStore) -> None:
    tenant, key = new_tenant(), new_key()
    with pytest.raises(ValueError, match="running_ttl_s"):
        await store.begin(tenant, key, BODY, running_ttl_s=0)
    with pytest.raises(ValueError, match="attempt"):
        await store.complete(tenant, key, 0, b"", RESULT_TTL_S)
    with pytest.raises(ValueError, match="ttl_s"):
        await store.complete(tenant, key, 1, b"", ttl_s=0)
    with pytest.raises(ValueError, match="output_tokens"):
        await store.release(tenant, key, 1, output_tokens=-1)
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)  # nothing was written


# --- Redis: two gateways, key names, record TTLs ---------------------------------------------------------


@pytest.fixture
async def two_gateways(redis_up: str | None) -> AsyncIterator[tuple[RedisIdempotencyStore, ...]]:
    need_redis(redis_up)
    stores = (RedisIdempotencyStore(REDIS_URL, KEY_PREFIX), RedisIdempotencyStore(REDIS_URL, KEY_PREFIX))
    for s in stores:
        await s.open()
    try:
        yield stores
    finally:
        for s in stores:
            await s.close()


@pytest.fixture
async def raw_redis(redis_up: str | None) -> AsyncIterator[redis.asyncio.Redis]:
    need_redis(redis_up)
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    try:
        yield client
    finally:
        await client.aclose()


async def record_fields(client: redis.asyncio.Redis, name: str) -> dict[bytes, bytes]:
    # NOTE: redis-py types hgetall as sync-or-async; on the asyncio client it is always awaitable.
    return await cast("Awaitable[dict[bytes, bytes]]", client.hgetall(name))


async def test_two_gateways_beginning_one_key_give_exactly_one_new(
    two_gateways: tuple[RedisIdempotencyStore, ...],
) -> None:
    tenant, key = new_tenant(), new_key()
    begins = await asyncio.gather(
        *(two_gateways[i % 2].begin(tenant, key, BODY, RUNNING_TTL_S) for i in range(50))
    )
    assert sorted(b.kind for b in begins) == [BeginKind.IN_PROGRESS] * 49 + [BeginKind.NEW]
    first, second = two_gateways
    await first.release(tenant, key, 1, output_tokens=11)  # the other gateway sees it at once
    is_new(await second.begin(tenant, key, BODY, RUNNING_TTL_S), 2, superseded_output_tokens=11)
    assert await second.complete(tenant, key, 2, BINARY_RESULT, RESULT_TTL_S)
    assert await first.begin(tenant, key, BODY, RUNNING_TTL_S) == Begin(
        BeginKind.COMPLETED, 2, result=BINARY_RESULT
    )


async def test_redis_key_names_hold_the_key_hashed_never_raw(
    two_gateways: tuple[RedisIdempotencyStore, ...], raw_redis: redis.asyncio.Redis
) -> None:
    store = two_gateways[0]
    tenant, key = new_tenant(), f"secret-{uuid.uuid4().hex}"
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)
    names = {k.decode() async for k in raw_redis.scan_iter(match=f"{KEY_PREFIX}{tenant}:*")}
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert names == {f"{KEY_PREFIX}{tenant}:{digest}", f"{KEY_PREFIX}{tenant}:lru"}
    assert store.index_key(tenant) == f"{KEY_PREFIX}{tenant}:lru"
    assert [m for m, _ in await raw_redis.zrange(store.index_key(tenant), 0, -1, withscores=True)] == [
        digest.encode()
    ]
    assert not [k async for k in raw_redis.scan_iter(match=f"{RUN_PREFIX}*{key}*")]


async def test_redis_record_ttls_follow_the_attempt(
    two_gateways: tuple[RedisIdempotencyStore, ...], raw_redis: redis.asyncio.Redis
) -> None:
    store = two_gateways[0]
    tenant, key = new_tenant(), new_key()
    name = store.record_key(tenant, key)
    day_ms = ATTEMPT_RECORD_TTL_S * 1000
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)
    assert day_ms - 5_000 < await raw_redis.pttl(name) <= day_ms  # running: the floor, not 30 s
    assert day_ms - 5_000 < await raw_redis.pttl(store.index_key(tenant)) <= day_ms  # the bound lives as long
    assert (await record_fields(raw_redis, name))[b"state"] == b"running"
    await store.release(tenant, key, 1, output_tokens=2)
    assert day_ms - 5_000 < await raw_redis.pttl(name) <= day_ms  # released: the attempt count stays
    week_s = 7 * 24 * 3600.0
    is_new(await store.begin(tenant, key, BODY, running_ttl_s=week_s), 2, superseded_output_tokens=2)
    assert week_s * 1000 - 5_000 < await raw_redis.pttl(name) <= week_s * 1000  # a longer marker wins
    assert week_s * 1000 - 5_000 < await raw_redis.pttl(store.index_key(tenant)) <= week_s * 1000
    assert await store.complete(tenant, key, 2, b"r", ttl_s=60.0)
    assert 55_000 < await raw_redis.pttl(name) <= 60_000  # completed: the caller's replay window
    assert await raw_redis.pttl(store.index_key(tenant)) > 60_000  # never shortened by a shorter record
    fields = await record_fields(raw_redis, name)
    assert set(fields) == {b"fingerprint", b"attempt", b"state", b"deadline", b"output_tokens", b"result"}
    assert (fields[b"state"], fields[b"attempt"], fields[b"result"]) == (b"completed", b"2", b"r")


async def test_the_redis_store_must_be_opened_first() -> None:
    with pytest.raises(RuntimeError, match="before open"):
        await RedisIdempotencyStore(REDIS_URL, KEY_PREFIX).begin(new_tenant(), new_key(), BODY, 1.0)


async def every_verb_is_unavailable(store: RedisIdempotencyStore) -> None:
    tenant, key = new_tenant(), new_key()
    calls = (
        store.peek(tenant, key, BODY),
        store.begin(tenant, key, BODY, RUNNING_TTL_S),
        store.complete(tenant, key, 1, b"r", RESULT_TTL_S),
        store.release(tenant, key, 1, output_tokens=1),
    )
    for call in calls:
        with pytest.raises(IdempotencyStoreUnavailableError, match="Redis"):
            await call


OUTAGE_REPLIES = {
    "oom": OOM,
    "oom-in-script-before-redis-7": OOM_IN_SCRIPT_BEFORE_7,
    "readonly": READONLY,
    "loading": LOADING,
    "masterdown": MASTERDOWN,
    "clusterdown": CLUSTERDOWN,
    "tryagain": TRYAGAIN,
    "busy": BUSY,
    "misconf": MISCONF,
    "noreplicas": NOREPLICAS,
    "hung": None,
}


@pytest.mark.parametrize("reply", OUTAGE_REPLIES.values(), ids=OUTAGE_REPLIES.keys())
async def test_a_redis_that_refuses_or_never_answers_is_unavailable(reply: bytes | None) -> None:
    fake = FaultyRedis(reply)
    await fake.start()
    store = RedisIdempotencyStore(fake.url, KEY_PREFIX, socket_timeout_s=0.2)
    try:
        await store.open()  # it answers PING
        await every_verb_is_unavailable(store)
    finally:
        await store.close()
        await fake.close()


async def test_a_script_bug_is_not_hidden_as_an_outage() -> None:
    fake = FaultyRedis(SCRIPT_BUG)
    await fake.start()
    store = RedisIdempotencyStore(fake.url, KEY_PREFIX, socket_timeout_s=0.2)
    try:
        await store.open()
        with pytest.raises(redis.exceptions.ResponseError, match="nonexistent global"):
            await store.begin(new_tenant(), new_key(), BODY, RUNNING_TTL_S)
    finally:
        await store.close()
        await fake.close()


async def test_a_redis_down_at_start_does_not_fail_the_start_and_is_unavailable() -> None:
    fake = FaultyRedis(None)
    await fake.start()
    url = fake.url
    await fake.close()  # nothing listens on that port now
    store = RedisIdempotencyStore(url, KEY_PREFIX, socket_timeout_s=0.2)
    try:
        await store.open()
        await every_verb_is_unavailable(store)
    finally:
        await store.close()


async def test_a_cut_connection_is_unavailable_and_the_records_are_there_once_it_is_back(
    redis_up: str | None,
) -> None:
    need_redis(redis_up)
    host, port = REDIS_URL.removeprefix("redis://").split("/")[0].split(":")
    proxy = TcpProxy(host, int(port))
    await proxy.start()
    store = RedisIdempotencyStore(f"redis://127.0.0.1:{proxy.port}/0", KEY_PREFIX, socket_timeout_s=0.5)
    tenant, key = new_tenant(), new_key()
    try:
        await store.open()
        is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)
        await proxy.cut()
        await every_verb_is_unavailable(store)
        await proxy.restore()
        assert await store.complete(tenant, key, 1, b"after the outage", RESULT_TTL_S)
        assert await store.peek(tenant, key, BODY) == Begin(
            BeginKind.COMPLETED, 1, result=b"after the outage"
        )
    finally:
        await store.close()
        await proxy.cut()


# --- in process: the bound on entries, expiry by the injected clock -------------------------------------


async def test_in_process_expired_records_go_first_and_every_tenant_has_its_own_bound() -> None:
    clock = FakeClock()
    store = InProcessIdempotencyStore(max_records_per_tenant=3, clock=clock)
    tenant, other = new_tenant(), new_tenant()
    is_new(await store.begin(tenant, "short", BODY, RUNNING_TTL_S), 1)
    assert await store.complete(tenant, "short", 1, b"s", ttl_s=10.0)
    is_new(await store.begin(tenant, "a", BODY, RUNNING_TTL_S), 1)
    is_new(await store.begin(other, "a", BODY, RUNNING_TTL_S), 1)
    clock.now_s += 11.0  # "short" expired: it goes first
    is_new(await store.begin(tenant, "b", BODY, RUNNING_TTL_S), 1)
    is_new(await store.begin(tenant, "c", BODY, RUNNING_TTL_S), 1)
    assert (store.num_entries_of(tenant), store.num_entries_of(other), store.num_entries) == (3, 1, 4)
    # Full of live records: a, the oldest, goes.
    is_new(await store.begin(tenant, "d", BODY, RUNNING_TTL_S), 1)
    assert (store.num_entries_of(tenant), store.num_entries) == (3, 4)
    assert await store.peek(tenant, "a", BODY) is None
    assert await store.peek(other, "a", BODY) == Begin(BeginKind.IN_PROGRESS, 1)


async def test_in_process_a_flood_of_keys_stays_within_the_bound() -> None:
    clock = FakeClock()
    store = InProcessIdempotencyStore(max_records_per_tenant=100, clock=clock)
    tenants = [new_tenant() for _ in range(3)]
    for i in range(5_000):
        clock.now_s += 0.01
        tenant = tenants[i % 3]
        await store.begin(tenant, f"k{i}", BODY, running_ttl_s=1.0)
        if i % 2:
            await store.release(tenant, f"k{i}", 1, output_tokens=1)  # re-timed: a stale heap entry
    assert store.num_entries == 300 and all(store.num_entries_of(t) == 100 for t in tenants)
    assert len(store._expiry_heap) <= 2 * 300 + 64 + 1  # stale expiry entries do not pile up either


async def test_in_process_records_expire_by_the_injected_clock() -> None:
    clock = FakeClock()
    store = InProcessIdempotencyStore(clock=clock)
    tenant, key = new_tenant(), new_key()
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)
    clock.now_s += RUNNING_TTL_S  # the marker's deadline: presumed dead
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 2)
    await store.release(tenant, key, 2, output_tokens=6)
    clock.now_s += ATTEMPT_RECORD_TTL_S - 1
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 3, superseded_output_tokens=6)
    await store.release(tenant, key, 3, output_tokens=1)
    clock.now_s += ATTEMPT_RECORD_TTL_S  # a released record outlives a day's retries, then goes
    is_new(await store.begin(tenant, key, OTHER_BODY, RUNNING_TTL_S), 1)
    assert await store.complete(tenant, key, 1, b"x", ttl_s=5.0)
    clock.now_s += 4.9
    assert await store.begin(tenant, key, OTHER_BODY, RUNNING_TTL_S) == Begin(
        BeginKind.COMPLETED, 1, result=b"x"
    )
    clock.now_s += 0.1
    is_new(await store.begin(tenant, key, BODY, RUNNING_TTL_S), 1)


# --- the opener -----------------------------------------------------------------------------------------


async def test_the_opener_picks_redis_when_a_url_is_set(redis_up: str | None) -> None:
    in_process = await open_idempotency_store(load_settings(redis_url=None))
    try:
        assert isinstance(in_process, InProcessIdempotencyStore)
    finally:
        await in_process.close()
    need_redis(redis_up)
    shared = await open_idempotency_store(load_settings(redis_url=REDIS_URL, redis_key_prefix=RUN_PREFIX))
    try:
        assert isinstance(shared, RedisIdempotencyStore)
        assert shared.record_key("acme", "k").startswith(f"{RUN_PREFIX}idem:acme:")
        is_new(await shared.begin(new_tenant(), new_key(), BODY, RUNNING_TTL_S), 1)
    finally:
        await shared.close()
