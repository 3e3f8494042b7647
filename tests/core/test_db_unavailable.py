"""``sluice.stores.db``'s one mapping of SQLite errors to a store's own "unavailable" error: a file that
cannot be used now maps, our own SQL's mistakes do not (they are bugs, not outages). The stores' contract
suites check the same through each store; this pins the rule itself."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path

import pytest
from pg import through_proxy
from tcp_proxy import ProxyThread

from sluice.stores.db import MigratedPgPool, Migration, SqliteDb, apply_sqlite_migrations

pytestmark = pytest.mark.anyio


class Down(Exception):
    """A store's "unavailable" error, as the stores build theirs."""


def _down(exc: BaseException) -> Down:
    return Down(f"test store unavailable: {exc}")


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[SqliteDb]:
    opened = SqliteDb(tmp_path / "t.db")
    await opened.open_or(_down)
    yield opened
    await opened.close()


async def test_a_file_that_cannot_be_used_now_raises_the_stores_error(db: SqliteDb) -> None:
    def locked(conn: sqlite3.Connection) -> None:
        raise sqlite3.OperationalError("database is locked")

    with pytest.raises(Down, match="locked") as caught:
        await db.run_or(_down, locked)
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)


async def test_an_os_error_raises_the_stores_error(db: SqliteDb) -> None:
    def gone(conn: sqlite3.Connection) -> None:
        raise OSError("No space left on device")

    with pytest.raises(Down, match="No space"):
        await db.run_or(_down, gone)


async def test_our_own_sql_mistake_is_not_an_outage(db: SqliteDb) -> None:
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        await db.run_or(_down, lambda conn: conn.execute("SELECT * FROM missing").fetchall())


async def test_a_result_comes_back_unchanged(db: SqliteDb) -> None:
    assert await db.run_or(_down, lambda conn: conn.execute("SELECT 41 + 1").fetchone()) == (42,)


async def test_a_file_that_cannot_be_opened_raises_the_stores_error(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")  # a file where the database's directory should be
    with pytest.raises(Down, match="unavailable"):
        await SqliteDb(tmp_path / "a_file" / "t.db").open_or(_down)


async def test_an_unreachable_postgresql_fails_the_open_at_once_saying_why() -> None:
    """A server that refuses the connection: the store's error at once, with the driver's reason (not the
    pool's "incomplete after 10 s")."""
    pool = MigratedPgPool(
        "postgresql://postgres@127.0.0.1:1/nowhere", max_size=1, name="test", component="test", migrations=[]
    )
    started_s = time.monotonic()
    with pytest.raises(Down, match="Connection refused") as caught:
        await pool.open_or(_down)
    assert time.monotonic() - started_s < 5.0
    assert "incomplete" not in str(caught.value)


def test_code_rolled_back_runs_on_the_newer_schema_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Migrations are additive, so the code of before (knowing fewer of them) opens a schema the newer code
    migrated, applies nothing, and warns once naming the migrations it does not know."""
    newer = [
        Migration(version=1, name="t", sqlite="CREATE TABLE t (a INTEGER)", postgres=""),
        Migration(version=2, name="t b", sqlite="ALTER TABLE t ADD COLUMN b TEXT", postgres=""),
    ]
    with closing(sqlite3.connect(tmp_path / "s.db", isolation_level=None)) as conn:
        assert apply_sqlite_migrations(conn, "test", newer) == [1, 2]
        with caplog.at_level(logging.WARNING, logger="sluice.db"):
            assert apply_sqlite_migrations(conn, "test", newer[:1]) == []  # the rolled-back code
        conn.execute("INSERT INTO t (a) VALUES (1)")  # what it writes still fits
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "migrations [2] that this code does not know (it knows 1..1)" in warning


async def test_connections_that_died_idle_through_an_outage_are_replaced_without_waiting(
    database: str, pg_proxy: ProxyThread
) -> None:
    """After an outage every connection the pool held is dead: the next caller is handed a working one
    at once, and no outage is declared (psycopg_pool's own ``check=`` slept 1 s, then 2 s, between dead
    connections: 3 s for the third, past the usage meter's 2 s write timeout)."""
    store = MigratedPgPool(
        through_proxy(database, pg_proxy.port), max_size=4, name="test", component="test", migrations=[]
    )
    await store.open()
    try:

        async def hold() -> None:  # four callers at once: the pool holds four connections
            async with store.connection_or(_down) as conn:
                await conn.execute("SELECT pg_sleep(0.2)")

        await asyncio.gather(*(hold() for _ in range(4)))
        await asyncio.to_thread(pg_proxy.cut)
        await asyncio.to_thread(pg_proxy.restore)
        began = time.monotonic()
        async with store.connection_or(_down) as conn:
            assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
        assert time.monotonic() - began < 0.5
        assert not store.is_down
    finally:
        await store.close()
