"""The tenant store's contract, run over every backend (SQLite and PostgreSQL), and the cached resolver."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from storage_backends import Backend
from tcp_proxy import TcpProxy

from sluice.domain import ALL_CLASSES, RequestClass, Tenant
from sluice.settings import load_settings
from sluice.stores.db import apply_pg_migrations, apply_sqlite_migrations, open_pg_pool
from sluice.stores.openers import open_ledger, open_tenant_store
from sluice.stores.tenants.base import (
    DEV_TENANT_KEYS,
    KeyConflictError,
    TenantExistsError,
    TenantStore,
    TenantStoreUnavailable,
    UnknownTenantError,
    dev_tenant,
    hash_key,
    key_prefix,
    seed_dev_tenants,
)
from sluice.stores.tenants.cache import CachedTenantResolver, ResolverLimits
from sluice.stores.tenants.migrations import COMPONENT, MIGRATIONS
from sluice.stores.tenants.store import PostgresTenantStore, SqliteTenantStore
from sluice.stores.transactions import Tx

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
    key = await store.create(Tenant("acme", "Acme Corp", frozenset({"sluice-tiny"})))
    assert re.fullmatch(r"sk-acme-[A-Za-z0-9_-]{32}", key)
    assert await store.resolve(key) == Tenant("acme", "Acme Corp", frozenset({"sluice-tiny"}))
    other = await store.create(Tenant("globex", "Globex"))
    assert other != key
    assert await store.resolve(other) == Tenant("globex", "Globex", frozenset())
    assert [t.tenant_id for t in await store.list()] == ["acme", "globex"]


async def test_wrong_keys_resolve_to_none(store: TenantStore) -> None:
    key = await store.create(Tenant("acme", "Acme"))
    for wrong in ["", "sk-acme-dev", key[:-1], key + "x", key.upper(), hash_key(key)]:
        assert await store.resolve(wrong) is None, wrong


async def test_keys_are_stored_hashed_never_raw(store: TenantStore, backend: Backend) -> None:
    key = await store.create(Tenant("acme", "Acme"))
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
    key = await store.create(Tenant("acme", "Acme"))
    with pytest.raises(TenantExistsError):
        await store.create(Tenant("acme", "Acme again"))
    assert (await store.resolve(key)) == Tenant("acme", "Acme")


async def test_add_key_is_idempotent_and_guards_ownership(store: TenantStore) -> None:
    await store.create(Tenant("acme", "Acme"))
    await store.create(Tenant("globex", "Globex"))
    await store.add_key("acme", "sk-acme-dev")
    await store.add_key("acme", "sk-acme-dev")
    assert (await store.resolve("sk-acme-dev")).tenant_id == "acme"  # type: ignore[union-attr]
    with pytest.raises(KeyConflictError):
        await store.add_key("globex", "sk-acme-dev")
    assert (await store.resolve("sk-acme-dev")).tenant_id == "acme"  # type: ignore[union-attr]
    with pytest.raises(UnknownTenantError):
        await store.add_key("initech", "sk-initech-dev")
    with pytest.raises(ValueError):
        await store.create(Tenant("Not A Valid Id", "x"))


async def test_rotation_and_revocation(store: TenantStore) -> None:
    old = await store.create(Tenant("acme", "Acme"))
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
    key = await store.create(Tenant("acme", "Acme"))
    await store.put_tenant(Tenant("acme", "Acme Corp", frozenset({"a", "b"})))
    assert await store.resolve(key) == Tenant("acme", "Acme Corp", frozenset({"a", "b"}))


FULL = Tenant(
    "acme",
    "Acme Corp",
    allowed_models=frozenset({"sluice-tiny", "sluice-small"}),
    weight=2.5,
    tokens_per_minute=120_000,
    max_concurrent_requests=8,
    allowed_classes=frozenset({RequestClass.BATCH}),
    safety_policy="strict",
)


async def test_every_field_round_trips_through_create_get_resolve_and_list(store: TenantStore) -> None:
    key = await store.create(FULL)
    assert await store.get("acme") == FULL
    assert await store.resolve(key) == FULL
    assert await store.list() == [FULL]
    got = await store.get("acme")
    assert type(got.weight) is float and all(type(c) is RequestClass for c in got.allowed_classes)
    with pytest.raises(UnknownTenantError):
        await store.get("initech")


async def test_put_tenant_upserts_every_field(store: TenantStore) -> None:
    key = await store.create(Tenant("acme", "Acme"))
    await store.put_tenant(FULL)
    assert await store.resolve(key) == FULL
    await store.put_tenant(Tenant("acme", "Acme"))  # back to the defaults: None means unlimited again
    assert await store.get("acme") == Tenant("acme", "Acme")
    await store.put_tenant(Tenant("globex", "Globex", weight=3))
    assert await store.get("globex") == Tenant("globex", "Globex", weight=3.0)
    assert await store.num_active_keys("globex") == 0


async def test_update_changes_only_the_fields_given(store: TenantStore) -> None:
    key = await store.create(FULL)
    updated = await store.update("acme", weight=4, tokens_per_minute=None, safety_policy="none")
    assert updated == dataclasses.replace(FULL, weight=4.0, tokens_per_minute=None, safety_policy="none")
    assert await store.get("acme") == updated == await store.resolve(key)
    # Iterables are taken for the set fields, class names for classes.
    updated = await store.update("acme", allowed_models=[], allowed_classes=["interactive", "batch"])
    assert updated.allowed_models == frozenset() and updated.allowed_classes == ALL_CLASSES
    assert await store.update("acme") == updated  # nothing given: nothing changes
    with pytest.raises(UnknownTenantError):
        await store.update("initech", weight=2)
    with pytest.raises(ValueError, match="cannot change tenant_id"):
        await store.update("acme", tenant_id="other")
    with pytest.raises(ValueError, match="cannot change colour"):
        await store.update("acme", colour="red")
    with pytest.raises(ValueError, match="weight"):
        await store.update("acme", name="Renamed", weight=0)
    assert await store.get("acme") == updated  # a refused update writes nothing, not even the valid part


async def test_concurrent_updates_of_different_fields_both_land(store: TenantStore) -> None:
    await store.create(FULL)
    await asyncio.gather(*(store.update("acme", weight=w) for w in (5, 6)), store.update("acme", name="X"))
    tenant = await store.get("acme")
    assert tenant.name == "X" and tenant.weight in (5.0, 6.0)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"weight": 0}, "weight must be > 0 and <= 1000"),
        ({"weight": -1.0}, "weight must be > 0"),
        ({"weight": 1000.5}, "<= 1000"),
        ({"weight": float("nan")}, "weight"),
        ({"weight": float("inf")}, "weight"),
        ({"tokens_per_minute": 0}, "tokens_per_minute must be a whole number >= 1"),
        ({"tokens_per_minute": 1.5}, "tokens_per_minute"),
        ({"tokens_per_minute": 2**63}, "tokens_per_minute"),
        ({"max_concurrent_requests": 0}, "max_concurrent_requests must be a whole number >= 1"),
        ({"max_concurrent_requests": True}, "max_concurrent_requests"),
        ({"allowed_classes": frozenset()}, "allowed_classes must not be empty"),
        ({"allowed_classes": frozenset({"realtime"})}, "unknown class"),
        ({"allowed_models": frozenset({""})}, "allowed_models"),
        ({"name": " "}, "name must be a non-empty string"),
        ({"safety_policy": ""}, "safety_policy must match"),
        ({"safety_policy": "Strict Policy"}, "safety_policy must match"),
    ],
)
async def test_invalid_tenants_are_refused_by_every_write(
    store: TenantStore, changes: dict[str, object], fragment: str
) -> None:
    bad = dataclasses.replace(Tenant("acme", "Acme"), **changes)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape(fragment)):
        await store.create(bad)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        await store.put_tenant(bad)
    assert await store.list() == []
    await store.create(Tenant("acme", "Acme"))
    with pytest.raises(ValueError, match=re.escape(fragment)):
        await store.update("acme", **changes)
    assert await store.get("acme") == Tenant("acme", "Acme")
    # The bounds themselves are allowed.
    edge = Tenant("edge", "Edge", weight=1000, tokens_per_minute=1, max_concurrent_requests=1)
    await store.create(edge)
    assert await store.get("edge") == edge


async def test_rotate_key_revokes_every_old_key_by_default(store: TenantStore) -> None:
    first = await store.create(Tenant("acme", "Acme"))
    second = await store.issue_key("acme")
    other = await store.create(Tenant("globex", "Globex"))
    assert await store.num_active_keys("acme") == 2
    new = await store.rotate_key("acme")
    assert re.fullmatch(r"sk-acme-[A-Za-z0-9_-]{32}", new) and new not in (first, second)
    assert await store.resolve(first) is None and await store.resolve(second) is None
    assert await store.resolve(new) == Tenant("acme", "Acme")
    assert await store.num_active_keys("acme") == 1
    assert await store.resolve(other) is not None  # another tenant's keys are untouched
    kept = await store.rotate_key("acme", revoke_old=False)
    assert await store.resolve(new) is not None and await store.resolve(kept) is not None
    assert await store.num_active_keys("acme") == 2
    with pytest.raises(UnknownTenantError):
        await store.rotate_key("initech")
    with pytest.raises(UnknownTenantError):
        await store.num_active_keys("initech")


async def test_seed_dev_tenants_keeps_an_operators_later_changes(store: TenantStore) -> None:
    await seed_dev_tenants(store)
    await store.update("acme", weight=5, max_concurrent_requests=2)
    new = await store.rotate_key("acme")
    await seed_dev_tenants(store)  # the next start
    assert await store.get("acme") == dataclasses.replace(
        dev_tenant("acme"), weight=5.0, max_concurrent_requests=2
    )
    assert await store.resolve(DEV_TENANT_KEYS["acme"]) is None
    assert await store.resolve(new) is not None
    assert await store.resolve(DEV_TENANT_KEYS["globex"]) == dev_tenant("globex")


async def _create_version_1_database(backend: Backend, tmp_path: Path, api_key: str) -> None:
    """The schema as migration 1 left it, with one tenant and one key, written around the store."""
    insert_tenant = "INSERT INTO tenants (tenant_id, name, allowed_models, created_at) VALUES ({})"
    insert_key = "INSERT INTO api_keys (key_sha256, key_prefix, tenant_id, created_at) VALUES ({})"
    tenant_row = ("old", "Old Co", '["sluice-tiny"]', "2026-01-01T00:00:00+00:00")
    key_row = (hash_key(api_key), key_prefix(api_key), "old", "2026-01-01T00:00:00+00:00")
    if backend.database_url is None:
        path = tmp_path / "sluice.db"  # the file sqlite_backend(tmp_path) uses
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            apply_sqlite_migrations(conn, COMPONENT, MIGRATIONS[:1])
            conn.execute(insert_tenant.format("?, ?, ?, ?"), tenant_row)
            conn.execute(insert_key.format("?, ?, ?, ?"), key_row)
        return
    pool = await open_pg_pool(backend.database_url, max_size=1, name="v1")
    try:
        await apply_pg_migrations(pool, COMPONENT, MIGRATIONS[:1])
        async with pool.connection() as conn:
            await conn.execute(insert_tenant.format("%s, %s, %s, %s"), tenant_row)
            await conn.execute(insert_key.format("%s, %s, %s, %s"), key_row)
    finally:
        await pool.close()


async def test_a_version_1_database_migrates_with_the_defaults(backend: Backend, tmp_path: Path) -> None:
    await _create_version_1_database(backend, tmp_path, "sk-old-fixed-key-0123456789")
    store = backend.make_tenant_store()
    await store.open()
    try:
        expected = Tenant("old", "Old Co", frozenset({"sluice-tiny"}))  # weight 1, unlimited, both classes
        assert expected.weight == 1.0 and expected.tokens_per_minute is None
        assert expected.allowed_classes == ALL_CLASSES and expected.safety_policy == "default"
        assert await store.resolve("sk-old-fixed-key-0123456789") == expected
        assert await store.list() == [expected]
        assert await store.update("old", tokens_per_minute=10) == dataclasses.replace(
            expected, tokens_per_minute=10
        )
    finally:
        await store.close()
    applied = [row for row in await backend.read_table("schema_migrations") if row[0] == "tenants"]
    assert sorted(row[1] for row in applied) == [1, 2, 3]


async def test_seed_dev_tenants_is_idempotent(store: TenantStore, backend: Backend) -> None:
    await seed_dev_tenants(store)
    await seed_dev_tenants(store)
    for tenant_id, key in DEV_TENANT_KEYS.items():
        assert (await store.resolve(key)) == dev_tenant(tenant_id)
        assert dev_tenant(tenant_id) == Tenant(
            tenant_id, tenant_id.capitalize(), tokens_per_minute=1_000_000, max_concurrent_requests=64
        )
    assert len(await backend.read_table("api_keys")) == 2


async def test_migrations_are_idempotent_and_safe_to_start_concurrently(backend: Backend) -> None:
    a, b = backend.make_tenant_store(), backend.make_tenant_store()
    await asyncio.gather(a.open(), b.open())
    try:
        key = await a.create(Tenant("acme", "Acme"))
        c = backend.make_tenant_store()
        await c.open()
        assert await c.resolve(key) is not None
        await c.close()
    finally:
        await a.close()
        await b.close()
    applied = [row for row in await backend.read_table("schema_migrations") if row[0] == "tenants"]
    assert sorted(row[1] for row in applied) == [1, 2, 3]


async def test_postgres_failures_raise_the_interfaces_error(pg_schema_url: str) -> None:
    """A connection cut under the store: ``TenantStoreUnavailable``, not a psycopg type."""
    info = conninfo_to_dict(pg_schema_url)
    proxy = TcpProxy(str(info.get("host") or "127.0.0.1"), int(str(info.get("port") or 5432)))
    port = await proxy.start()
    store = PostgresTenantStore(make_conninfo(pg_schema_url, host="127.0.0.1", port=port), pool_max_size=1)
    await store.open()
    try:
        key = await store.create(Tenant("acme", "Acme"))
        await proxy.cut()
        with pytest.raises(TenantStoreUnavailable, match="PostgreSQL"):
            await store.resolve(key)
    finally:
        await store.close()


async def test_sqlite_failures_raise_the_interfaces_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(TenantStoreUnavailable, match="SQLite"):
        await SqliteTenantStore(tmp_path / "a-file" / "tenants.db").open()  # its directory is a file
    locked = SqliteTenantStore(tmp_path / "tenants.db")
    await locked.open()
    try:
        await locked.create(Tenant("acme", "Acme"))

        async def refuse(tx: Tx) -> None:
            raise sqlite3.OperationalError("database is locked")  # what a writer past busy_timeout sees

        with pytest.raises(TenantStoreUnavailable, match="locked"):
            await locked._db.run(refuse)

        async def bug(tx: Tx) -> None:
            await tx.execute("SELECT * FROM no_such_table")

        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await locked._db.run(bug)  # our own mistake is not an outage
    finally:
        await locked.close()


def _unopenable_store(backend: Backend, tmp_path: Path) -> TenantStore:
    """A store whose database is there but cannot be opened as one: an SQLite file that is not a
    database; a PostgreSQL role whose ``search_path`` names no schema, so the migrations cannot create
    their tables."""
    if backend.database_url is None:
        path = tmp_path / "not-a-database.db"
        path.write_bytes(b"not an SQLite file " * 512)
        return SqliteTenantStore(path)
    url = make_conninfo(backend.database_url, options="-c search_path=no_such_schema")
    return PostgresTenantStore(url, pool_max_size=1)


async def test_a_store_that_cannot_be_opened_raises_the_interfaces_error(
    backend: Backend, tmp_path: Path
) -> None:
    """Not the driver's error: a caller (the CLI) catches ``TenantStoreUnavailable`` alone."""
    store = _unopenable_store(backend, tmp_path)
    where = "SQLite" if backend.database_url is None else "PostgreSQL"
    try:
        with pytest.raises(TenantStoreUnavailable, match=where) as caught:
            await store.open()
        assert caught.value.__cause__ is not None  # the driver's error, kept for the operator
    finally:
        await store.close()


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


