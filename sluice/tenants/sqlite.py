"""The embedded tenant store: tables in the same SQLite file as the ledger."""

from __future__ import annotations

import builtins
import hmac
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sluice.db import SqliteDb, apply_sqlite_migrations, transaction
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

_INSERT_TENANT = (
    f"INSERT INTO tenants ({select_columns()}, created_at)"
    f" VALUES ({', '.join('?' * (len(TENANT_COLUMNS) + 1))})"
)
_SET_TENANT = ", ".join(f"{c} = excluded.{c}" for c in TENANT_COLUMNS[1:])
_SELECT_TENANT = f"SELECT {select_columns()} FROM tenants"
T = TypeVar("T")


def _unavailable(exc: BaseException) -> TenantStoreUnavailable:
    return TenantStoreUnavailable(f"tenant store (SQLite) unavailable: {exc}")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _get(conn: sqlite3.Connection, tenant_id: str) -> Tenant:
    row = conn.execute(f"{_SELECT_TENANT} WHERE tenant_id = ?", (tenant_id,)).fetchone()
    if row is None:
        raise UnknownTenantError(tenant_id)
    return tenant_from_row(row)


def _require_tenant(conn: sqlite3.Connection, tenant_id: str) -> None:
    if conn.execute("SELECT 1 FROM tenants WHERE tenant_id = ?", (tenant_id,)).fetchone() is None:
        raise UnknownTenantError(tenant_id)


def _insert_key(conn: sqlite3.Connection, tenant_id: str, api_key: str) -> None:
    digest = hash_key(api_key)
    _require_tenant(conn, tenant_id)
    row = conn.execute("SELECT tenant_id FROM api_keys WHERE key_sha256 = ?", (digest,)).fetchone()
    if row is not None and row[0] != tenant_id:
        raise KeyConflictError(f"this key is registered to another tenant (not {tenant_id!r})")
    conn.execute(
        "INSERT INTO api_keys (key_sha256, key_prefix, tenant_id, created_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (key_sha256) DO UPDATE SET revoked_at = NULL",
        (digest, key_prefix(api_key), tenant_id, _now()),
    )


class SqliteTenantStore(TenantStore):
    def __init__(self, path: Path) -> None:
        self._db = SqliteDb(path)

    async def open(self) -> None:
        await self._db.open_or(_unavailable)
        await self._run(lambda conn: apply_sqlite_migrations(conn, COMPONENT, MIGRATIONS))

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` on the connection's thread; a file that cannot be used now raises
        ``TenantStoreUnavailable`` (the driver's types stay inside this backend)."""
        return await self._db.run_or(_unavailable, fn)

    async def close(self) -> None:
        await self._db.close()

    async def resolve(self, api_key: str) -> Tenant | None:
        digest = hash_key(api_key)

        def read(conn: sqlite3.Connection) -> Tenant | None:
            row = conn.execute(
                f"SELECT k.key_sha256, {select_columns('t')}"
                " FROM api_keys k JOIN tenants t USING (tenant_id)"
                " WHERE k.key_sha256 = ? AND k.revoked_at IS NULL",
                (digest,),
            ).fetchone()
            if row is None or not hmac.compare_digest(row[0], digest):
                return None
            return tenant_from_row(row[1:])

        return await self._run(read)

    async def get(self, tenant_id: str) -> Tenant:
        return await self._run(lambda conn: _get(conn, tenant_id))

    async def put_tenant(self, tenant: Tenant) -> None:
        check_tenant(tenant)
        params = (*tenant_row(tenant), _now())
        await self._run(
            lambda conn: conn.execute(
                f"{_INSERT_TENANT} ON CONFLICT (tenant_id) DO UPDATE SET {_SET_TENANT}", params
            )
        )

    async def create(self, tenant: Tenant) -> str:
        check_tenant(tenant)
        api_key = new_api_key(tenant.tenant_id)
        params = (*tenant_row(tenant), _now())

        def write(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(_INSERT_TENANT, params)
            except sqlite3.IntegrityError:
                raise TenantExistsError(tenant.tenant_id) from None
            _insert_key(conn, tenant.tenant_id, api_key)

        await self._run(lambda conn: transaction(conn, write))
        return api_key

    async def update(self, tenant_id: str, /, **changes: Any) -> Tenant:
        def write(conn: sqlite3.Connection) -> Tenant:
            tenant = apply_changes(_get(conn, tenant_id), changes)
            conn.execute(
                f"UPDATE tenants SET {', '.join(f'{c} = ?' for c in TENANT_COLUMNS[1:])} WHERE tenant_id = ?",
                (*tenant_row(tenant)[1:], tenant_id),
            )
            return tenant

        return await self._run(lambda conn: transaction(conn, write))

    async def rotate_key(self, tenant_id: str, revoke_old: bool = True) -> str:
        api_key = new_api_key(tenant_id)

        def write(conn: sqlite3.Connection) -> None:
            _require_tenant(conn, tenant_id)
            if revoke_old:
                conn.execute(
                    "UPDATE api_keys SET revoked_at = ? WHERE tenant_id = ? AND revoked_at IS NULL",
                    (_now(), tenant_id),
                )
            _insert_key(conn, tenant_id, api_key)

        await self._run(lambda conn: transaction(conn, write))
        return api_key

    async def num_active_keys(self, tenant_id: str) -> int:
        def read(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM api_keys k WHERE k.tenant_id = t.tenant_id"
                " AND k.revoked_at IS NULL) FROM tenants t WHERE t.tenant_id = ?",
                (tenant_id,),
            ).fetchone()
            if row is None:
                raise UnknownTenantError(tenant_id)
            return int(row[0])

        return await self._run(read)

    async def add_key(self, tenant_id: str, api_key: str) -> None:
        await self._run(lambda conn: transaction(conn, lambda c: _insert_key(c, tenant_id, api_key)))

    async def revoke_key(self, api_key: str) -> bool:
        digest = hash_key(api_key)
        cur = await self._run(
            lambda conn: conn.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE key_sha256 = ? AND revoked_at IS NULL",
                (_now(), digest),
            )
        )
        return cur.rowcount == 1

    async def list(self) -> builtins.list[Tenant]:
        rows = await self._run(lambda conn: conn.execute(f"{_SELECT_TENANT} ORDER BY tenant_id").fetchall())
        return [tenant_from_row(r) for r in rows]
