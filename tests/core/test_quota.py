"""Quotas: the store contract over every backend (in-process and the real Redis), atomicity across two
gateways, the pure bucket arithmetic and its Lua mirror, and fail-open / fail-closed / recovery.

Redis is ``TEST_REDIS_URL`` (default 127.0.0.1:6379). Keys live under a prefix unique to this run, deleted at
the end (never FLUSHDB: the server is shared). The Redis params skip, saying why, only when it is down.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from ports import free_port
from redis_faults import (
    BUSY,
    CLUSTERDOWN,
    LOADING,
    MASTERDOWN,
    MISCONF,
    NOREPLICAS,
    OOM,
    OOM_IN_SCRIPT,
    OOM_IN_SCRIPT_BEFORE_7,
    READONLY,
    SCRIPT_BUG,
    TRYAGAIN,
    WRONGTYPE,
    FaultyRedis,
    ReplyFaultProxy,
)
from redis_run import REDIS_URL, RUN_PREFIX, need_redis
from tcp_proxy import TcpProxy

from sluice.domain import Tenant
from sluice.settings import load_settings
from sluice.stores.openers import open_quota_store
from sluice.stores.quota import bucket
from sluice.stores.quota.base import QuotaDenied, QuotaGrant, QuotaLimit, QuotaStore, QuotaStoreUnavailable
from sluice.stores.quota.failopen import FailOpenQuotaStore
from sluice.stores.quota.inprocess import InProcessQuotaStore
from sluice.stores.quota.redis import RedisQuotaStore

KEY_PREFIX = f"{RUN_PREFIX}quota:"
LEASE_TTL_S = 30.0


def new_tenant(tokens_per_minute: int | None = None, max_concurrent_requests: int | None = None) -> Tenant:
    tenant_id = f"t-{uuid.uuid4().hex[:12]}"
    return Tenant(
        tenant_id,
        tenant_id,
        tokens_per_minute=tokens_per_minute,
        max_concurrent_requests=max_concurrent_requests,
    )


class FakeClock:
    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def rid() -> str:
    """A new request id."""
    return f"cmpl-{uuid.uuid4().hex}"


def granted(decision: QuotaGrant | QuotaDenied) -> QuotaGrant:
    assert isinstance(decision, QuotaGrant), decision
    return decision


def denied(decision: QuotaGrant | QuotaDenied, limit: QuotaLimit) -> QuotaDenied:
    assert isinstance(decision, QuotaDenied), decision
    assert decision.limit is limit, decision
    assert decision.retry_after_s > 0, decision
    return decision


# --- the contract, over every store -------------------------------------------------------------------

SOURCES = {"inprocess": "inprocess", "redis": "redis"}


@pytest.fixture(params=sorted(SOURCES))
async def store(request: pytest.FixtureRequest, redis_up: str | None) -> AsyncIterator[QuotaStore]:
    s: QuotaStore
    if request.param == "redis":
        need_redis(redis_up)
        s = RedisQuotaStore(REDIS_URL, key_prefix=KEY_PREFIX)
    else:
        s = InProcessQuotaStore()
    await s.open()
    try:
        yield s
    finally:
        await s.close()


pytestmark = pytest.mark.anyio


async def test_a_request_within_budget_is_granted_a_lease_and_a_reservation(store: QuotaStore) -> None:
    tenant = new_tenant(10_000, 5)
    grant = granted(await store.acquire(tenant, 1_200, LEASE_TTL_S, request_id=rid()))
    assert (grant.tenant_id, grant.reserved_tokens, grant.has_lease) == (tenant.tenant_id, 1_200, True)
    assert grant.source in SOURCES.values()
    other = granted(await store.acquire(tenant, 1_200, LEASE_TTL_S, request_id=rid()))
    assert other.request_id != grant.request_id


async def test_a_spent_budget_is_denied_with_the_numbers_and_the_refill_wait(store: QuotaStore) -> None:
    tenant = new_tenant(600)  # 10 tokens/s
    granted(await store.acquire(tenant, 500, LEASE_TTL_S, request_id=rid()))
    refusal = denied(
        await store.acquire(tenant, 200, LEASE_TTL_S, request_id=rid()), QuotaLimit.TOKENS_PER_MINUTE
    )
    assert "200 tokens requested, 100 available of 600 per minute" in refusal.message
    assert tenant.tenant_id in refusal.message
    assert 9.5 < refusal.retry_after_s <= 10.0  # (200 - 100) / 10, less what refilled meanwhile


async def test_a_concurrency_denial_reserves_no_tokens(store: QuotaStore) -> None:
    tenant = new_tenant(600, 1)
    first = granted(await store.acquire(tenant, 100, LEASE_TTL_S, request_id=rid()))
    refusal = denied(
        await store.acquire(tenant, 100, LEASE_TTL_S, request_id=rid()), QuotaLimit.CONCURRENT_REQUESTS
    )
    assert "1 requests in flight, at most 1 allowed" in refusal.message
    assert refusal.retry_after_s <= 1.0  # the lease expires in 30 s, but settle usually frees it sooner
    await store.settle(first, used_tokens=0)
    granted(
        await store.acquire(tenant, 600, LEASE_TTL_S, request_id=rid())
    )  # the whole budget: the denial took none


async def test_settle_refunds_what_was_not_used(store: QuotaStore) -> None:
    tenant = new_tenant(600)
    grant = granted(await store.acquire(tenant, 600, LEASE_TTL_S, request_id=rid()))
    denied(await store.acquire(tenant, 100, LEASE_TTL_S, request_id=rid()), QuotaLimit.TOKENS_PER_MINUTE)
    await store.settle(grant, used_tokens=100)
    granted(await store.acquire(tenant, 500, LEASE_TTL_S, request_id=rid()))


async def test_settle_twice_refunds_once(store: QuotaStore) -> None:
    tenant = new_tenant(600, 2)
    first = granted(await store.acquire(tenant, 300, LEASE_TTL_S, request_id=rid()))
    granted(await store.acquire(tenant, 300, LEASE_TTL_S, request_id=rid()))
    await store.settle(first, used_tokens=0)
    await store.settle(first, used_tokens=0)
    denied(
        await store.acquire(tenant, 350, LEASE_TTL_S, request_id=rid()), QuotaLimit.TOKENS_PER_MINUTE
    )  # 300 back, not 600
    granted(await store.acquire(tenant, 300, LEASE_TTL_S, request_id=rid()))  # and one lease freed, not two


async def test_using_more_than_reserved_leaves_a_debt(store: QuotaStore) -> None:
    tenant = new_tenant(600)
    grant = granted(await store.acquire(tenant, 100, LEASE_TTL_S, request_id=rid()))
    await store.settle(grant, used_tokens=700)  # level 600 - 700 = -100
    refusal = denied(
        await store.acquire(tenant, 1, LEASE_TTL_S, request_id=rid()), QuotaLimit.TOKENS_PER_MINUTE
    )
    assert "1 tokens requested, 0 available" in refusal.message
    assert 10.0 < refusal.retry_after_s <= 10.1  # (1 + 100) / 10


async def test_an_expired_lease_frees_its_slot(store: QuotaStore) -> None:
    tenant = new_tenant(None, 1)
    granted(await store.acquire(tenant, 10, lease_ttl_s=0.3, request_id=rid()))
    refusal = denied(
        await store.acquire(tenant, 10, LEASE_TTL_S, request_id=rid()), QuotaLimit.CONCURRENT_REQUESTS
    )
    assert refusal.retry_after_s <= 0.3  # the soonest lease's expiry
    await asyncio.sleep(0.35)
    granted(await store.acquire(tenant, 10, LEASE_TTL_S, request_id=rid()))


async def test_an_unlimited_tenant_is_always_granted(store: QuotaStore) -> None:
    tenant = new_tenant(None, None)
    grants = [
        granted(await store.acquire(tenant, 1_000_000, LEASE_TTL_S, request_id=rid())) for _ in range(20)
    ]
    assert all(g.reserved_tokens == 0 and not g.has_lease for g in grants)
    for g in grants:
        await store.settle(g, used_tokens=1_000_000)
    granted(await store.acquire(tenant, 1_000_000, LEASE_TTL_S, request_id=rid()))


async def test_a_request_larger_than_the_budget_can_never_fit(store: QuotaStore) -> None:
    tenant = new_tenant(600, 1)
    refusal = denied(
        await store.acquire(tenant, 601, LEASE_TTL_S, request_id=rid()), QuotaLimit.REQUEST_TOO_LARGE
    )
    assert refusal.retry_after_s == 60.0
    assert "601 tokens requested" in refusal.message and "600 tokens per minute" in refusal.message
    granted(
        await store.acquire(tenant, 600, LEASE_TTL_S, request_id=rid())
    )  # the refusal took neither lease nor tokens


async def test_the_budget_refills_over_time(store: QuotaStore) -> None:
    tenant = new_tenant(600)  # 10 tokens/s
    granted(await store.acquire(tenant, 600, LEASE_TTL_S, request_id=rid()))
    refusal = denied(
        await store.acquire(tenant, 5, LEASE_TTL_S, request_id=rid()), QuotaLimit.TOKENS_PER_MINUTE
    )
    assert 0.4 < refusal.retry_after_s <= 0.5
    await asyncio.sleep(0.6)
    granted(await store.acquire(tenant, 5, LEASE_TTL_S, request_id=rid()))


async def test_bad_arguments_are_refused(store: QuotaStore) -> None:
    tenant = new_tenant(600, 1)
    with pytest.raises(ValueError, match="tokens"):
        await store.acquire(tenant, 0, LEASE_TTL_S, request_id=rid())
    with pytest.raises(ValueError, match="lease_ttl_s"):
        await store.acquire(tenant, 1, 0, request_id=rid())
    grant = granted(await store.acquire(tenant, 1, LEASE_TTL_S, request_id=rid()))
    with pytest.raises(ValueError, match="used_tokens"):
        await store.settle(grant, -1)


async def test_an_acquire_repeated_for_one_request_takes_once(store: QuotaStore) -> None:
    tenant = new_tenant(600, 1)
    request_id = rid()
    first = granted(await store.acquire(tenant, 400, LEASE_TTL_S, request_id=request_id))
    again = granted(await store.acquire(tenant, 400, LEASE_TTL_S, request_id=request_id))
    assert again == first  # the same grant: no second lease (cap 1), no second reservation
    denied(await store.acquire(tenant, 300, LEASE_TTL_S, request_id=rid()), QuotaLimit.CONCURRENT_REQUESTS)
    await store.settle(first, used_tokens=400)
    await store.settle(again, used_tokens=400)  # the same request: settled once
    granted(await store.acquire(tenant, 200, LEASE_TTL_S, request_id=rid()))  # 600 - 400 left, not - 800
    with pytest.raises(ValueError, match="request_id"):
        await store.acquire(tenant, 1, LEASE_TTL_S, request_id="")


async def test_an_id_acquires_anew_once_its_grant_is_settled(store: QuotaStore) -> None:
    """A later attempt with the same id (an Idempotency-Key's retry) is counted again."""
    tenant = new_tenant(600)
    request_id = rid()
    await store.settle(granted(await store.acquire(tenant, 300, LEASE_TTL_S, request_id=request_id)), 300)
    granted(await store.acquire(tenant, 300, LEASE_TTL_S, request_id=request_id))
    denied(await store.acquire(tenant, 1, LEASE_TTL_S, request_id=rid()), QuotaLimit.TOKENS_PER_MINUTE)


# A budget that refills 0.1 token/s: a whole token takes 10 s, so no test here sees refill in a floor.
SLOW_TOKENS_PER_MINUTE = 6


async def test_a_grant_says_what_the_bucket_holds_after_its_reservation(store: QuotaStore) -> None:
    tenant = new_tenant(SLOW_TOKENS_PER_MINUTE, 5)
    assert granted(await store.acquire(tenant, 2, LEASE_TTL_S, request_id=rid())).remaining_tokens == 4
    assert granted(await store.acquire(tenant, 3, LEASE_TTL_S, request_id=rid())).remaining_tokens == 1
    refusal = denied(
        await store.acquire(tenant, 2, LEASE_TTL_S, request_id=rid()), QuotaLimit.TOKENS_PER_MINUTE
    )
    assert refusal.remaining_tokens == 1  # what the refusal saw


async def test_a_tenant_without_a_token_budget_has_no_remaining(store: QuotaStore) -> None:
    capped = granted(await store.acquire(new_tenant(None, 2), 10, LEASE_TTL_S, request_id=rid()))
    unlimited = granted(await store.acquire(new_tenant(None, None), 10, LEASE_TTL_S, request_id=rid()))
    assert capped.remaining_tokens is None and unlimited.remaining_tokens is None
    refusal = denied(
        await store.acquire(new_tenant(None, 0), 10, LEASE_TTL_S, request_id=rid()),
        QuotaLimit.CONCURRENT_REQUESTS,
    )
    assert refusal.remaining_tokens is None  # only a token refusal knows the bucket


async def test_a_repeated_acquire_reports_the_remaining_of_its_first(store: QuotaStore) -> None:
    """As then, not as now: the repeat returns the record of the earlier decision."""
    tenant = new_tenant(SLOW_TOKENS_PER_MINUTE, 5)
    request_id = rid()
    first = granted(await store.acquire(tenant, 2, LEASE_TTL_S, request_id=request_id))
    granted(await store.acquire(tenant, 3, LEASE_TTL_S, request_id=rid()))
    again = granted(await store.acquire(tenant, 2, LEASE_TTL_S, request_id=request_id))
    assert first.remaining_tokens == again.remaining_tokens == 4


async def test_a_grant_recorded_without_remaining_reports_the_level_now(redis_up: str | None) -> None:
    """A grant key an older gateway wrote (no ``remaining`` field), repeated: the bucket as it is now."""
    need_redis(redis_up)
    store = RedisQuotaStore(REDIS_URL, key_prefix=KEY_PREFIX)
    raw = redis.asyncio.Redis.from_url(REDIS_URL)
    await store.open()
    try:
        tenant = new_tenant(SLOW_TOKENS_PER_MINUTE, 5)
        request_id = rid()
        granted(await store.acquire(tenant, 2, LEASE_TTL_S, request_id=request_id))
        granted(await store.acquire(tenant, 3, LEASE_TTL_S, request_id=rid()))
        assert await raw.hdel(f"{KEY_PREFIX}{{{tenant.tenant_id}}}:grant:{request_id}", "remaining") == 1
        again = granted(await store.acquire(tenant, 2, LEASE_TTL_S, request_id=request_id))
        assert (again.reserved_tokens, again.remaining_tokens) == (2, 1)
    finally:
        await store.close()
        await raw.aclose()


# --- atomicity across gateways (Redis) -------------------------------------------------------------------


@pytest.fixture
async def two_gateways(redis_up: str | None) -> AsyncIterator[tuple[RedisQuotaStore, RedisQuotaStore]]:
    need_redis(redis_up)
    a, b = (
        RedisQuotaStore(REDIS_URL, key_prefix=KEY_PREFIX),
        RedisQuotaStore(REDIS_URL, key_prefix=KEY_PREFIX),
    )
    await a.open()
    await b.open()
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def test_two_gateways_never_exceed_the_concurrency_cap(
    two_gateways: tuple[RedisQuotaStore, RedisQuotaStore],
) -> None:
    tenant = new_tenant(None, 7)
    a, b = two_gateways
    decisions = await asyncio.gather(
        *((a, b)[i % 2].acquire(tenant, 10, LEASE_TTL_S, request_id=rid()) for i in range(50))
    )
    assert sum(isinstance(d, QuotaGrant) for d in decisions) == 7
    assert {d.limit for d in decisions if isinstance(d, QuotaDenied)} == {QuotaLimit.CONCURRENT_REQUESTS}


async def test_two_gateways_never_exceed_the_token_budget(
    two_gateways: tuple[RedisQuotaStore, RedisQuotaStore],
) -> None:
    tenant = new_tenant(1_000)  # 16.7 tokens/s: far from another 150 within the test
    a, b = two_gateways
    decisions = await asyncio.gather(
        *((a, b)[i % 2].acquire(tenant, 150, LEASE_TTL_S, request_id=rid()) for i in range(50))
    )
    assert sum(isinstance(d, QuotaGrant) for d in decisions) == math.floor(1_000 / 150)


# --- the bucket, pure ---------------------------------------------------------------------------------


def test_a_bucket_refills_at_its_rate_up_to_its_capacity() -> None:
    assert bucket.refill(0.0, 10.0, 12.5, 600, 10.0) == bucket.BucketState(25.0, 12.5)
    assert bucket.refill(590.0, 10.0, 20.0, 600, 10.0) == bucket.BucketState(600.0, 20.0)
    assert bucket.refill(-100.0, 0.0, 5.0, 600, 10.0) == bucket.BucketState(-50.0, 5.0)  # debt refills too
    assert bucket.refill(7.0, 10.0, 9.0, 600, 10.0) == bucket.BucketState(7.0, 10.0)  # clock went back


def test_take_is_all_or_nothing_and_says_how_long_to_wait() -> None:
    ok = bucket.try_take(100.0, 0.0, 0.0, 600, 10.0, 100)
    assert ok == bucket.TakeResult(True, bucket.BucketState(0.0, 0.0), 0.0)
    no = bucket.try_take(100.0, 0.0, 1.0, 600, 10.0, 150)  # 110 after refill
    assert no == bucket.TakeResult(False, bucket.BucketState(110.0, 1.0), 4.0)


def test_give_back_caps_at_capacity_and_a_negative_refund_makes_debt() -> None:
    assert bucket.give_back(550.0, 0.0, 0.0, 600, 10.0, 100) == bucket.BucketState(600.0, 0.0)
    assert bucket.give_back(50.0, 0.0, 0.0, 600, 10.0, -150) == bucket.BucketState(-100.0, 0.0)
    assert bucket.seconds_until_full(-100.0, 600, 10.0) == 70.0
    assert bucket.full(600, 3.0) == bucket.BucketState(600.0, 3.0)
    assert bucket.rate_tokens_per_s(600) == 10.0


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.integers(1, 40)),
        st.tuples(st.just("settle"), st.integers(0, 10), st.integers(0, 60)),
        st.tuples(st.just("wait"), st.integers(1, 60)),
    ),
    min_size=1,
    max_size=25,
)
NEVER_S = 1e6  # leases that outlive any run: the agreement test is about the bucket and the cap


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
@example(
    ops=[("acquire", 40), ("wait", 40), ("settle", 0, 0), ("acquire", 40), ("acquire", 40)]
)  # settle's cap
@example(ops=[("acquire", 30), ("settle", 0, 60), ("acquire", 1), ("wait", 31), ("acquire", 1)])  # debt
def test_the_lua_scripts_and_the_python_bucket_decide_alike(redis_up: str | None, ops: list[tuple]) -> None:
    """A random run of acquires, settles and waits, on both stores, with 1 token/s and whole amounts.

    A wait advances the in-process clock, and moves the Redis bucket's ``ts`` back by as much (Redis's clock
    cannot be moved), so both refill alike. The in-process level stays whole; Redis's also refills by real
    time, less than one token over a run well under a second, so no decision can differ by it."""
    need_redis(redis_up)
    asyncio.run(_run_both(ops))


