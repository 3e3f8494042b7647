"""Which registry backend runs, chosen once from settings: PostgreSQL when ``database_url`` is set, else
the SQLite file ``settings.sqlite_path`` (the ledger's and the tenant store's file). The choice is logged,
never made by silent fallback."""

from __future__ import annotations

import logging

from sluice.db import describe_pg_url
from sluice.registry.base import Registry
from sluice.settings import Settings

log = logging.getLogger(__name__)


async def open_registry(settings: Settings, *, keep_trying: bool = False) -> Registry:
    """An opened (migrated) registry; the caller closes it. ``keep_trying`` (a server's start): an
    unreachable PostgreSQL does not fail here, the registry opens in the background and raises
    ``RegistryUnavailable`` until then (``sluice.db.MigratedPgPool``); without it, it fails at once."""
    if settings.database_url is not None:
        from sluice.registry.postgres import PostgresRegistry

        log.info("model registry: PostgreSQL at %s", describe_pg_url(settings.database_url))
        pg_registry = PostgresRegistry(settings.database_url, pool_max_size=settings.database_pool_max_size)
        await pg_registry.open(keep_trying=keep_trying)
        return pg_registry
    from sluice.registry.sqlite import SqliteRegistry

    log.info("model registry: SQLite at %s", settings.sqlite_path)
    registry = SqliteRegistry(settings.sqlite_path)
    await registry.open()
    return registry
