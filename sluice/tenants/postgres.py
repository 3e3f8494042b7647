"""The production tenant store: PostgreSQL through a psycopg async connection pool."""

from __future__ import annotations

import builtins
import hmac
import json
from collections.abc import Iterable

import psycopg
from psycopg_pool import AsyncConnectionPool

from sluice.db import MigratedPgPool
from sluice.domain import Tenant
from sluice.tenants.base import (
    KeyConflictError,
    TenantExistsError,
    TenantStore,
    UnknownTenantError,
    check_tenant_id,
    hash_key,
    key_prefix,
    new_api_key,
)
from sluice.tenants.migrations import COMPONENT, MIGRATIONS


def _tenant(tenant_id: str, name: str, models_json: str) -> Tenant:
    return Tenant(tenant_id=tenant_id, name=name, allowed_models=frozenset(json.loads(models_json)))


async def _insert_key(conn: psycopg.AsyncConnection, tenant_id: str, api_key: str) -> None:
    """Inside the caller's transaction."""
    digest = hash_key(api_key)
    cur = await conn.execute("SELECT 1 FROM tenants WHERE tenant_id = %s FOR SHARE", (tenant_id,))
    if await cur.fetchone() is None:
        raise UnknownTenantError(tenant_id)
    cur = await conn.execute(
        "INSERT INTO api_keys (key_sha256, key_prefix, tenant_id, created_at) VALUES (%s, %s, %s, now())"
        " ON CONFLICT (key_sha256) DO UPDATE SET revoked_at = NULL"
        " WHERE api_keys.tenant_id = excluded.tenant_id",
        (digest, key_prefix(api_key), tenant_id),
    )
    if cur.rowcount == 0:  # the conflict's WHERE failed: another tenant holds this key
        raise KeyConflictError(f"this key is registered to another tenant (not {tenant_id!r})")


class PostgresTenantStore(TenantStore):
    def __init__(self, url: str, *, pool_max_size: int = 5) -> None:
        self._db = MigratedPgPool(
            url, max_size=pool_max_size, name="tenants", component=COMPONENT, migrations=MIGRATIONS
        )

    @property
    def pool(self) -> AsyncConnectionPool:
        return self._db.pool

    async def open(self) -> None:
        await self._db.open()

    async def close(self) -> None:
        await self._db.close()

    async def resolve(self, api_key: str) -> Tenant | None:
        digest = hash_key(api_key)
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT k.key_sha256, t.tenant_id, t.name, t.allowed_models"
                " FROM api_keys k JOIN tenants t USING (tenant_id)"
                " WHERE k.key_sha256 = %s AND k.revoked_at IS NULL",
                (digest,),
            )
            row = await cur.fetchone()
        if row is None or not hmac.compare_digest(row[0], digest):
            return None
        return _tenant(row[1], row[2], row[3])

    async def put_tenant(self, tenant: Tenant) -> None:
        check_tenant_id(tenant.tenant_id)
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO tenants (tenant_id, name, allowed_models, created_at) VALUES (%s, %s, %s, now())"
                " ON CONFLICT (tenant_id) DO UPDATE SET name = excluded.name,"
                " allowed_models = excluded.allowed_models",
                (tenant.tenant_id, tenant.name, json.dumps(sorted(tenant.allowed_models))),
            )

    async def create(self, tenant_id: str, name: str, allowed_models: Iterable[str] = ()) -> str:
        check_tenant_id(tenant_id)
        api_key = new_api_key(tenant_id)
        models = json.dumps(sorted(set(allowed_models)))
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "INSERT INTO tenants (tenant_id, name, allowed_models, created_at) VALUES (%s, %s, %s, now())"
                " ON CONFLICT (tenant_id) DO NOTHING",
                (tenant_id, name, models),
            )
            if cur.rowcount == 0:
                raise TenantExistsError(tenant_id)
            await _insert_key(conn, tenant_id, api_key)
        return api_key

    async def issue_key(self, tenant_id: str) -> str:
        api_key = new_api_key(tenant_id)
        await self.add_key(tenant_id, api_key)
        return api_key

    async def add_key(self, tenant_id: str, api_key: str) -> None:
        async with self.pool.connection() as conn, conn.transaction():
            await _insert_key(conn, tenant_id, api_key)

    async def revoke_key(self, api_key: str) -> bool:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE api_keys SET revoked_at = now() WHERE key_sha256 = %s AND revoked_at IS NULL",
                (hash_key(api_key),),
            )
            return cur.rowcount == 1

    async def list(self) -> builtins.list[Tenant]:
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT tenant_id, name, allowed_models FROM tenants ORDER BY tenant_id")
            rows = await cur.fetchall()
        return [_tenant(*r) for r in rows]