async def _run_both(ops: list[tuple]) -> None:
    tenant = new_tenant(60, 3)  # 1 token/s
    clock = FakeClock(0.0)
    python = InProcessQuotaStore(clock=clock)
    lua = RedisQuotaStore(REDIS_URL, key_prefix=KEY_PREFIX)
    raw = redis.asyncio.Redis.from_url(REDIS_URL)
    bucket_key = f"{KEY_PREFIX}{{{tenant.tenant_id}}}:bucket"
    await lua.open()
    started_s = time.monotonic()
    try:
        pending: list[tuple[QuotaGrant, QuotaGrant]] = []
        for op in ops:
            if op[0] == "acquire":
                p, r = (
                    await python.acquire(tenant, op[1], NEVER_S, request_id=rid()),
                    await lua.acquire(tenant, op[1], NEVER_S, request_id=rid()),
                )
                assert type(p) is type(r), (op, p, r)
                if isinstance(p, QuotaGrant) and isinstance(r, QuotaGrant):
                    assert p.remaining_tokens == r.remaining_tokens, (op, p, r)
                    pending.append((p, r))
                elif isinstance(p, QuotaDenied) and isinstance(r, QuotaDenied):
                    assert p.limit is r.limit, (p, r)
                    assert r.retry_after_s == pytest.approx(p.retry_after_s, abs=time.monotonic() - started_s)
            elif op[0] == "wait":
                clock.now_s += op[1]
                if await raw.exists(bucket_key):
                    await raw.hincrbyfloat(bucket_key, "ts", -op[1])
            elif pending:
                p, r = pending.pop(op[1] % len(pending))
                await python.settle(p, op[2])
                await lua.settle(r, op[2])
        assert time.monotonic() - started_s < 1.0, "too slow for the drift bound; rerun"
    finally:
        await lua.close()
        await raw.aclose()


