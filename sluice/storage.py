"""Which storage backend runs, chosen once from settings: PostgreSQL when ``database_url`` is set, else the
SQLite file ``<state_dir>/sluice.db``. The choice is logged at start, never made by silent fallback.

An unreachable PostgreSQL fails here, unless ``keep_trying`` (the gateway's start): then the store is
returned unopened and opens in the background once the server answers (``sluice.db.MigratedPgPool``);
until then it behaves as during an outage (tenant lookups 503 or the last good view, usage kept in the
outbox).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol, TypeVar, cast

from sluice.db import describe_pg_url
from sluice.ledger.base import UsageLedger
from sluice.settings import Settings
from sluice.tenants.base import TenantStore, seed_dev_tenants

log = logging.getLogger(__name__)

S = TypeVar("S")
AfterOpen = Callable[[], Awaitable[None]]


class _PgBackend(Protocol):
    """What every PostgreSQL backend's ``open`` takes (``sluice.db.MigratedPgPool`` underneath)."""

    async def open(self, *, keep_trying: bool = False) -> None: ...


class _SeededPgBackend(Protocol):
    async def open(self, *, keep_trying: bool = False, after_open: AfterOpen | None = None) -> None: ...


class _SqliteBackend(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...


async def open_backend(
    settings: Settings,
    what: str,
    postgres: Callable[[str], S],
    sqlite: Callable[[Path], S],
    *,
    keep_trying: bool = False,
    seed: Callable[[S], Awaitable[None]] | None = None,
) -> S:
    """The one choice of backend for every store family (``what`` names it in the log): PostgreSQL at
    ``settings.database_url`` when set, else the SQLite file ``settings.sqlite_path``; opened (migrated),
    then ``seed`` run on it. ``postgres`` / ``sqlite`` build the store (importing their backend only when
    chosen). With ``keep_trying`` an unreachable PostgreSQL does not fail here: the store opens, and is
    seeded, in the background."""
    if settings.database_url is not None:
        log.info("%s: PostgreSQL at %s", what, describe_pg_url(settings.database_url))
        pg_store = postgres(settings.database_url)
        if seed is None:
            await cast(_PgBackend, pg_store).open(keep_trying=keep_trying)
        else:
            after_open = seed
            await cast(_SeededPgBackend, pg_store).open(
                keep_trying=keep_trying, after_open=lambda: after_open(pg_store)
            )
        return pg_store
    log.info("%s: SQLite at %s", what, settings.sqlite_path)
    store = sqlite(settings.sqlite_path)
    await cast(_SqliteBackend, store).open()
    if seed is not None:
        try:
            await seed(store)
        except BaseException:
            await cast(_SqliteBackend, store).close()
            raise
    return store


async def open_ledger(settings: Settings, *, keep_trying: bool = False) -> UsageLedger:
    """An opened (migrated) ledger, or with ``keep_trying`` one opening in the background; the caller
    closes it."""

    def postgres(url: str) -> UsageLedger:
        from sluice.ledger.store import PostgresLedger

        return PostgresLedger(url, pool_max_size=settings.database_pool_max_size)

    def sqlite(path: Path) -> UsageLedger:
        from sluice.ledger.store import SqliteLedger

        return SqliteLedger(path)

    return await open_backend(settings, "usage ledger", postgres, sqlite, keep_trying=keep_trying)


async def open_tenant_store(settings: Settings, *, keep_trying: bool = False) -> TenantStore:
    """An opened (migrated) tenant store, with the dev tenants seeded if ``settings.dev_tenants``, or with
    ``keep_trying`` one opening (and seeding) in the background; the caller closes it."""

    def postgres(url: str) -> TenantStore:
        from sluice.tenants.store import PostgresTenantStore

        return PostgresTenantStore(url, pool_max_size=settings.database_pool_max_size)

    def sqlite(path: Path) -> TenantStore:
        from sluice.tenants.store import SqliteTenantStore

        return SqliteTenantStore(path)

    async def seed(store: TenantStore) -> None:
        if settings.dev_tenants:
            await seed_dev_tenants(store)
            log.info("tenant store: dev tenants seeded (acme, globex)")

    return await open_backend(settings, "tenant store", postgres, sqlite, keep_trying=keep_trying, seed=seed)
