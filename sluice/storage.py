"""Which storage backend runs, chosen once from settings: PostgreSQL when ``database_url`` is set, else the
SQLite file ``<state_dir>/sluice.db``. The choice is logged at start, never made by silent fallback: an
unreachable PostgreSQL fails here.
"""

from __future__ import annotations

import logging

from sluice.db import describe_pg_url
from sluice.ledger.base import UsageLedger
from sluice.settings import Settings
from sluice.tenants.base import TenantStore, seed_dev_tenants

log = logging.getLogger(__name__)


async def open_ledger(settings: Settings) -> UsageLedger:
    """An opened (migrated) ledger; the caller closes it."""
    ledger: UsageLedger
    if settings.database_url is not None:
        from sluice.ledger.postgres import PostgresLedger

        log.info("usage ledger: PostgreSQL at %s", describe_pg_url(settings.database_url))
        ledger = PostgresLedger(settings.database_url, pool_max_size=settings.database_pool_max_size)
    else:
        from sluice.ledger.sqlite import SqliteLedger

        log.info("usage ledger: SQLite at %s", settings.sqlite_path)
        ledger = SqliteLedger(settings.sqlite_path)
    await ledger.open()
    return ledger


async def open_tenant_store(settings: Settings) -> TenantStore:
    """An opened (migrated) tenant store, with the dev tenants seeded if ``settings.dev_tenants``;
    the caller closes it."""
    store: TenantStore
    if settings.database_url is not None:
        from sluice.tenants.postgres import PostgresTenantStore

        log.info("tenant store: PostgreSQL at %s", describe_pg_url(settings.database_url))
        store = PostgresTenantStore(settings.database_url, pool_max_size=settings.database_pool_max_size)
    else:
        from sluice.tenants.sqlite import SqliteTenantStore

        log.info("tenant store: SQLite at %s", settings.sqlite_path)
        store = SqliteTenantStore(settings.sqlite_path)
    await store.open()
    try:
        if settings.dev_tenants:
            await seed_dev_tenants(store)
            log.info("tenant store: dev tenants seeded (acme, globex)")
    except BaseException:
        await store.close()
        raise
    return store