# --- fail-open, fail-closed, recovery -------------------------------------------------------------------


async def test_an_unreachable_redis_fails_open_for_the_window_then_closed() -> None:
    clock = FakeClock()
    num_fail_open = 0

    def count() -> None:
        nonlocal num_fail_open
        num_fail_open += 1

    dead = RedisQuotaStore(f"redis://127.0.0.1:{free_port()}/0", key_prefix=KEY_PREFIX)
    store = FailOpenQuotaStore(
        dead, InProcessQuotaStore(clock=clock), window_s=30.0, clock=clock, on_fail_open=count
    )
    await store.open()  # does not raise: the outage starts here
    try:
        tenant = new_tenant(600, 2)
        grants = [granted(await store.acquire(tenant, 100, LEASE_TTL_S, request_id=rid())) for _ in range(2)]
        assert {g.source for g in grants} == {"local-fallback"}
        assert [g.remaining_tokens for g in grants] == [500, 400]  # the fallback's bucket, passed through
        denied(
            await store.acquire(tenant, 100, LEASE_TTL_S, request_id=rid()), QuotaLimit.CONCURRENT_REQUESTS
        )  # still enforced
        await store.settle(grants[0], used_tokens=50)
        granted(await store.acquire(tenant, 100, LEASE_TTL_S, request_id=rid()))
        assert num_fail_open == 4
        # A Redis grant issued before the outage: settling it must not raise.
        await store.settle(QuotaGrant(tenant.tenant_id, "g-before", 100, True, "redis", 500), used_tokens=10)
        clock.now_s += 30.0
        refusal = denied(
            await store.acquire(tenant, 100, LEASE_TTL_S, request_id=rid()), QuotaLimit.STORE_UNAVAILABLE
        )
        assert "30 s" in refusal.message
        assert num_fail_open == 4
    finally:
        await store.close()


