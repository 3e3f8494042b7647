"""The cached tenant resolver under store outages and key floods: a real SQLite store behind a named fake
that can be switched off, held (queries wait until released) and counted, and a fake clock."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sluice.domain import Tenant
from sluice.stores.tenants.base import TenantStoreUnavailable
from sluice.stores.tenants.cache import CachedTenantResolver, ResolverLimits
from sluice.stores.tenants.store import SqliteTenantStore

pytestmark = pytest.mark.anyio

ACME = Tenant("acme", "Acme")
LIMITS = ResolverLimits(ttl_s=5.0, unknown_ttl_s=1.0, stale_max_s=600.0, probe_interval_s=2.0)


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class SwitchableStoreFake(SqliteTenantStore):
    """A real SQLite store whose ``resolve`` can fail like an unreachable server (``down``), or wait until
    ``release`` (``hold``); it counts the queries it received and the most in flight at once."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.down = False
        self.held: asyncio.Event | None = None
        self.num_queries = 0
        self.num_in_flight = 0
        self.max_in_flight = 0

    def hold(self) -> None:
        self.held = asyncio.Event()

    def release(self) -> None:
        assert self.held is not None
        self.held.set()
        self.held = None

    async def resolve(self, api_key: str) -> Tenant | None:
        self.num_queries += 1
        self.num_in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.num_in_flight)
        try:
            if self.held is not None:
                await self.held.wait()
            if self.down:
                raise TenantStoreUnavailable("connection refused (fake)")
            return await super().resolve(api_key)
        finally:
            self.num_in_flight -= 1


class Observed:
    """What the resolver reported through its callbacks."""

    def __init__(self) -> None:
        self.num_stale = 0
        self.down_changes: list[bool] = []
        self.num_lookups = 0

    def resolver(
        self, store: SwitchableStoreFake, clock: FakeClock, limits: ResolverLimits = LIMITS
    ) -> CachedTenantResolver:
        return CachedTenantResolver(
            store,
            limits,
            clock=clock,
            on_stale=self._stale,
            on_store_down=self.down_changes.append,
            on_lookup=self._lookup,
        )

    def _stale(self) -> None:
        self.num_stale += 1

    def _lookup(self) -> None:
        self.num_lookups += 1


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SwitchableStoreFake]:
    s = SwitchableStoreFake(tmp_path / "tenants.db")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


def random_key() -> str:
    return f"sk-random-{uuid.uuid4().hex}"


async def test_known_keys_are_served_from_the_last_good_view_up_to_the_stale_limit(
    store: SwitchableStoreFake, caplog: pytest.LogCaptureFixture
) -> None:
    clock, seen = FakeClock(), Observed()
    resolver = seen.resolver(store, clock)
    key = await store.create(ACME)
    assert await resolver.resolve(key) == ACME

    store.down = True
    clock.now_s += 5.0  # past the TTL: the next request asks the store, which fails
    with caplog.at_level(logging.INFO, logger="sluice.stores.tenants.cache"):
        for _ in range(50):
            assert await resolver.resolve(key) == ACME
            clock.now_s += 1.0
        assert resolver.store_down and seen.down_changes == [True]
        assert seen.num_stale == 50
        # 50 s of outage, one probe per 2 s interval at most (the first failure included).
        assert store.num_queries - 1 <= 1 + 50 // 2

        clock.now_s = 1000.0 + 600.0  # read at 1000.0: exactly the stale limit still serves
        assert await resolver.resolve(key) == ACME
        clock.now_s += 0.001
        with pytest.raises(TenantStoreUnavailable) as refused:
            await resolver.resolve(key)
        assert refused.value.retry_after_s is not None and 1.0 <= refused.value.retry_after_s <= 2.0

        store.down = False
        clock.now_s += 2.0  # a probe is due: it succeeds and ends the outage
        assert await resolver.resolve(key) == ACME
        assert not resolver.store_down and seen.down_changes == [True, False]
    messages = [r.getMessage() for r in caplog.records]
    # once on entry (WARNING), once on recovery (INFO, with its length): not per request
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"], messages
    assert "tenant store unavailable" in messages[0] and "available again" in messages[1]


async def test_unknown_keys_get_unavailable_and_a_flood_costs_one_probe_per_interval(
    store: SwitchableStoreFake,
) -> None:
    clock, seen = FakeClock(), Observed()
    resolver = seen.resolver(store, clock)
    assert await resolver.resolve(random_key()) is None  # store up: unknown is unknown (401)
    store.down = True
    with pytest.raises(TenantStoreUnavailable):
        await resolver.resolve(random_key())  # the failure that starts the outage
    before = store.num_queries
    results = await asyncio.gather(
        *(resolver.resolve(random_key()) for _ in range(200)), return_exceptions=True
    )
    assert all(isinstance(r, TenantStoreUnavailable) for r in results)
    assert store.num_queries == before  # no probe due yet: the flood never reached the store
    clock.now_s += 2.0
    results = await asyncio.gather(
        *(resolver.resolve(random_key()) for _ in range(200)), return_exceptions=True
    )
    assert all(isinstance(r, TenantStoreUnavailable) for r in results)
    assert store.num_queries == before + 1  # one probe for the whole interval