async def test_cached_resolver_staleness_is_bounded_by_ttl(store: TenantStore) -> None:
    clock = FakeClock()
    resolver = CachedTenantResolver(store, ResolverLimits(ttl_s=5.0, unknown_ttl_s=5.0), clock=clock)
    key = await store.create(Tenant("acme", "Acme"))
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
    resolver = CachedTenantResolver(store, ResolverLimits(ttl_s=60.0, max_entries=3, max_unknown_entries=3))
    key = await store.create(Tenant("acme", "Acme"))
    for i in range(10):
        assert await resolver.resolve(f"sk-random-{i}") is None
    assert resolver.num_entries == 3
    assert await resolver.resolve(key) is not None
    assert resolver.num_entries == 4  # known keys are kept apart: random ones cannot evict them
    await store.revoke_key(key)
    resolver.invalidate(key)
    assert await resolver.resolve(key) is None
    uncached = CachedTenantResolver(store, ResolverLimits(ttl_s=0))
    await store.add_key("acme", key)
    assert await uncached.resolve(key) is not None
    await store.revoke_key(key)
    assert await uncached.resolve(key) is None  # ttl 0: every request asks the store


async def test_factories_pick_the_backend_from_settings_and_seed(backend: Backend, tmp_path: Path) -> None:
    settings = load_settings(
        state_dir=tmp_path / "state", database_url=backend.database_url, dev_tenants=True
    )
    store = await open_tenant_store(settings)
    ledger = await open_ledger(settings)
    try:
        expected = "Postgres" if backend.database_url else "Sqlite"
        assert type(store).__name__.startswith(expected) and type(ledger).__name__.startswith(expected)
        assert (await store.resolve("sk-globex-dev")) == dev_tenant("globex")
        assert (await ledger.query("acme")).rows == []
    finally:
        await store.close()
        await ledger.close()
    assert (backend.database_url is None) == settings.sqlite_path.exists()