async def test_grants_come_from_redis_again_once_it_is_back(redis_up: str | None) -> None:
    need_redis(redis_up)
    target = redis.connection.parse_url(REDIS_URL)
    proxy = TcpProxy(target.get("host", "127.0.0.1"), int(target.get("port", 6379)))
    port = await proxy.start()
    clock = FakeClock()
    primary = RedisQuotaStore(f"redis://127.0.0.1:{port}/{target.get('db', 0)}", key_prefix=KEY_PREFIX)
    store = FailOpenQuotaStore(primary, InProcessQuotaStore(clock=clock), window_s=30.0, clock=clock)
    await store.open()
    try:
        tenant = new_tenant(6_000, 10)
        before = granted(await store.acquire(tenant, 100, LEASE_TTL_S, request_id=rid()))
        assert before.source == "redis"
        await proxy.cut()
        during = granted(await store.acquire(tenant, 100, LEASE_TTL_S, request_id=rid()))
        assert during.source == "local-fallback"
        await store.settle(before, used_tokens=10)  # Redis unreachable: logged, not raised
        clock.now_s += 29.0  # still inside the window
        await proxy.restore()
        after = granted(await store.acquire(tenant, 100, LEASE_TTL_S, request_id=rid()))
        assert after.source == "redis"
        clock.now_s += 60.0  # the outage ended: a new one would start its own window
        await store.settle(during, used_tokens=10)
        await store.settle(after, used_tokens=10)
        granted(await store.acquire(tenant, 100, LEASE_TTL_S, request_id=rid()))
    finally:
        await store.close()
        await proxy.cut()


