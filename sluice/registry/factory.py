"""Which registry backend runs, chosen once from settings: PostgreSQL when ``database_url`` is set, else
the SQLite file ``settings.sqlite_path`` (the ledger's and the tenant store's file). The choice is logged,
never made by silent fallback."""

from __future__ import annotations

from pathlib import Path

from sluice.registry.base import Registry
from sluice.settings import Settings
from sluice.storage import open_backend


async def open_registry(settings: Settings, *, keep_trying: bool = False) -> Registry:
    """An opened (migrated) registry; the caller closes it. ``keep_trying`` (a server's start): an
    unreachable PostgreSQL does not fail here, the registry opens in the background and raises
    ``RegistryUnavailable`` until then (``sluice.db.MigratedPgPool``); without it, it fails at once."""

    def postgres(url: str) -> Registry:
        from sluice.registry.postgres import PostgresRegistry

        return PostgresRegistry(url, pool_max_size=settings.database_pool_max_size)

    def sqlite(path: Path) -> Registry:
        from sluice.registry.sqlite import SqliteRegistry

        return SqliteRegistry(path)

    return await open_backend(settings, "model registry", postgres, sqlite, keep_trying=keep_trying)
