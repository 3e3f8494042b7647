"""The backends the contract suites run over (fixtures in conftest.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from sluice.stores.ledger.base import UsageLedger
from sluice.stores.ledger.store import PostgresLedger, SqliteLedger
from sluice.stores.tenants.base import TenantStore
from sluice.stores.tenants.store import PostgresTenantStore, SqliteTenantStore


@dataclass
class Backend:
    """How a contract test reaches one backend: fresh store objects on one (empty at start) database,
    and the raw rows of a table, read around the store's code."""

    name: str
    make_ledger: Callable[[], UsageLedger]
    make_tenant_store: Callable[[], TenantStore]
    read_table: Callable[[str], Awaitable[list[tuple[Any, ...]]]]
    database_url: str | None  # None: SQLite


def sqlite_backend(tmp_path: Path) -> Backend:
    path = tmp_path / "sluice.db"

    async def read_table(table: str) -> list[tuple[Any, ...]]:
        with closing(sqlite3.connect(path)) as conn:
            return conn.execute(f"SELECT * FROM {table}").fetchall()

    return Backend("sqlite", lambda: SqliteLedger(path), lambda: SqliteTenantStore(path), read_table, None)


def postgres_backend(url: str) -> Backend:
    async def read_table(table: str) -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            cur = await conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table)))
            return await cur.fetchall()

    return Backend(
        "postgres",
        lambda: PostgresLedger(url, pool_max_size=4),
        lambda: PostgresTenantStore(url, pool_max_size=4),
        read_table,
        url,
    )