async def test_the_opener_picks_the_store_from_settings(redis_up: str | None) -> None:
    local = await open_quota_store(load_settings(redis_url=None))
    assert isinstance(local, InProcessQuotaStore)
    await local.close()
    need_redis(redis_up)
    shared = await open_quota_store(load_settings(redis_url=REDIS_URL, redis_key_prefix=RUN_PREFIX))
    try:
        assert isinstance(shared, FailOpenQuotaStore)
        assert (
            granted(await shared.acquire(new_tenant(600, 1), 10, LEASE_TTL_S, request_id=rid())).source
            == "redis"
        )
    finally:
        await shared.close()


class _HangingStore(InProcessQuotaStore):
    """A primary that fails like a Redis that stopped answering, counting how often it is asked."""

    def __init__(self) -> None:
        super().__init__()
        self.num_calls = 0

    async def acquire(
        self, tenant: Tenant, tokens: int, lease_ttl_s: float, *, request_id: str
    ) -> QuotaGrant | QuotaDenied:
        self.num_calls += 1
        raise QuotaStoreUnavailable("TimeoutError: no answer")


async def test_an_outage_probes_the_store_once_per_interval_not_per_request() -> None:
    clock = FakeClock()
    primary = _HangingStore()
    store = FailOpenQuotaStore(
        primary, InProcessQuotaStore(clock=clock), window_s=30.0, clock=clock, probe_interval_s=1.0
    )
    await store.open()
    tenant = new_tenant(None, None)
    for _ in range(20):
        assert (
            granted(await store.acquire(tenant, 10, LEASE_TTL_S, request_id=rid())).source == "local-fallback"
        )
    assert primary.num_calls == 1  # the failure that started the outage; no probe due yet
    clock.now_s += 1.0
    granted(await store.acquire(tenant, 10, LEASE_TTL_S, request_id=rid()))
    granted(await store.acquire(tenant, 10, LEASE_TTL_S, request_id=rid()))
    assert primary.num_calls == 2  # one probe per interval
    await store.close()


