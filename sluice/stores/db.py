"""What the SQL-backed stores share: numbered migrations, an SQLite connection on its own thread, a pool.

Each store (the usage ledger, the tenant store) owns a numbered list of ``Migration``s under a component
name; ``schema_migrations`` records ``(component, version)`` for each one applied, so the lists never
collide and applying them again is a no-op. Both backends run the same list: a migration carries one
script per dialect.

SQLite is reached through the standard library's ``sqlite3`` on one dedicated thread (``SqliteDb``) rather
than through aiosqlite: that is all aiosqlite does, this keeps one dependency fewer, and it lets a store
run a whole transaction as one plain function.

Which driver errors mean "the database cannot be used now" (as opposed to a bug in our SQL) is decided
here once: ``SqliteDb.open_or``/``run_or`` and ``MigratedPgPool.open_or``/``connection_or`` raise the
store's own error, built by the factory it passes, so a store keeps only its error type and message.
While opening, every driver error means the store cannot be opened (a file that is not a database, a
schema the migrations cannot write), so ``open_or`` maps them all: callers catch the store's error alone.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from sluice.outages import OutageLog

log = logging.getLogger(__name__)

T = TypeVar("T")

# What a store raises when its database cannot be used now: its own error type (e.g. a 503 downstream)
# built from the driver's exception, so the driver's types stay inside the backend.
UnavailableError = Callable[[Exception], Exception]

# NOTE: one key for every migration run in a database, held for the run's transaction: two processes
# starting at once apply each migration exactly once (the second waits, then finds nothing to do).
_PG_MIGRATION_LOCK_KEY = 0x511CE_0001  # "sluice" + 1: any fixed bigint will do

_SCHEMA_MIGRATIONS_DDL = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    component TEXT NOT NULL,
    version INTEGER NOT NULL,
    name TEXT NOT NULL,
    applied_at TEXT NOT NULL,
    PRIMARY KEY (component, version)
)
"""


@dataclass(frozen=True)
class Migration:
    """One schema step. ``version`` numbers are 1, 2, 3, ... within a component; scripts may hold
    several statements separated by ``;`` (no ``;`` inside literals)."""

    version: int
    name: str
    sqlite: str
    postgres: str


def check_migrations(migrations: Sequence[Migration]) -> None:
    """Versions must run 1..n in order: a gap or a repeat is a programming error."""
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(migrations) + 1)):
        raise ValueError(f"migration versions must be 1..{len(migrations)} in order, got {versions}")


def warn_if_newer(dialect: str, component: str, done: set[int], migrations: Sequence[Migration]) -> None:
    """A schema with migrations this code does not know: the code was rolled back past them. Every
    migration is additive (new tables, nullable or defaulted columns, indexes), so the older code runs on
    it; said once at open, so an operator sees the mix."""
    unknown = sorted(v for v in done if v > len(migrations))
    if unknown:
        log.warning(
            "%s: the %s schema has migrations %s that this code does not know (it knows 1..%d): running "
            "on the newer schema, as a rollback does",
            dialect,
            component,
            unknown,
            len(migrations),
        )


def _utc_now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


# ---------------------------------------------------------------------------------------------- SQLite

# sqlite3.OperationalError also reports our own SQL's mistakes ("no such table"): only these messages
# mean the file cannot be used now (locked, gone, full, read-only), and those a caller may retry later.
_SQLITE_UNAVAILABLE_MESSAGES = ("locked", "busy", "unable to open", "disk i/o", "disk is full", "readonly")