async def test_concurrent_lookups_of_one_key_share_one_query(store: SwitchableStoreFake) -> None:
    clock, seen = FakeClock(), Observed()
    resolver = seen.resolver(store, clock)
    key = await store.create(ACME)
    store.hold()
    waiting = [asyncio.create_task(resolver.resolve(key)) for _ in range(50)]
    unknown = random_key()
    waiting += [asyncio.create_task(resolver.resolve(unknown)) for _ in range(50)]
    await asyncio.sleep(0)  # every task reaches the store (or joins a lookup)
    store.release()
    results = await asyncio.gather(*waiting)
    assert results == [ACME] * 50 + [None] * 50
    assert store.num_queries == 2 and seen.num_lookups == 2
    # Both answers are cached: the unknown one briefly, the known one for the TTL.
    assert await resolver.resolve(unknown) is None and await resolver.resolve(key) == ACME
    assert store.num_queries == 2


async def test_a_flood_of_random_keys_is_bounded_in_flight_and_negatively_cached(
    store: SwitchableStoreFake,
) -> None:
    clock, seen = FakeClock(), Observed()
    limits = ResolverLimits(max_concurrent_lookups=3, max_unknown_entries=100)
    resolver = seen.resolver(store, clock, limits)
    key = await store.create(ACME)
    assert await resolver.resolve(key) == ACME
    keys = [random_key() for _ in range(100)]
    store.hold()
    flood = [asyncio.create_task(resolver.resolve(k)) for k in keys * 2]  # each key twice, at once
    for _ in range(5):
        await asyncio.sleep(0)
    assert store.num_in_flight == 3  # the rest wait here, not in the store's pool
    store.release()
    assert await asyncio.gather(*flood) == [None] * 200
    assert store.max_in_flight == 3 and store.num_queries == 1 + 100
    assert [await resolver.resolve(k) for k in keys] == [None] * 100  # negatively cached
    assert store.num_queries == 1 + 100
    clock.now_s += 1.0  # past unknown_ttl_s: asked again
    assert await resolver.resolve(keys[0]) is None and store.num_queries == 1 + 101

    # More random keys than the unknown map holds: they never evict the known tenant.
    for _ in range(300):
        await resolver.resolve(random_key())
    store.down = True
    clock.now_s += 60.0
    assert await resolver.resolve(key) == ACME  # still served from its last good view


async def test_a_store_that_hangs_times_out_into_the_outage(store: SwitchableStoreFake) -> None:
    clock, seen = FakeClock(), Observed()
    limits = ResolverLimits(lookup_timeout_s=0.05, probe_interval_s=2.0)
    resolver = seen.resolver(store, clock, limits)
    key = await store.create(ACME)
    assert await resolver.resolve(key) == ACME
    clock.now_s += 5.0
    store.hold()  # never released: the store hangs instead of refusing
    assert await resolver.resolve(key) == ACME  # waited out the timeout, then served stale
    assert resolver.store_down
    with pytest.raises(TenantStoreUnavailable):
        await resolver.resolve(random_key())
    # A probe is due: the known key is answered at once while the probe hangs in the background.
    clock.now_s += 2.0
    num_queries = store.num_queries
    assert await asyncio.wait_for(resolver.resolve(key), timeout=0.02) == ACME
    await asyncio.sleep(0.1)  # the probe times out
    assert store.num_queries == num_queries + 1 and resolver.store_down


async def test_a_cancelled_caller_does_not_cancel_the_shared_lookup(store: SwitchableStoreFake) -> None:
    clock, seen = FakeClock(), Observed()
    resolver = seen.resolver(store, clock)
    key = await store.create(ACME)
    store.hold()
    first = asyncio.create_task(resolver.resolve(key))
    second = asyncio.create_task(resolver.resolve(key))
    await asyncio.sleep(0)
    first.cancel()
    store.release()
    assert await second == ACME
    with pytest.raises(asyncio.CancelledError):
        await first
    assert store.num_queries == 1


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="stale_max_s"):
        ResolverLimits(stale_max_s=-1.0)
    with pytest.raises(ValueError, match="probe_interval_s"):
        ResolverLimits(probe_interval_s=0.0)
    with pytest.raises(ValueError, match="max_concurrent_lookups"):
        ResolverLimits(max_concurrent_lookups=0)