# --- every way Redis can fail: fail open, never twice ------------------------------------------------------


async def test_a_lost_reply_retried_by_the_client_debits_once(redis_up: str | None) -> None:
    """Redis ran the acquire, the reply was lost with its connection, and redis-py's Retry re-sent the
    script on a new one: the second run finds the request's grant and takes nothing."""
    need_redis(redis_up)
    target = redis.connection.parse_url(REDIS_URL)
    proxy = ReplyFaultProxy(target.get("host", "127.0.0.1"), int(target.get("port", 6379)))
    port = await proxy.start()
    store = RedisQuotaStore(f"redis://127.0.0.1:{port}/{target.get('db', 0)}", key_prefix=KEY_PREFIX)
    await store.open()
    try:
        granted(await store.acquire(new_tenant(600), 1, LEASE_TTL_S, request_id=rid()))  # script loaded
        tenant = new_tenant(600)
        proxy.drop_next_reply()
        grant = granted(await store.acquire(tenant, 100, LEASE_TTL_S, request_id=rid()))
        assert proxy.num_dropped == 1 and grant.source == "redis"
        granted(await store.acquire(tenant, 500, LEASE_TTL_S, request_id=rid()))  # 100 taken, not 200
    finally:
        await store.close()
        await proxy.close()


async def test_a_reply_too_late_fails_open_and_its_settle_releases_what_redis_took(
    redis_up: str | None,
) -> None:
    need_redis(redis_up)
    target = redis.connection.parse_url(REDIS_URL)
    proxy = ReplyFaultProxy(target.get("host", "127.0.0.1"), int(target.get("port", 6379)))
    port = await proxy.start()
    clock = FakeClock()
    primary = RedisQuotaStore(f"redis://127.0.0.1:{port}/{target.get('db', 0)}", key_prefix=KEY_PREFIX)
    store = FailOpenQuotaStore(primary, InProcessQuotaStore(clock=clock), window_s=30.0, clock=clock)
    direct = RedisQuotaStore(REDIS_URL, key_prefix=KEY_PREFIX)
    await store.open()
    await direct.open()
    try:
        tenant = new_tenant(600, 1)
        granted(await store.acquire(new_tenant(600), 1, LEASE_TTL_S, request_id=rid()))  # script loaded
        proxy.hold_replies()  # Redis runs the script; its reply comes after the client's socket timeout
        grant = granted(await store.acquire(tenant, 600, LEASE_TTL_S, request_id=rid()))
        assert grant.source == "local-fallback"
        proxy.release_replies()
        # Redis holds the lease and the whole budget for a request it never answered.
        denied(await direct.acquire(tenant, 1, LEASE_TTL_S, request_id=rid()), QuotaLimit.CONCURRENT_REQUESTS)
        clock.now_s += 1.0  # a probe is due
        await store.settle(grant, used_tokens=600)  # charged by the fallback; Redis gives its part back
        granted(await direct.acquire(tenant, 600, LEASE_TTL_S, request_id=rid()))
    finally:
        await direct.close()
        await store.close()
        await proxy.close()


