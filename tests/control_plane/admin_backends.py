"""The backends the admin token contract suite runs over (fixtures in conftest.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from sluice.stores.admin_tokens.base import AdminTokenStore
from sluice.stores.admin_tokens.store import PostgresAdminTokenStore, SqliteAdminTokenStore
from sluice.stores.tenants.base import TenantStore
from sluice.stores.tenants.store import PostgresTenantStore, SqliteTenantStore


@dataclass
class AdminBackend:
    """One backend: fresh admin token stores and tenant stores on one (empty at start) database, and the
    raw rows of a table read around the stores' code."""

    name: str
    make_store: Callable[[], AdminTokenStore]
    make_tenant_store: Callable[[], TenantStore]
    read_table: Callable[[str], Awaitable[list[tuple[Any, ...]]]]
    database_url: str | None  # None: SQLite


def sqlite_backend(tmp_path: Path) -> AdminBackend:
    path = tmp_path / "sluice.db"

    async def read_table(table: str) -> list[tuple[Any, ...]]:
        with closing(sqlite3.connect(path)) as conn:
            return conn.execute(f"SELECT * FROM {table}").fetchall()

    return AdminBackend(
        "sqlite", lambda: SqliteAdminTokenStore(path), lambda: SqliteTenantStore(path), read_table, None
    )


def postgres_backend(url: str) -> AdminBackend:
    async def read_table(table: str) -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            cur = await conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table)))
            return await cur.fetchall()

    return AdminBackend(
        "postgres",
        lambda: PostgresAdminTokenStore(url),
        lambda: PostgresTenantStore(url, pool_max_size=2),
        read_table,
        url,
    )
