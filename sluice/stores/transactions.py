"""One body per SQL store: a store writes each of its transactions once, against ``Tx``, and runs it on
either database through a ``SqlRunner``.

A body is an ``async def body(tx) -> result`` that awaits nothing but ``tx``'s methods. SQL text uses
``?`` placeholders (the PostgreSQL runner turns them into psycopg's ``%s``); values that differ between
the databases go through the dialect's codecs (``tx.codecs``): timestamps are ISO-8601 text in SQLite and
``timestamptz`` in PostgreSQL, JSON is text in SQLite and ``jsonb`` in PostgreSQL.

Four ways to run a body, the same on both databases:
- ``run``: no transaction of its own (one statement is atomic by itself), for reads and for writes a
  caller may give up on: a cancelled caller lets go at once (its pooled connection is returned).
- ``read``: one snapshot (SQLite: a deferred ``BEGIN`` on WAL; PostgreSQL: ``REPEATABLE READ``), so every
  statement sees the same state; lets go like ``run``.
- ``write``: one transaction that no other writer interleaves with (SQLite: ``BEGIN IMMEDIATE``;
  PostgreSQL: a transaction, plus whatever row lock the body takes first). Once started it completes
  even if its caller is cancelled (a usage row or a registry change must not be lost to a client's
  disconnect), and ``close`` waits for it.
- ``write_one``: one statement's write, without the cost of a transaction; completes like ``write``.

SQLite runs the whole body on its connection's thread in one hop (``_drive``: the body's coroutine is
stepped there to its end, which works because a ``SqliteTx`` method never suspends); PostgreSQL awaits
each statement on a pooled connection. Which driver errors mean "the database cannot be used now" is
decided by ``sluice.stores.db`` (``run_or`` / ``connection_or``): they raise the store's own error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import psycopg
from psycopg.types.json import Jsonb

from sluice.outages import OutageLog
from sluice.stores.db import (
    MigratedPgPool,
    Migration,
    SqliteDb,
    UnavailableError,
    apply_sqlite_migrations,
    transaction,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
Row = tuple[Any, ...]
Dialect = Literal["sqlite", "postgresql"]


@dataclass(frozen=True)
class Codecs:
    """How one database stores what Python holds as a datetime or a JSON value."""

    to_db_time: Callable[[datetime], Any]
    from_db_time: Callable[[Any], datetime]  # an aware UTC datetime
    to_db_json: Callable[[Any], Any]
    from_db_json: Callable[[Any], Any]


def _time_text(at: datetime) -> str:
    """Fixed-width UTC ISO-8601, so text order is time order."""
    return at.astimezone(UTC).isoformat(timespec="microseconds")


SQLITE_CODECS = Codecs(
    to_db_time=_time_text,
    from_db_time=lambda text: datetime.fromisoformat(text).astimezone(UTC),
    to_db_json=lambda value: json.dumps(value, sort_keys=True),
    from_db_json=json.loads,
)
POSTGRES_CODECS = Codecs(
    to_db_time=lambda at: at,
    from_db_time=lambda at: at.astimezone(UTC),
    to_db_json=Jsonb,
    from_db_json=lambda value: value,  # psycopg has already parsed jsonb
)


class Tx(Protocol):
    """One connection inside one of a runner's transactions (or none, for ``run``)."""

    @property
    def dialect(self) -> Dialect: ...

    @property
    def codecs(self) -> Codecs: ...

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; the number of rows it changed."""
        ...

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None: ...


Body = Callable[[Tx], Coroutine[Any, Any, T]]


class SqlRunner(Protocol):
    """Where a store's bodies run; ``open`` applies the store's migrations."""

    @property
    def dialect(self) -> Dialect: ...

    async def open(
        self, *, keep_trying: bool = False, after_open: Callable[[], Awaitable[None]] | None = None
    ) -> None: ...

    async def close(self) -> None: ...

    async def run(self, body: Body[T]) -> T: ...

    async def read(self, body: Body[T]) -> T: ...

    async def write(self, body: Body[T]) -> T: ...

    async def write_one(self, body: Body[T]) -> T: ...


@dataclass(frozen=True)
class StoreSchema:
    """What a store's two runners share: its name in errors (``what``), its pool's name in logs, its
    migrations, and its own "unavailable" error, built from a message."""

    what: str  # "tenant store": "tenant store (SQLite) unavailable: ..."
    pool_name: str
    component: str
    migrations: Sequence[Migration]
    unavailable: Callable[[str], Exception]

    def sqlite(self, path: Path, *, report_outages: bool = True) -> SqliteRunner:
        return SqliteRunner(
            path,
            component=self.component,
            migrations=self.migrations,
            unavailable=lambda exc: self.unavailable(f"{self.what} (SQLite) unavailable: {exc}"),
            outage=OutageLog(log, f"{self.what}: SQLite at {path}", enabled=report_outages),
        )

    def postgres(
        self, url: str, *, pool_max_size: int, acquire_timeout_s: float, report_outages: bool = True
    ) -> PostgresRunner:
        return PostgresRunner(
            url,
            name=self.pool_name,
            component=self.component,
            migrations=self.migrations,
            unavailable=lambda exc: self.unavailable(f"{self.what} (PostgreSQL) unavailable: {exc}"),
            pool_max_size=pool_max_size,
            acquire_timeout_s=acquire_timeout_s,
            report_outages=report_outages,
            what=self.what,
        )


# ---------------------------------------------------------------------------------------------- SQLite


class SqliteTx:
    dialect: Dialect = "sqlite"
    codecs = SQLITE_CODECS

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._conn.execute(sql, params).rowcount

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self._conn.execute(sql, params).fetchall()

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        row: Row | None = self._conn.execute(sql, params).fetchone()
        return row


def _drive(body: Body[T], conn: sqlite3.Connection) -> T:
    """Step ``body``'s coroutine to its end on this (the connection's) thread. A ``SqliteTx`` method never
    suspends, so the first step finishes the body; a body that awaited anything else would need the
    event loop, which this thread does not run: refused as a programming error."""
    coro = body(SqliteTx(conn))
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise RuntimeError(f"{body!r} awaited something other than its Tx: a store's body must not suspend")


def _read_snapshot(conn: sqlite3.Connection, body: Body[T]) -> T:
    conn.execute("BEGIN")
    try:
        return _drive(body, conn)
    finally:
        conn.execute("COMMIT")


class SqliteRunner:
    """A store's bodies on one SQLite file (``SqliteDb``: one connection on its own thread)."""

    dialect: Dialect = "sqlite"

    def __init__(
        self,
        path: Path,
        *,
        component: str,
        migrations: Sequence[Migration],
        unavailable: UnavailableError,
        outage: OutageLog,
    ) -> None:
        self._db = SqliteDb(path)
        self._component = component
        self._migrations = migrations
        self._unavailable_error = unavailable
        self._outage = outage  # a file that cannot be used now (locked, full, gone): said once each way

    async def open(
        self, *, keep_trying: bool = False, after_open: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """``keep_trying`` has no meaning for a local file: one that cannot be opened fails here."""
        await self._db.open_or(self._unavailable)
        await self._db.run_or(
            self._unavailable, lambda conn: apply_sqlite_migrations(conn, self._component, self._migrations)
        )
        if after_open is not None:
            await after_open()

    async def close(self) -> None:
        await self._db.close()

    async def run(self, body: Body[T]) -> T:
        return await self._run_or(lambda conn: _drive(body, conn))

    async def read(self, body: Body[T]) -> T:
        return await self._run_or(lambda conn: _read_snapshot(conn, body))

    async def write(self, body: Body[T]) -> T:
        return await self._run_or(lambda conn: transaction(conn, lambda c: _drive(body, c)))

    async def write_one(self, body: Body[T]) -> T:
        # NOTE: a job handed to the connection's thread always runs to its end (SqliteDb.run): what
        # ``write_one`` promises, and why ``run`` on SQLite lets go of the caller but not of the job.
        return await self.run(body)

    def _unavailable(self, exc: Exception) -> Exception:
        self._outage.down(exc)
        return self._unavailable_error(exc)

    async def _run_or(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        result = await self._db.run_or(self._unavailable, fn)
        self._outage.up()
        return result


# ------------------------------------------------------------------------------------------ PostgreSQL


@lru_cache(maxsize=1024)
def _pg_sql(sql: str) -> bytes:
    """``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled); bytes: our own constant SQL, not a
    LiteralString."""
    return sql.replace("%", "%%").replace("?", "%s").encode()


class PostgresTx:
    dialect: Dialect = "postgresql"
    codecs = POSTGRES_CODECS

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        cur = await self._conn.execute(_pg_sql(sql), params)
        return cur.rowcount

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        cur = await self._conn.execute(_pg_sql(sql), params)
        return await cur.fetchall()

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        cur = await self._conn.execute(_pg_sql(sql), params)
        return await cur.fetchone()


class PostgresRunner:
    """A store's bodies on a PostgreSQL pool (``MigratedPgPool``: migrated at open, or, with
    ``keep_trying``, opening in the background)."""

    dialect: Dialect = "postgresql"

    def __init__(
        self,
        url: str,
        *,
        name: str,
        component: str,
        migrations: Sequence[Migration],
        unavailable: UnavailableError,
        pool_max_size: int = 10,
        acquire_timeout_s: float = 30.0,
        report_outages: bool = True,
        what: str = "",
    ) -> None:
        self.db = MigratedPgPool(
            url,
            max_size=pool_max_size,
            name=name,
            component=component,
            migrations=migrations,
            acquire_timeout_s=acquire_timeout_s,
            report_outages=report_outages,
            what=what,
        )
        self._unavailable = unavailable
        self._in_flight: set[asyncio.Task[Any]] = set()

    async def open(
        self, *, keep_trying: bool = False, after_open: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        await self.db.open_or(self._unavailable, keep_trying=keep_trying, after_open=after_open)

    async def close(self) -> None:
        if self._in_flight:  # writes whose callers were cancelled: let them land
            await asyncio.gather(*self._in_flight, return_exceptions=True)
        await self.db.close()

    async def run(self, body: Body[T]) -> T:
        return await self._autocommit(body)

    async def read(self, body: Body[T]) -> T:
        async with self.db.connection_or(self._unavailable) as conn, conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            return await body(PostgresTx(conn))

    async def write(self, body: Body[T]) -> T:
        return await self._to_the_end(self._transaction(body))

    async def write_one(self, body: Body[T]) -> T:
        return await self._to_the_end(self._autocommit(body))

    async def _autocommit(self, body: Body[T]) -> T:
        async with self.db.connection_or(self._unavailable) as conn:
            return await body(PostgresTx(conn))

    async def _transaction(self, body: Body[T]) -> T:
        async with self.db.connection_or(self._unavailable) as conn, conn.transaction():
            return await body(PostgresTx(conn))

    async def _to_the_end(self, work: Coroutine[Any, Any, T]) -> T:
        """``work`` in its own task, shielded: a caller cancelled mid-write (a client disconnect reaching
        the request's ``finally``) does not abort it, as SQLite's thread does not; ``close`` waits for
        it."""
        task = asyncio.create_task(work)
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        return await asyncio.shield(task)