@pytest.mark.parametrize(
    "reply",
    [OOM, READONLY, LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, BUSY, MISCONF, NOREPLICAS, OOM_IN_SCRIPT,
     OOM_IN_SCRIPT_BEFORE_7],
    ids=["oom", "readonly", "loading", "masterdown", "clusterdown", "tryagain", "busy", "misconf",
         "noreplicas", "oom-in-script", "oom-in-script-before-7"],
)  # fmt: skip
async def test_every_redis_refusal_takes_the_fail_open_path(reply: bytes) -> None:
    fake = FaultyRedis(reply)
    await fake.start()
    num_fail_open = 0

    def count() -> None:
        nonlocal num_fail_open
        num_fail_open += 1

    store = FailOpenQuotaStore(RedisQuotaStore(fake.url, key_prefix=KEY_PREFIX), InProcessQuotaStore(),
                               on_fail_open=count)  # fmt: skip
    await store.open()  # it answers PING
    try:
        grant = granted(await store.acquire(new_tenant(600, 2), 100, LEASE_TTL_S, request_id=rid()))
        assert grant.source == "local-fallback" and num_fail_open == 1 and fake.num_refused >= 1
        await store.settle(grant, used_tokens=10)
    finally:
        await store.close()
        await fake.close()


@pytest.mark.parametrize("reply", [WRONGTYPE, SCRIPT_BUG], ids=["wrongtype", "script-bug"])
async def test_our_own_redis_errors_are_not_an_outage(reply: bytes) -> None:
    """A bug must surface, not hide behind a fallback that looks like an outage."""
    fake = FaultyRedis(reply)
    await fake.start()
    store = FailOpenQuotaStore(RedisQuotaStore(fake.url, key_prefix=KEY_PREFIX), InProcessQuotaStore())
    await store.open()
    try:
        with pytest.raises(redis.exceptions.ResponseError):
            await store.acquire(new_tenant(600, 2), 100, LEASE_TTL_S, request_id=rid())
    finally:
        await store.close()
        await fake.close()
