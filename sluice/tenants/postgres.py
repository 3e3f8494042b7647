"""The production tenant store: PostgreSQL through a psycopg async connection pool."""

from __future__ import annotations

import builtins
import hmac
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from sluice.db import MigratedPgPool
from sluice.domain import Tenant
from sluice.tenants.base import (
    KeyConflictError,
    TenantExistsError,
    TenantStore,
    TenantStoreUnavailable,
    UnknownTenantError,
    apply_changes,
    check_tenant,
    hash_key,
    key_prefix,
    new_api_key,
)
from sluice.tenants.migrations import (
    COMPONENT,
    MIGRATIONS,
    TENANT_COLUMNS,
    select_columns,
    tenant_from_row,
    tenant_row,
)

# NOTE: built once from constant column names (never from input), so still literal SQL.
_INSERT_TENANT = (
    f"INSERT INTO tenants ({select_columns()}, created_at)"
    f" VALUES ({', '.join(['%s'] * len(TENANT_COLUMNS))}, now())"
)
_SET_TENANT = ", ".join(f"{c} = excluded.{c}" for c in TENANT_COLUMNS[1:])
_UPDATE_TENANT = (
    f"UPDATE tenants SET {', '.join(f'{c} = %s' for c in TENANT_COLUMNS[1:])} WHERE tenant_id = %s"
)
_SELECT_TENANT = f"SELECT {select_columns()} FROM tenants"


async def _require_tenant(conn: psycopg.AsyncConnection, tenant_id: str) -> None:
    """Inside the caller's transaction: the row is share-locked until it ends."""
    cur = await conn.execute("SELECT 1 FROM tenants WHERE tenant_id = %s FOR SHARE", (tenant_id,))
    if await cur.fetchone() is None:
        raise UnknownTenantError(tenant_id)


async def _insert_key(conn: psycopg.AsyncConnection, tenant_id: str, api_key: str) -> None:
    """Inside the caller's transaction."""
    digest = hash_key(api_key)
    await _require_tenant(conn, tenant_id)
    cur = await conn.execute(
        "INSERT INTO api_keys (key_sha256, key_prefix, tenant_id, created_at) VALUES (%s, %s, %s, now())"
        " ON CONFLICT (key_sha256) DO UPDATE SET revoked_at = NULL"
        " WHERE api_keys.tenant_id = excluded.tenant_id",
        (digest, key_prefix(api_key), tenant_id),
    )
    if cur.rowcount == 0:  # the conflict's WHERE failed: another tenant holds this key
        raise KeyConflictError(f"this key is registered to another tenant (not {tenant_id!r})")


def _unavailable(exc: BaseException) -> TenantStoreUnavailable:
    return TenantStoreUnavailable(f"tenant store (PostgreSQL) unavailable: {exc}")


class PostgresTenantStore(TenantStore):
    def __init__(self, url: str, *, pool_max_size: int = 5) -> None:
        self._db = MigratedPgPool(
            url, max_size=pool_max_size, name="tenants", component=COMPONENT, migrations=MIGRATIONS
        )

    @property
    def pool(self) -> AsyncConnectionPool:
        return self._db.pool

    async def open(
        self, *, keep_trying: bool = False, after_open: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """``keep_trying``: a server's start, see ``MigratedPgPool``; ``after_open`` runs once it is open."""
        await self._db.open_or(_unavailable, keep_trying=keep_trying, after_open=after_open)

    def _connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection]:
        """A pooled connection; the server or network failing, here or in the caller's block, raises
        ``TenantStoreUnavailable`` (the driver's types stay inside this backend)."""
        return self._db.connection_or(_unavailable)

    async def close(self) -> None:
        await self._db.close()

    async def resolve(self, api_key: str) -> Tenant | None:
        digest = hash_key(api_key)
        async with self._connection() as conn:
            cur = await conn.execute(
                f"SELECT k.key_sha256, {select_columns('t')}"
                " FROM api_keys k JOIN tenants t USING (tenant_id)"
                " WHERE k.key_sha256 = %s AND k.revoked_at IS NULL",
                (digest,),
            )
            row = await cur.fetchone()
        if row is None or not hmac.compare_digest(row[0], digest):
            return None
        return tenant_from_row(row[1:])

    async def get(self, tenant_id: str) -> Tenant:
        async with self._connection() as conn:
            cur = await conn.execute(f"{_SELECT_TENANT} WHERE tenant_id = %s", (tenant_id,))
            row = await cur.fetchone()
        if row is None:
            raise UnknownTenantError(tenant_id)
        return tenant_from_row(row)

    async def put_tenant(self, tenant: Tenant) -> None:
        check_tenant(tenant)
        async with self._connection() as conn:
            await conn.execute(
                f"{_INSERT_TENANT} ON CONFLICT (tenant_id) DO UPDATE SET {_SET_TENANT}", tenant_row(tenant)
            )

    async def create(self, tenant: Tenant) -> str:
        check_tenant(tenant)
        api_key = new_api_key(tenant.tenant_id)
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(
                f"{_INSERT_TENANT} ON CONFLICT (tenant_id) DO NOTHING", tenant_row(tenant)
            )
            if cur.rowcount == 0:
                raise TenantExistsError(tenant.tenant_id)
            await _insert_key(conn, tenant.tenant_id, api_key)
        return api_key

    async def update(self, tenant_id: str, /, **changes: Any) -> Tenant:
        async with self._connection() as conn, conn.transaction():
            # FOR UPDATE: two concurrent updates of different fields both land.
            cur = await conn.execute(f"{_SELECT_TENANT} WHERE tenant_id = %s FOR UPDATE", (tenant_id,))
            row = await cur.fetchone()
            if row is None:
                raise UnknownTenantError(tenant_id)
            tenant = apply_changes(tenant_from_row(row), changes)
            await conn.execute(_UPDATE_TENANT, (*tenant_row(tenant)[1:], tenant_id))
        return tenant

    async def rotate_key(self, tenant_id: str, revoke_old: bool = True) -> str:
        api_key = new_api_key(tenant_id)
        async with self._connection() as conn, conn.transaction():
            await _require_tenant(conn, tenant_id)
            if revoke_old:
                await conn.execute(
                    "UPDATE api_keys SET revoked_at = now() WHERE tenant_id = %s AND revoked_at IS NULL",
                    (tenant_id,),
                )
            await _insert_key(conn, tenant_id, api_key)
        return api_key

    async def num_active_keys(self, tenant_id: str) -> int:
        async with self._connection() as conn:
            cur = await conn.execute(
                "SELECT (SELECT count(*) FROM api_keys k WHERE k.tenant_id = t.tenant_id"
                " AND k.revoked_at IS NULL) FROM tenants t WHERE t.tenant_id = %s",
                (tenant_id,),
            )
            row = await cur.fetchone()
        if row is None:
            raise UnknownTenantError(tenant_id)
        return int(row[0])

    async def add_key(self, tenant_id: str, api_key: str) -> None:
        async with self._connection() as conn, conn.transaction():
            await _insert_key(conn, tenant_id, api_key)

    async def revoke_key(self, api_key: str) -> bool:
        async with self._connection() as conn:
            cur = await conn.execute(
                "UPDATE api_keys SET revoked_at = now() WHERE key_sha256 = %s AND revoked_at IS NULL",
                (hash_key(api_key),),
            )
            return cur.rowcount == 1

    async def list(self) -> builtins.list[Tenant]:
        async with self._connection() as conn:
            cur = await conn.execute(f"{_SELECT_TENANT} ORDER BY tenant_id")
            rows = await cur.fetchall()
        return [tenant_from_row(r) for r in rows]
