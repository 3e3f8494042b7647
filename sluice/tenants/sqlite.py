"""The embedded tenant store: tables in the same SQLite file as the ledger."""

from __future__ import annotations

import builtins
import hmac
import json
import sqlite3
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from sluice.db import SqliteDb, apply_sqlite_migrations, transaction
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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _tenant(tenant_id: str, name: str, models_json: str) -> Tenant:
    return Tenant(tenant_id=tenant_id, name=name, allowed_models=frozenset(json.loads(models_json)))


def _insert_key(conn: sqlite3.Connection, tenant_id: str, api_key: str) -> None:
    digest = hash_key(api_key)
    if conn.execute("SELECT 1 FROM tenants WHERE tenant_id = ?", (tenant_id,)).fetchone() is None:
        raise UnknownTenantError(tenant_id)
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
        await self._db.open()
        await self._db.run(lambda conn: apply_sqlite_migrations(conn, COMPONENT, MIGRATIONS))

    async def close(self) -> None:
        await self._db.close()

    async def resolve(self, api_key: str) -> Tenant | None:
        digest = hash_key(api_key)

        def read(conn: sqlite3.Connection) -> Tenant | None:
            row = conn.execute(
                "SELECT k.key_sha256, t.tenant_id, t.name, t.allowed_models"
                " FROM api_keys k JOIN tenants t USING (tenant_id)"
                " WHERE k.key_sha256 = ? AND k.revoked_at IS NULL",
                (digest,),
            ).fetchone()
            if row is None or not hmac.compare_digest(row[0], digest):
                return None
            return _tenant(row[1], row[2], row[3])

        return await self._db.run(read)

    async def put_tenant(self, tenant: Tenant) -> None:
        check_tenant_id(tenant.tenant_id)
        params = (tenant.tenant_id, tenant.name, json.dumps(sorted(tenant.allowed_models)), _now())
        await self._db.run(
            lambda conn: conn.execute(
                "INSERT INTO tenants (tenant_id, name, allowed_models, created_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (tenant_id) DO UPDATE SET name = excluded.name,"
                " allowed_models = excluded.allowed_models",
                params,
            )
        )

    async def create(self, tenant_id: str, name: str, allowed_models: Iterable[str] = ()) -> str:
        check_tenant_id(tenant_id)
        api_key = new_api_key(tenant_id)
        models = json.dumps(sorted(set(allowed_models)))

        def write(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(
                    "INSERT INTO tenants (tenant_id, name, allowed_models, created_at) VALUES (?, ?, ?, ?)",
                    (tenant_id, name, models, _now()),
                )
            except sqlite3.IntegrityError:
                raise TenantExistsError(tenant_id) from None
            _insert_key(conn, tenant_id, api_key)

        await self._db.run(lambda conn: transaction(conn, write))
        return api_key

    async def issue_key(self, tenant_id: str) -> str:
        api_key = new_api_key(tenant_id)
        await self.add_key(tenant_id, api_key)
        return api_key

    async def add_key(self, tenant_id: str, api_key: str) -> None:
        await self._db.run(lambda conn: transaction(conn, lambda c: _insert_key(c, tenant_id, api_key)))

    async def revoke_key(self, api_key: str) -> bool:
        digest = hash_key(api_key)
        cur = await self._db.run(
            lambda conn: conn.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE key_sha256 = ? AND revoked_at IS NULL",
                (_now(), digest),
            )
        )
        return cur.rowcount == 1

    async def list(self) -> builtins.list[Tenant]:
        rows = await self._db.run(
            lambda conn: conn.execute(
                "SELECT tenant_id, name, allowed_models FROM tenants ORDER BY tenant_id"
            ).fetchall()
        )
        return [_tenant(*r) for r in rows]
