"""The admin token store's contract, run over every backend (SQLite and PostgreSQL); the role ordering;
the dev admin token; the opener (``sluice.stores.openers.open_admin_token_store``)."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from admin_backends import AdminBackend
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from tcp_proxy import TcpProxy

from sluice.domain import Tenant
from sluice.settings import load_settings
from sluice.stores.admin_tokens.base import (
    AdminPrincipal,
    AdminTokenExistsError,
    AdminTokenStore,
    AdminTokenStoreUnavailable,
    UnknownAdminTokenError,
    hash_token,
)
from sluice.stores.admin_tokens.dev import DEV_ADMIN_TOKEN, DEV_ADMIN_TOKEN_NAME, ensure_dev_admin_token
from sluice.stores.admin_tokens.roles import ROLES_BY_RANK, Role, parse_role, role_allows
from sluice.stores.admin_tokens.store import PostgresAdminTokenStore, SqliteAdminTokenStore
from sluice.stores.openers import open_admin_token_store, prepare_dev_admin_token
from sluice.stores.transactions import Tx

pytestmark = pytest.mark.anyio


@pytest.fixture
async def store(admin_backend: AdminBackend) -> AsyncIterator[AdminTokenStore]:
    store = admin_backend.make_store()
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def test_roles_are_ordered_viewer_release_manager_platform_admin() -> None:
    assert ROLES_BY_RANK == (Role.VIEWER, Role.RELEASE_MANAGER, Role.PLATFORM_ADMIN)
    allowed = {(held, needed) for held in Role for needed in Role if role_allows(held, needed)}
    assert allowed == {
        (Role.VIEWER, Role.VIEWER),
        (Role.RELEASE_MANAGER, Role.VIEWER),
        (Role.RELEASE_MANAGER, Role.RELEASE_MANAGER),
        (Role.PLATFORM_ADMIN, Role.VIEWER),
        (Role.PLATFORM_ADMIN, Role.RELEASE_MANAGER),
        (Role.PLATFORM_ADMIN, Role.PLATFORM_ADMIN),
    }
    assert parse_role("release-manager") is Role.RELEASE_MANAGER
    with pytest.raises(ValueError, match="unknown role 'admin'; valid roles: viewer, release-manager"):
        parse_role("admin")


async def test_create_returns_a_new_token_that_resolves_to_its_principal(store: AdminTokenStore) -> None:
    tokens = {role: await store.create(f"ops-{role}", role) for role in Role}
    for role, token in tokens.items():
        assert re.fullmatch(r"sladm-[A-Za-z0-9_-]{32}", token)
        assert await store.resolve(token) == AdminPrincipal(f"ops-{role}", role)
    assert len(set(tokens.values())) == len(Role)
    listed = await store.list()
    assert [(t.name, t.role, t.active) for t in listed] == [
        ("ops-platform-admin", Role.PLATFORM_ADMIN, True),
        ("ops-release-manager", Role.RELEASE_MANAGER, True),
        ("ops-viewer", Role.VIEWER, True),
    ]
    assert listed[2].token_prefix == tokens[Role.VIEWER][:12]
    assert await store.create("alice@example.com", "viewer") != ""  # a role given by name


async def test_wrong_tokens_resolve_to_none(store: AdminTokenStore) -> None:
    token = await store.create("alice", Role.PLATFORM_ADMIN)
    wrong = ["", "sladm-", token[:-1], token + "x", token.upper(), hash_token(token), token[:12], " " + token]
    for candidate in wrong:
        assert await store.resolve(candidate) is None, candidate


async def test_tokens_are_stored_hashed_never_raw(
    store: AdminTokenStore, admin_backend: AdminBackend
) -> None:
    token = await store.create("alice", Role.VIEWER)
    await store.create(DEV_ADMIN_TOKEN_NAME, Role.PLATFORM_ADMIN, token=DEV_ADMIN_TOKEN)
    cells = [str(cell) for row in await admin_backend.read_table("admin_tokens") for cell in row]
    for raw in [token, DEV_ADMIN_TOKEN]:
        assert not any(raw in cell for cell in cells), "a raw token is stored"
        assert hash_token(raw) in cells
    assert token[:12] in cells


async def test_a_name_is_unique_among_active_tokens_and_free_again_once_revoked(
    store: AdminTokenStore,
) -> None:
    first = await store.create("alice", Role.VIEWER)
    with pytest.raises(AdminTokenExistsError, match="alice"):
        await store.create("alice", Role.PLATFORM_ADMIN)
    assert await store.resolve(first) == AdminPrincipal("alice", Role.VIEWER)  # the first is untouched
    revoked = await store.revoke("alice")
    assert (revoked.name, revoked.role, revoked.active) == ("alice", Role.VIEWER, False)
    second = await store.create("alice", Role.RELEASE_MANAGER)
    assert await store.resolve(first) is None
    assert await store.resolve(second) == AdminPrincipal("alice", Role.RELEASE_MANAGER)
    listed = [(t.name, t.role, t.active) for t in await store.list()]
    assert listed == [("alice", Role.VIEWER, False), ("alice", Role.RELEASE_MANAGER, True)]


async def test_revoke_stops_the_token_at_once_and_only_an_active_one_can_be_revoked(
    store: AdminTokenStore,
) -> None:
    token = await store.create("bob", Role.PLATFORM_ADMIN)
    other = await store.create("carol", Role.PLATFORM_ADMIN)
    before = datetime.now(UTC) - timedelta(seconds=5)
    revoked = await store.revoke("bob")
    assert revoked.revoked_at is not None and revoked.revoked_at > before
    assert await store.resolve(token) is None
    assert await store.resolve(other) == AdminPrincipal("carol", Role.PLATFORM_ADMIN)
    for name in ["bob", "nobody"]:
        with pytest.raises(UnknownAdminTokenError):
            await store.revoke(name)


async def test_a_given_token_is_registered_once(store: AdminTokenStore) -> None:
    await store.create("dev-a", Role.VIEWER, token=DEV_ADMIN_TOKEN)
    with pytest.raises(AdminTokenExistsError, match="registered already"):
        await store.create("dev-b", Role.VIEWER, token=DEV_ADMIN_TOKEN)
    await store.revoke("dev-a")
    with pytest.raises(AdminTokenExistsError, match="registered already"):
        await store.create("dev-a", Role.VIEWER, token=DEV_ADMIN_TOKEN)  # a revoked token never returns
    assert await store.resolve(DEV_ADMIN_TOKEN) is None


async def test_times_are_recorded_and_last_use_only_when_asked(store: AdminTokenStore) -> None:
    before = datetime.now(UTC) - timedelta(seconds=5)
    token = await store.create("alice", Role.VIEWER)
    (listed,) = await store.list()
    assert before < listed.created_at < datetime.now(UTC) + timedelta(seconds=5)
    assert listed.last_used_at is None and listed.revoked_at is None
    assert await store.resolve(token, record_use=False) is not None
    assert (await store.list())[0].last_used_at is None
    assert await store.resolve(token) is not None
    (used,) = await store.list()
    assert used.last_used_at is not None and used.last_used_at >= listed.created_at
    assert used.last_used_at.tzinfo is not None and used.created_at.tzinfo is not None


@pytest.mark.parametrize(
    ("name", "role", "token", "fragment"),
    [
        ("Alice", "viewer", None, "token name"),
        ("", "viewer", None, "token name"),
        ("a" * 64, "viewer", None, "token name"),
        ("alice", "admin", None, "unknown role 'admin'"),
        ("alice", "viewer", "sk-acme-dev", "sladm-"),
        ("alice", "viewer", "sladm-short", "sladm-"),
        ("alice", "viewer", "sladm-" + "x" * 20 + " ", "sladm-"),
    ],
)
async def test_bad_names_roles_and_tokens_are_refused_and_nothing_is_written(
    store: AdminTokenStore, name: str, role: str, token: str | None, fragment: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        await store.create(name, role, token=token)
    assert await store.list() == []


async def test_tenant_keys_and_admin_tokens_never_stand_in_for_each_other(
    admin_backend: AdminBackend,
) -> None:
    """One database, two tables, two lookups: neither credential resolves in the other store, even a
    string registered in both."""
    admin_store, tenant_store = admin_backend.make_store(), admin_backend.make_tenant_store()
    await admin_store.open()
    await tenant_store.open()
    try:
        api_key = await tenant_store.create(Tenant("acme", "Acme"))
        admin_token = await admin_store.create("alice", Role.PLATFORM_ADMIN)
        assert await admin_store.resolve(api_key) is None
        assert await tenant_store.resolve(admin_token) is None
        # A tenant key that has the admin format (registered by hand) still is no admin token.
        await tenant_store.add_key("acme", "sladm-tenant-key-not-an-admin-token")
        assert await tenant_store.resolve("sladm-tenant-key-not-an-admin-token") is not None
        assert await admin_store.resolve("sladm-tenant-key-not-an-admin-token") is None
        assert await admin_store.resolve(admin_token) == AdminPrincipal("alice", Role.PLATFORM_ADMIN)
    finally:
        await admin_store.close()
        await tenant_store.close()


async def test_concurrent_creates_of_one_name_leave_exactly_one_token(admin_backend: AdminBackend) -> None:
    stores = [admin_backend.make_store() for _ in range(3)]
    for s in stores:
        await s.open()  # concurrent opens are covered by the migrations' own tests; sequential here
    try:
        results = await asyncio.gather(
            *(s.create("alice", Role.VIEWER) for s in stores for _ in range(2)), return_exceptions=True
        )
        tokens = [r for r in results if isinstance(r, str)]
        assert len(tokens) == 1, results
        assert all(isinstance(r, AdminTokenExistsError) for r in results if not isinstance(r, str))
        assert [t.name for t in await stores[0].list()] == ["alice"]
    finally:
        for s in stores:
            await s.close()


async def test_the_dev_token_is_seeded_once_and_an_operators_revoke_survives(store: AdminTokenStore) -> None:
    assert await ensure_dev_admin_token(store) == DEV_ADMIN_TOKEN
    assert await ensure_dev_admin_token(store) == DEV_ADMIN_TOKEN  # idempotent
    assert await store.resolve(DEV_ADMIN_TOKEN) == AdminPrincipal(DEV_ADMIN_TOKEN_NAME, Role.PLATFORM_ADMIN)
    assert [t.name for t in await store.list()] == [DEV_ADMIN_TOKEN_NAME]
    await store.revoke(DEV_ADMIN_TOKEN_NAME)
    assert await ensure_dev_admin_token(store) is None
    assert await store.resolve(DEV_ADMIN_TOKEN) is None
    assert len(await store.list()) == 1


async def test_seeding_does_not_count_as_a_use(store: AdminTokenStore) -> None:
    await ensure_dev_admin_token(store)
    await ensure_dev_admin_token(store)
    assert (await store.list())[0].last_used_at is None


async def test_migrations_share_the_schema_table_and_are_idempotent(admin_backend: AdminBackend) -> None:
    a, b, tenants = admin_backend.make_store(), admin_backend.make_store(), admin_backend.make_tenant_store()
    await asyncio.gather(a.open(), b.open(), tenants.open())
    try:
        await a.create("alice", Role.VIEWER)
        c = admin_backend.make_store()
        await c.open()  # nothing left to apply
        assert [t.name for t in await c.list()] == ["alice"]
        await c.close()
    finally:
        await a.close()
        await b.close()
        await tenants.close()
    rows = await admin_backend.read_table("schema_migrations")
    assert sorted(row[1] for row in rows if row[0] == "admin_tokens") == [1]
    assert sorted(row[1] for row in rows if row[0] == "tenants") == [1, 2, 3]


async def test_postgres_failures_raise_the_interfaces_error(pg_schema_url: str) -> None:
    """A connection cut under the store: ``AdminTokenStoreUnavailable``, not a psycopg type."""
    info = conninfo_to_dict(pg_schema_url)
    proxy = TcpProxy(str(info.get("host") or "127.0.0.1"), int(str(info.get("port") or 5432)))
    port = await proxy.start()
    url = make_conninfo(pg_schema_url, host="127.0.0.1", port=port)
    store = PostgresAdminTokenStore(url, pool_max_size=1, acquire_timeout_s=0.5)
    await store.open()
    try:
        token = await store.create("alice", Role.VIEWER)
        await store.ping()
        await proxy.cut()
        for call in [store.resolve(token), store.ping(), store.list()]:
            with pytest.raises(AdminTokenStoreUnavailable, match="PostgreSQL"):
                await call
    finally:
        await store.close()


async def test_sqlite_failures_raise_the_interfaces_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(AdminTokenStoreUnavailable, match="SQLite"):
        await SqliteAdminTokenStore(tmp_path / "a-file" / "sluice.db").open()  # its directory is a file
    store = SqliteAdminTokenStore(tmp_path / "sluice.db")
    await store.open()
    try:

        async def refuse(tx: Tx) -> None:
            raise sqlite3.OperationalError("database is locked")  # what a writer past busy_timeout sees

        with pytest.raises(AdminTokenStoreUnavailable, match="locked"):
            await store._db.run(refuse)

        async def bug(tx: Tx) -> None:
            await tx.execute("SELECT * FROM no_such_table")

        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await store._db.run(bug)  # our own mistake is not an outage
    finally:
        await store.close()


@pytest.mark.parametrize("dev_tenants", [True, False])
async def test_the_opener_picks_the_backend_from_settings_and_seeds_only_in_dev(
    admin_backend: AdminBackend, tmp_path: Path, dev_tenants: bool
) -> None:
    settings = load_settings(
        state_dir=tmp_path / "state", database_url=admin_backend.database_url, dev_tenants=dev_tenants
    )
    store = await open_admin_token_store(settings)
    try:
        expected = "Postgres" if admin_backend.database_url else "Sqlite"
        assert type(store).__name__.startswith(expected)
        seeded = await store.resolve(DEV_ADMIN_TOKEN) is not None
        assert seeded is dev_tenants
    finally:
        await store.close()
    assert (admin_backend.database_url is None) == settings.sqlite_path.exists()


def test_prepare_dev_admin_token_is_what_the_dev_stack_prints(tmp_path: Path) -> None:
    """Sync, outside an event loop, as ``gateway.devstack`` would call it before starting the services."""
    dev = load_settings(state_dir=tmp_path / "state", dev_tenants=True)
    assert prepare_dev_admin_token(dev) == DEV_ADMIN_TOKEN
    assert prepare_dev_admin_token(dev) == DEV_ADMIN_TOKEN
    assert prepare_dev_admin_token(load_settings(state_dir=tmp_path / "other", dev_tenants=False)) is None
    assert not (tmp_path / "other").exists()  # off: not even opened

    async def revoke() -> None:
        store = SqliteAdminTokenStore(dev.sqlite_path)
        await store.open()
        await store.revoke(DEV_ADMIN_TOKEN_NAME)
        await store.close()

    asyncio.run(revoke())
    assert prepare_dev_admin_token(dev) is None