class SqliteDb:
    """One SQLite connection, used only from one worker thread; ``run`` awaits a function of it.

    Every call is serialised on that thread, so a function passed to ``run`` is a transaction no other
    call in this process interleaves with. Other processes are kept out by SQLite's own locks (WAL mode,
    a busy timeout, and ``BEGIN IMMEDIATE`` for writes).
    """

    def __init__(self, path: Path, *, busy_timeout_s: float = 5.0) -> None:
        self.path = path
        self._busy_timeout_s = busy_timeout_s
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sqlite-{self.path.name}")
        self._conn = await asyncio.get_running_loop().run_in_executor(self._executor, self._connect)

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: no implicit transactions; each store writes BEGIN IMMEDIATE ... COMMIT.
        conn = sqlite3.connect(
            self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        self._use_wal(conn)
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        """WAL (readers never block the writer). The mode is stored in the file, so only the first opener
        switches it; switching needs a lock SQLite's busy handler does not wait for, hence the retry."""
        deadline = time.monotonic() + self._busy_timeout_s
        while True:
            try:
                (mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
                if mode == "wal":
                    return
                raise RuntimeError(f"SQLite database {self.path} refused WAL mode (got {mode!r})")
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the connection's thread and return its result.

        Once called, ``fn`` runs even if the caller is cancelled (the await raises; ``close`` waits for it).
        """
        if self._executor is None or self._conn is None:
            raise RuntimeError(f"SQLite database {self.path} is not open")
        job = asyncio.get_running_loop().run_in_executor(self._executor, fn, self._conn)
        # NOTE: shielded, or cancelling the caller would cancel a job still queued behind others.
        return await asyncio.shield(job)

    async def open_or(self, unavailable: UnavailableError) -> None:
        """``open``; a file that cannot be opened (missing directory, locked, not a database: any
        ``sqlite3.Error`` or ``OSError`` here) raises ``unavailable(exc)``."""
        try:
            await self.open()
        except (sqlite3.Error, OSError) as exc:
            raise unavailable(exc) from exc

    async def run_or(self, unavailable: UnavailableError, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``run``; a file that cannot be used now (see ``_SQLITE_UNAVAILABLE_MESSAGES``, or an
        ``OSError``) raises ``unavailable(exc)``, any other error (our SQL's) as it is."""
        try:
            return await self.run(fn)
        except sqlite3.OperationalError as exc:
            if not any(m in str(exc).lower() for m in _SQLITE_UNAVAILABLE_MESSAGES):
                raise
            raise unavailable(exc) from exc
        except OSError as exc:
            raise unavailable(exc) from exc

    async def close(self) -> None:
        if self._executor is None:
            return
        if self._conn is not None:
            await self.run(lambda conn: conn.close())
        self._executor.shutdown(wait=True)
        self._executor, self._conn = None, None


def transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """``fn`` inside ``BEGIN IMMEDIATE`` (the write lock taken up front, so no upgrade deadlock)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


def apply_sqlite_migrations(
    conn: sqlite3.Connection, component: str, migrations: Sequence[Migration]
) -> list[int]:
    """Apply the pending ones in one transaction; return the versions applied (empty when up to date)."""
    check_migrations(migrations)

    def apply(c: sqlite3.Connection) -> list[int]:
        c.execute(_SCHEMA_MIGRATIONS_DDL)
        done = {
            v for (v,) in c.execute("SELECT version FROM schema_migrations WHERE component = ?", (component,))
        }
        warn_if_newer("sqlite", component, done, migrations)
        applied = []
        for m in migrations:
            if m.version in done:
                continue
            for stmt in _statements(m.sqlite):
                c.execute(stmt)
            c.execute(
                "INSERT INTO schema_migrations (component, version, name, applied_at) VALUES (?, ?, ?, ?)",
                (component, m.version, m.name, _utc_now_text()),
            )
            applied.append(m.version)
        return applied

    applied = transaction(conn, apply)
    if applied:
        log.info("sqlite: applied %s migrations %s", component, applied)
    return applied


# ------------------------------------------------------------------------------------------ PostgreSQL


async def open_pg_pool(
    url: str,
    *,
    max_size: int,
    name: str,
    acquire_timeout_s: float = 30.0,
    open_timeout_s: float = 10.0,
) -> AsyncConnectionPool:
    """An opened pool of autocommit connections; fails here (not on first use) if the server is not there
    within ``open_timeout_s``. Waiting for a connection longer than ``acquire_timeout_s`` raises
    ``PoolTimeout``. Connections are handed out unchecked: ``MigratedPgPool`` checks each itself."""

    # NOTE: one direct connection first. A server that refuses, a wrong database or password fails here at
    # once with the driver's reason; the pool would retry quietly until open_timeout_s ran out and say only
    # that it timed out.
    probe = await psycopg.AsyncConnection.connect(url, connect_timeout=max(1, math.ceil(open_timeout_s)))
    await probe.close()
    pool = AsyncConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        open=False,
        name=name,
        timeout=acquire_timeout_s,
        kwargs={"autocommit": True},
    )
    try:
        await pool.open(wait=True, timeout=open_timeout_s)
    except BaseException:
        await pool.close()
        raise
    return pool


async def apply_pg_migrations(
    pool: AsyncConnectionPool, component: str, migrations: Sequence[Migration]
) -> list[int]:
    """Apply the pending ones in one transaction under an advisory lock; return the versions applied."""
    check_migrations(migrations)
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_MIGRATION_LOCK_KEY,))
        # NOTE: created under the lock: concurrent CREATE TABLE IF NOT EXISTS can still collide.
        await conn.execute(_SCHEMA_MIGRATIONS_DDL)
        cur = await conn.execute("SELECT version FROM schema_migrations WHERE component = %s", (component,))
        done = {v for (v,) in await cur.fetchall()}
        warn_if_newer("postgresql", component, done, migrations)
        applied = []
        for m in migrations:
            if m.version in done:
                continue
            for stmt in _statements(m.postgres):
                await conn.execute(stmt.encode())  # bytes: our own literal DDL, not a LiteralString
            await conn.execute(
                "INSERT INTO schema_migrations (component, version, name, applied_at)"
                " VALUES (%s, %s, %s, %s)",
                (component, m.version, m.name, _utc_now_text()),
            )
            applied.append(m.version)
    if applied:
        log.info("postgresql: applied %s migrations %s", component, applied)
    return applied


# The server or the network failed (psycopg_pool's PoolTimeout is an OperationalError), not our SQL.
PG_UNREACHABLE = (psycopg.OperationalError, OSError)


class MigratedPgPool:
    """A PostgreSQL store's pool: opened with its component's migrations applied, closed once.

    ``open(keep_trying=True)`` is for a server process (the gateway): if the server cannot be reached at
    start, it returns anyway and keeps trying in the background (``retry_initial_s`` doubling to
    ``retry_max_s``); until it succeeds, ``pool`` raises ``psycopg.OperationalError``, which the stores
    already treat as an outage. A tool (the CLI) opens without it and fails at once.

    An outage while open: a connection that fails as unreachable (``PG_UNREACHABLE``) is evidence only
    once a fresh connection to the server fails too; then the store is down: ``connection_or`` refuses
    at once (never after the pool's acquire timeout), and a fresh connection is tried every
    ``probe_interval_s``. The first that succeeds ends the outage with a new pool, so the store is back
    within a probe of the server's return (psycopg_pool's own reconnect backs off without bound, which
    kept stores down for tens of seconds after their database was back). The outage is logged once each
    way (``sluice.outages.OutageLog``), at DEBUG with ``report_outages=False``.
    """

    def __init__(
        self,
        url: str,
        *,
        max_size: int,
        name: str,
        component: str,
        migrations: Sequence[Migration],
        acquire_timeout_s: float = 30.0,
        retry_initial_s: float = 0.5,
        retry_max_s: float = 30.0,
        probe_interval_s: float = 0.5,
        report_outages: bool = True,
        what: str = "",
    ) -> None:
        self._url = url
        self._acquire_timeout_s = acquire_timeout_s
        self._max_size = max_size
        self._name = name
        self._component = component
        self._migrations = migrations
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._pool: AsyncConnectionPool | None = None
        self._opener: asyncio.Task[None] | None = None  # set while opening in the background
        self._last_error = ""
        self._probe_interval_s = probe_interval_s
        # NOTE: the outage's one report (sluice.outages); quiet where a component above reports it.
        self._outage = OutageLog(
            log, f"{what or name + ' store'}: PostgreSQL at {describe_pg_url(url)}", enabled=report_outages
        )
        self._watcher: asyncio.Task[None] | None = None  # probing, from a suspect failure to the recovery
        self._waits: set[asyncio.Timeout] = set()  # callers waiting for a connection now

    @property
    def pool(self) -> AsyncConnectionPool:
        if self._pool is None:
            if self._opener is not None:
                raise psycopg.OperationalError(
                    f"the {self._name} store has not reached PostgreSQL since start ({self._last_error}); "
                    "still trying"
                )
            raise RuntimeError(f"the {self._name} store is not open")
        return self._pool

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    async def open(
        self, *, keep_trying: bool = False, after_open: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Open the pool and apply the migrations, then await ``after_open`` (e.g. seeding), all before
        the store is used. ``keep_trying``: see the class."""
        if self._pool is not None or self._opener is not None:
            return
        try:
            await self._open_once(after_open, open_timeout_s=2.0 if keep_trying else 10.0)
        except PG_UNREACHABLE as exc:
            if not keep_trying:
                raise
            self._last_error = _one_line(exc)
            log.warning(
                "%s store: PostgreSQL at %s unreachable at start (%s); starting without it and retrying "
                "in the background: requests that need it get 503 until it answers",
                self._name,
                describe_pg_url(self._url),
                self._last_error,
            )
            self._opener = asyncio.create_task(self._keep_opening(after_open), name=f"{self._name}-open")

    async def open_or(
        self,
        unavailable: UnavailableError,
        *,
        keep_trying: bool = False,
        after_open: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``open``; the server or network failing (``PG_UNREACHABLE``), or any other driver error while
        opening (the migrations refused: no schema to create in, no rights on it), raises
        ``unavailable(exc)``. With ``keep_trying`` only the latter still raises."""
        try:
            await self.open(keep_trying=keep_trying, after_open=after_open)
        except (psycopg.Error, *PG_UNREACHABLE) as exc:
            raise unavailable(exc) from exc

    @property
    def is_down(self) -> bool:
        """A fresh connection to the server failed and none has succeeded since (see the class)."""
        return self._outage.is_down

    @asynccontextmanager
    async def connection_or(self, unavailable: UnavailableError) -> AsyncIterator[psycopg.AsyncConnection]:
        """A pooled connection; the server or network failing (``PG_UNREACHABLE``), here (including not
        reached since start, or known down) or in the caller's block, raises ``unavailable(exc)``."""
        if self._outage.is_down:
            raise unavailable(self._down_error())
        try:
            pool = self.pool  # raises OperationalError while not reached since start
        except PG_UNREACHABLE as exc:
            raise unavailable(exc) from exc
        conn = await self._acquire_or(pool, unavailable)
        try:
            yield conn
        except PG_UNREACHABLE as exc:
            raise unavailable(self._unreachable(pool, exc)) from exc
        finally:
            await pool.putconn(conn)

    async def _acquire_or(
        self, pool: AsyncConnectionPool, unavailable: UnavailableError
    ) -> psycopg.AsyncConnection:
        """A connection from ``pool``, or ``unavailable`` as soon as the store is found down.

        NOTE: closing the pool fails the callers queued for a connection, but not one in the middle of
        checking one, which on a half-open socket waits as long as TCP does: so each wait is a deadline
        the outage's start moves to now (``_cut_waits``)."""
        loop = asyncio.get_running_loop()
        # a connection slow to come (the pool may be waiting on a dead server) is a reason to look too
        slow = loop.call_later(self._probe_interval_s, self._suspect, pool, None)
        try:
            async with asyncio.timeout(None) as waiting:
                self._waits.add(waiting)
                try:
                    return await self._checked_connection(pool)
                finally:
                    self._waits.discard(waiting)
        except TimeoutError as exc:  # cut by the outage's start
            raise unavailable(self._down_error()) from exc
        except PG_UNREACHABLE as exc:
            raise unavailable(self._unreachable(pool, exc)) from exc
        finally:
            slow.cancel()

    async def _checked_connection(self, pool: AsyncConnectionPool) -> psycopg.AsyncConnection:
        """A pooled connection that answered a round trip just now.

        NOTE: one that died while it sat idle (an outage that has since ended) is given back, to be
        replaced, and the next taken at once: psycopg_pool's own ``check=`` sleeps 1 s, then 2 s, ...
        between dead connections, so a caller meeting several after an outage waited seconds (and the
        usage meter's 2 s write timeout declared a new outage while the server was up). Each failure is
        still evidence to probe the server with (``_suspect``); the caller's wait is bounded as
        ever, by the pool's acquire timeout or the outage's start."""
        while True:
            conn = await pool.getconn()
            try:
                await AsyncConnectionPool.check_connection(conn)
            except PG_UNREACHABLE as exc:
                await pool.putconn(conn)  # broken: the pool closes it and opens another
                self._suspect(pool, exc)
                continue
            except BaseException:
                await pool.putconn(conn)
                raise
            return conn

    def _unreachable(self, pool: AsyncConnectionPool, exc: Exception) -> Exception:
        """What a caller whose connection failed as unreachable is refused with: the outage, once the
        probe this starts has found the server gone, else the connection's own error."""
        self._suspect(pool, exc)
        return self._down_error() if self._outage.is_down else exc

    def _down_error(self) -> psycopg.OperationalError:
        down_s = self._outage.down_for_s
        return psycopg.OperationalError(f"PostgreSQL unreachable for {down_s:.1f} s ({self._last_error})")

    def _cut_waits(self) -> None:
        """The store is down: every caller waiting for a connection is refused now."""
        now = asyncio.get_running_loop().time()
        for waiting in self._waits:
            waiting.reschedule(now)

    def _suspect(self, pool: AsyncConnectionPool, exc: BaseException | None) -> None:
        """A connection failed as unreachable (or was slow to come): find out whether the server is, in
        the background."""
        if self._watcher is None and pool is self._pool:
            if exc is not None:
                self._last_error = _one_line(exc)
            self._watcher = asyncio.create_task(self._watch(), name=f"{self._name}-probe")

    async def _reachable(self) -> bool:
        try:
            conn = await psycopg.AsyncConnection.connect(self._url, connect_timeout=1)
        except PG_UNREACHABLE as exc:
            self._last_error = _one_line(exc)
            return False
        await conn.close()
        return True

    async def _watch(self) -> None:
        """Probe until a fresh connection succeeds; if the first fails, the store is down until then, and
        the pool is replaced (its connections and its own reconnect schedule are the outage's)."""
        try:
            if await self._reachable():
                return  # one connection's failure (or a busy pool), not the server's
            self._outage.down(
                self._last_error, f"refusing at once, probing every {self._probe_interval_s:.1f} s"
            )
            self._cut_waits()
            if self._pool is not None:  # its waiters are refused now, not at their acquire timeout
                await self._pool.close(timeout=0)
            while True:
                await asyncio.sleep(self._probe_interval_s)
                if await self._reachable():
                    try:
                        fresh = await open_pg_pool(
                            self._url, max_size=self._max_size, name=self._name,
                            acquire_timeout_s=self._acquire_timeout_s, open_timeout_s=2.0,
                        )  # fmt: skip
                    except PG_UNREACHABLE as exc:
                        self._last_error = _one_line(exc)
                        continue
                    break
            self._pool = fresh
            self._outage.up()
        finally:
            self._watcher = None

    async def _open_once(
        self, after_open: Callable[[], Awaitable[None]] | None, *, open_timeout_s: float
    ) -> None:
        pool = await open_pg_pool(
            self._url,
            max_size=self._max_size,
            name=self._name,
            acquire_timeout_s=self._acquire_timeout_s,
            open_timeout_s=open_timeout_s,
        )
        try:
            await apply_pg_migrations(pool, self._component, self._migrations)
            self._pool = pool
            if after_open is not None:
                await after_open()
        except BaseException:
            self._pool = None
            await pool.close()
            raise

    async def _keep_opening(self, after_open: Callable[[], Awaitable[None]] | None) -> None:
        delay_s = self._retry_initial_s
        while True:
            await asyncio.sleep(delay_s)
            try:
                await self._open_once(after_open, open_timeout_s=2.0)
            except PG_UNREACHABLE as exc:
                self._last_error = _one_line(exc)
                log.debug("%s store: PostgreSQL still unreachable: %s", self._name, self._last_error)
                delay_s = min(delay_s * 2, self._retry_max_s)
                continue
            except Exception:
                log.exception("%s store: opening failed for a reason other than reachability", self._name)
                delay_s = self._retry_max_s
                continue
            where = describe_pg_url(self._url)
            log.info("%s store: PostgreSQL at %s reached; the store is open", self._name, where)
            self._opener = None
            return

    async def close(self) -> None:
        for task in (self._opener, self._watcher):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._opener = self._watcher = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def describe_pg_url(url: str) -> str:
    """``host:port/dbname`` for logs: never the password."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable database_url>"
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '?')}"
