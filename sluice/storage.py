"""Which storage backend runs, chosen once from settings: PostgreSQL when ``database_url`` is set, else the
SQLite file ``<state_dir>/sluice.db``. The choice is logged at start, never made by silent fallback.

An unreachable PostgreSQL fails here, unless ``keep_trying`` (the gateway's start): then the store is
returned unopened and opens in the background once the server answers (``sluice.db.MigratedPgPool``);
until then it behaves as during an outage (tenant lookups 503 or the last good view, usage kept in the
outbox).
"""

from __future__ import annotations

import logging

from sluice.db import describe_pg_url
from sluice.ledger.base import UsageLedger
from sluice.settings import Settings
from sluice.tenants.base import TenantStore, seed_dev_tenants

log = logging.getLogger(__name__)


async def open_ledger(settings: Settings, *, keep_trying: bool = False) -> UsageLedger:
    """An opened (migrated) ledger, or with ``keep_trying`` one opening in the background; the caller
    closes it."""
    if settings.database_url is not None:
        from sluice.ledger.postgres import PostgresLedger

        log.info("usage ledger: PostgreSQL at %s", describe_pg_url(settings.database_url))
        pg_ledger = PostgresLedger(settings.database_url, pool_max_size=settings.database_pool_max_size)
        await pg_ledger.open(keep_trying=keep_trying)
        return pg_ledger
    from sluice.ledger.sqlite import SqliteLedger

    log.info("usage ledger: SQLite at %s", settings.sqlite_path)
    ledger = SqliteLedger(settings.sqlite_path)
    await ledger.open()
    return ledger


async def open_tenant_store(settings: Settings, *, keep_trying: bool = False) -> TenantStore:
    """An opened (migrated) tenant store, with the dev tenants seeded if ``settings.dev_tenants``, or with
    ``keep_trying`` one opening (and seeding) in the background; the caller closes it."""
    if settings.database_url is not None:
        from sluice.tenants.postgres import PostgresTenantStore

        log.info("tenant store: PostgreSQL at %s", describe_pg_url(settings.database_url))
        pg_store = PostgresTenantStore(settings.database_url, pool_max_size=settings.database_pool_max_size)
        await pg_store.open(keep_trying=keep_trying, after_open=lambda: _seed(pg_store, settings))
        return pg_store
    from sluice.tenants.sqlite import SqliteTenantStore

    log.info("tenant store: SQLite at %s", settings.sqlite_path)
    store = SqliteTenantStore(settings.sqlite_path)
    await store.open()
    try:
        await _seed(store, settings)
    except BaseException:
        await store.close()
        raise
    return store


async def _seed(store: TenantStore, settings: Settings) -> None:
    if settings.dev_tenants:
        await seed_dev_tenants(store)
        log.info("tenant store: dev tenants seeded (acme, globex)")
