"""The tenant store's one body, on SQLite (tables in the same file as the ledger) or PostgreSQL (production,
a psycopg pool); ``sluice.stores.transactions`` runs it on either."""

from __future__ import annotations

import builtins
import hmac
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sluice.domain import Tenant
from sluice.stores.tenants.base import (
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
from sluice.stores.tenants.migrations import (
    COMPONENT,
    MIGRATIONS,
    TENANT_COLUMNS,
    select_columns,
    tenant_from_row,
    tenant_row,
)
from sluice.stores.transactions import SqlRunner, StoreSchema, Tx

_INSERT_TENANT = (
    f"INSERT INTO tenants ({select_columns()}, created_at)"
    f" VALUES ({', '.join('?' * (len(TENANT_COLUMNS) + 1))})"
)
_SET_TENANT = ", ".join(f"{c} = excluded.{c}" for c in TENANT_COLUMNS[1:])
_UPDATE_TENANT = f"UPDATE tenants SET {', '.join(f'{c} = ?' for c in TENANT_COLUMNS[1:])} WHERE tenant_id = ?"
_SELECT_TENANT = f"SELECT {select_columns()} FROM tenants"


def _now(tx: Tx) -> object:
    """A write's one time, as the database stores it: this process's clock on both databases (nothing
    compares it with the server's)."""
    return tx.codecs.to_db_time(datetime.now(UTC))


def _row_lock(tx: Tx, clause: str) -> str:
    """PostgreSQL's row lock (``FOR SHARE`` / ``FOR UPDATE``), held until the write ends; none on SQLite,
    where ``BEGIN IMMEDIATE`` already keeps every other writer out."""
    return f" {clause}" if tx.dialect == "postgresql" else ""


async def _require_tenant(tx: Tx, tenant_id: str) -> None:
    """Inside the caller's write: the tenant stays until it ends."""
    sql = f"SELECT 1 FROM tenants WHERE tenant_id = ?{_row_lock(tx, 'FOR SHARE')}"
    if await tx.fetchone(sql, (tenant_id,)) is None:
        raise UnknownTenantError(tenant_id)


async def _insert_key(tx: Tx, tenant_id: str, api_key: str, created_at: object) -> None:
    """Inside the caller's write."""
    await _require_tenant(tx, tenant_id)
    changed = await tx.execute(
        "INSERT INTO api_keys (key_sha256, key_prefix, tenant_id, created_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (key_sha256) DO UPDATE SET revoked_at = NULL"
        " WHERE api_keys.tenant_id = excluded.tenant_id",
        (hash_key(api_key), key_prefix(api_key), tenant_id, created_at),
    )
    if changed == 0:  # the conflict's WHERE failed: another tenant holds this key
        raise KeyConflictError(f"this key is registered to another tenant (not {tenant_id!r})")


class SqlTenantStore(TenantStore):
    """Reads go through ``read``, not ``run``, although each is one statement: a read its caller abandons
    (the cached resolver's lookup timeout) must give its connection back, where ``run`` would hold it to
    the end and ``close`` would wait for it."""

    def __init__(self, runner: SqlRunner) -> None:
        self._db = runner

    async def open(
        self, *, keep_trying: bool = False, after_open: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """``keep_trying``: a server's start (PostgreSQL only, see ``sluice.stores.db.MigratedPgPool``);
        ``after_open`` (the dev tenants' seeding) runs once it is open."""
        await self._db.open(keep_trying=keep_trying, after_open=after_open)

    async def close(self) -> None:
        await self._db.close()

    async def resolve(self, api_key: str) -> Tenant | None:
        digest = hash_key(api_key)

        async def read(tx: Tx) -> Tenant | None:
            row = await tx.fetchone(
                f"SELECT k.key_sha256, {select_columns('t')}"
                " FROM api_keys k JOIN tenants t USING (tenant_id)"
                " WHERE k.key_sha256 = ? AND k.revoked_at IS NULL",
                (digest,),
            )
            if row is None or not hmac.compare_digest(row[0], digest):
                return None
            return tenant_from_row(row[1:])

        return await self._db.read(read)

    async def get(self, tenant_id: str) -> Tenant:
        async def read(tx: Tx) -> Tenant:
            row = await tx.fetchone(f"{_SELECT_TENANT} WHERE tenant_id = ?", (tenant_id,))
            if row is None:
                raise UnknownTenantError(tenant_id)
            return tenant_from_row(row)

        return await self._db.read(read)

    async def put_tenant(self, tenant: Tenant) -> None:
        check_tenant(tenant)

        async def upsert(tx: Tx) -> None:
            await tx.execute(
                f"{_INSERT_TENANT} ON CONFLICT (tenant_id) DO UPDATE SET {_SET_TENANT}",
                (*tenant_row(tenant), _now(tx)),
            )

        await self._db.write_one(upsert)  # one statement: atomic by itself

    async def create(self, tenant: Tenant) -> str:
        check_tenant(tenant)
        api_key = new_api_key(tenant.tenant_id)

        async def write(tx: Tx) -> None:
            at = _now(tx)
            inserted = await tx.execute(
                f"{_INSERT_TENANT} ON CONFLICT (tenant_id) DO NOTHING", (*tenant_row(tenant), at)
            )
            if inserted == 0:
                raise TenantExistsError(tenant.tenant_id)
            await _insert_key(tx, tenant.tenant_id, api_key, at)

        await self._db.write(write)
        return api_key

    async def update(self, tenant_id: str, /, **changes: Any) -> Tenant:
        async def write(tx: Tx) -> Tenant:
            # Locked (PostgreSQL: FOR UPDATE) from the read on: two concurrent updates of different fields
            # both land.
            row = await tx.fetchone(
                f"{_SELECT_TENANT} WHERE tenant_id = ?{_row_lock(tx, 'FOR UPDATE')}", (tenant_id,)
            )
            if row is None:
                raise UnknownTenantError(tenant_id)
            tenant = apply_changes(tenant_from_row(row), changes)
            await tx.execute(_UPDATE_TENANT, (*tenant_row(tenant)[1:], tenant_id))
            return tenant

        return await self._db.write(write)

    async def rotate_key(self, tenant_id: str, revoke_old: bool = True) -> str:
        api_key = new_api_key(tenant_id)

        async def write(tx: Tx) -> None:
            at = _now(tx)
            await _require_tenant(tx, tenant_id)
            if revoke_old:
                await tx.execute(
                    "UPDATE api_keys SET revoked_at = ? WHERE tenant_id = ? AND revoked_at IS NULL",
                    (at, tenant_id),
                )
            await _insert_key(tx, tenant_id, api_key, at)

        await self._db.write(write)
        return api_key

    async def num_active_keys(self, tenant_id: str) -> int:
        async def read(tx: Tx) -> int:
            row = await tx.fetchone(
                "SELECT (SELECT count(*) FROM api_keys k WHERE k.tenant_id = t.tenant_id"
                " AND k.revoked_at IS NULL) FROM tenants t WHERE t.tenant_id = ?",
                (tenant_id,),
            )
            if row is None:
                raise UnknownTenantError(tenant_id)
            return int(row[0])

        return await self._db.read(read)

    async def add_key(self, tenant_id: str, api_key: str) -> None:
        async def write(tx: Tx) -> None:
            await _insert_key(tx, tenant_id, api_key, _now(tx))

        await self._db.write(write)

    async def revoke_key(self, api_key: str) -> bool:
        digest = hash_key(api_key)

        async def revoke(tx: Tx) -> bool:
            revoked = await tx.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE key_sha256 = ? AND revoked_at IS NULL",
                (_now(tx), digest),
            )
            return revoked == 1

        return await self._db.write_one(revoke)  # one statement: atomic by itself

    async def list(self) -> builtins.list[Tenant]:
        async def read(tx: Tx) -> builtins.list[Tenant]:
            return [tenant_from_row(r) for r in await tx.fetchall(f"{_SELECT_TENANT} ORDER BY tenant_id")]

        return await self._db.read(read)


_SCHEMA = StoreSchema("tenant store", "tenants", COMPONENT, MIGRATIONS, TenantStoreUnavailable)


class SqliteTenantStore(SqlTenantStore):
    """The embedded tenant store: tables in the same SQLite file as the ledger."""

    def __init__(self, path: Path, *, report_outages: bool = True) -> None:
        super().__init__(_SCHEMA.sqlite(path, report_outages=report_outages))


class PostgresTenantStore(SqlTenantStore):
    """The production tenant store: PostgreSQL through a psycopg async connection pool."""

    def __init__(self, url: str, *, pool_max_size: int = 5, report_outages: bool = True) -> None:
        super().__init__(
            _SCHEMA.postgres(
                url, pool_max_size=pool_max_size, acquire_timeout_s=30.0, report_outages=report_outages
            )
        )
