"""The tenant store's contract, run over every backend (SQLite and PostgreSQL), and the cached resolver."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from storage_backends import Backend

from sluice.domain import Tenant
from sluice.settings import load_settings
from sluice.storage import open_ledger, open_tenant_store
from sluice.tenants.base import (
    DEV_TENANT_KEYS,
    KeyConflictError,
    TenantExistsError,
    TenantStore,
    UnknownTenantError,
    hash_key,
    seed_dev_tenants,
)
from sluice.tenants.cache import CachedTenantResolver

pytestmark = pytest.mark.anyio


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[TenantStore]:
    store = backend.make_tenant_store()
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def test_create_returns_a_new_key_that_resolves_to_the_tenant(store: TenantStore) -> None:
    key = await store.create("acme", "Acme Corp", allowed_models=["sluice-tiny"])
    assert re.fullmatch(r"sk-acme-[A-Za-z0-9_-]{32}", key)
    assert await store.resolve(key) == Tenant("acme", "Acme Corp", frozenset({"sluice-tiny"}))
    other = await store.create("globex", "Globex")
    assert other != key
    assert await store.resolve(other) == Tenant("globex", "Globex", frozenset())
    assert [t.tenant_id for t in await store.list()] == ["acme", "globex"]


async def test_wrong_keys_resolve_to_none(store: TenantStore) -> None:
    key = await store.create("acme", "Acme")
    for wrong in ["", "sk-acme-dev", key[:-1], key + "x", key.upper(), hash_key(key)]:
        assert await store.resolve(wrong) is None, wrong


async def test_keys_are_stored_hashed_never_raw(store: TenantStore, backend: Backend) -> None:
    key = await store.create("acme", "Acme")
    await store.add_key("acme", "sk-acme-fixed-key-0123456789")
    rows = await backend.read_table("api_keys")
    cells = [str(cell) for row in await backend.read_table("tenants") for cell in row]
    cells += [str(cell) for row in rows for cell in row]
    for raw in [key, "sk-acme-fixed-key-0123456789"]:
        assert not any(raw in cell for cell in cells), "a raw key is stored"
        assert hash_key(raw) in cells
    prefixes = {row[1] for row in rows}
    assert all(len(p) <= 12 for p in prefixes) and key[:12] in prefixes


async def test_create_twice_fails_and_keeps_the_first_key(store: TenantStore) -> None:
    key = await store.create("acme", "Acme")
    with pytest.raises(TenantExistsError):
        await store.create("acme", "Acme again")
    assert (await store.resolve(key)) == Tenant("acme", "Acme")


async def test_add_key_is_idempotent_and_guards_ownership(store: TenantStore) -> None:
    await store.create("acme", "Acme")
    await store.create("globex", "Globex")
    await store.add_key("acme", "sk-acme-dev")
    await store.add_key("acme", "sk-acme-dev")
    assert (await store.resolve("sk-acme-dev")).tenant_id == "acme"  # type: ignore[union-attr]
    with pytest.raises(KeyConflictError):
        await store.add_key("globex", "sk-acme-dev")
    assert (await store.resolve("sk-acme-dev")).tenant_id == "acme"  # type: ignore[union-attr]
    with pytest.raises(UnknownTenantError):
        await store.add_key("initech", "sk-initech-dev")
    with pytest.raises(ValueError):
        await store.create("Not A Valid Id", "x")


async def test_rotation_and_revocation(store: TenantStore) -> None:
    old = await store.create("acme", "Acme")
    new = await store.issue_key("acme")
    assert new != old
    assert await store.resolve(old) == await store.resolve(new) == Tenant("acme", "Acme")
    assert await store.revoke_key(old) is True
    assert await store.revoke_key(old) is False
    assert await store.resolve(old) is None
    assert await store.resolve(new) is not None
    assert await store.revoke_key("sk-never-issued") is False
    await store.add_key("acme", old)  # re-registering re-activates
    assert await store.resolve(old) is not None
    with pytest.raises(UnknownTenantError):
        await store.issue_key("initech")


async def test_put_tenant_updates_without_touching_keys(store: TenantStore) -> None:
    key = await store.create("acme", "Acme")
    await store.put_tenant(Tenant("acme", "Acme Corp", frozenset({"a", "b"})))
    assert await store.resolve(key) == Tenant("acme", "Acme Corp", frozenset({"a", "b"}))


async def test_seed_dev_tenants_is_idempotent(store: TenantStore, backend: Backend) -> None:
    await seed_dev_tenants(store)
    await seed_dev_tenants(store)
    for tenant_id, key in DEV_TENANT_KEYS.items():
        assert (await store.resolve(key)) == Tenant(tenant_id, tenant_id.capitalize())
    assert len(await backend.read_table("api_keys")) == 2


async def test_migrations_are_idempotent_and_safe_to_start_concurrently(backend: Backend) -> None:
    a, b = backend.make_tenant_store(), backend.make_tenant_store()
    await asyncio.gather(a.open(), b.open())
    try:
        key = await a.create("acme", "Acme")
        c = backend.make_tenant_store()
        await c.open()
        assert await c.resolve(key) is not None
        await c.close()
    finally:
        await a.close()
        await b.close()
    applied = [row for row in await backend.read_table("schema_migrations") if row[0] == "tenants"]
    assert [row[1] for row in applied] == [1]


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


async def test_cached_resolver_staleness_is_bounded_by_ttl(store: TenantStore) -> None:
    clock = FakeClock()
    resolver = CachedTenantResolver(store, ttl_s=5.0, clock=clock)
    key = await store.create("acme", "Acme")
    assert await resolver.resolve(key) == Tenant("acme", "Acme")

    await store.revoke_key(key)
    clock.now_s += 4.9
    assert await resolver.resolve(key) == Tenant("acme", "Acme")  # stale, but within ttl
    clock.now_s += 0.2
    assert await resolver.resolve(key) is None  # past ttl: the revocation is seen

    # Negative results are cached too, for no longer than ttl.
    await store.add_key("acme", key)
    assert await resolver.resolve(key) is None
    clock.now_s += 5.1
    assert await resolver.resolve(key) == Tenant("acme", "Acme")


async def test_cached_resolver_is_bounded_and_can_be_invalidated(store: TenantStore) -> None:
    resolver = CachedTenantResolver(store, ttl_s=60.0, max_entries=3)
    key = await store.create("acme", "Acme")
    for i in range(10):
        assert await resolver.resolve(f"sk-random-{i}") is None
    assert resolver.num_entries == 3
    assert await resolver.resolve(key) is not None
    await store.revoke_key(key)
    resolver.invalidate(key)
    assert await resolver.resolve(key) is None
    uncached = CachedTenantResolver(store, ttl_s=0)
    await store.add_key("acme", key)
    assert await uncached.resolve(key) is not None and uncached.num_entries == 0


async def test_factories_pick_the_backend_from_settings_and_seed(backend: Backend, tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path / "state", database_url=backend.database_url)
    store = await open_tenant_store(settings)
    ledger = await open_ledger(settings)
    try:
        expected = "Postgres" if backend.database_url else "Sqlite"
        assert type(store).__name__.startswith(expected) and type(ledger).__name__.startswith(expected)
        assert (await store.resolve("sk-globex-dev")) == Tenant("globex", "Globex")
        assert (await ledger.query("acme")).rows == []
    finally:
        await store.close()
        await ledger.close()
    assert (backend.database_url is None) == settings.sqlite_path.exists()
