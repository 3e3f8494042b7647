"""The batch store the settings choose: PostgreSQL at ``database_url`` when set, else the SQLite file the
ledger uses (``settings.sqlite_path``). The choice is logged by ``sluice.storage.open_backend``, as for
every store family."""

from __future__ import annotations

from pathlib import Path

from sluice.batches.base import BatchStore
from sluice.settings import Settings
from sluice.storage import open_backend


async def open_batch_store(settings: Settings, *, keep_trying: bool = False) -> BatchStore:
    """An opened (migrated) batch store, or with ``keep_trying`` one opening in the background (until then
    it raises ``BatchStoreUnavailable``); the caller closes it. An unreachable PostgreSQL without
    ``keep_trying`` raises ``BatchStoreUnavailable`` here."""

    def postgres(url: str) -> BatchStore:
        from sluice.batches.store import PostgresBatchStore

        return PostgresBatchStore(url, pool_max_size=settings.database_pool_max_size)

    def sqlite(path: Path) -> BatchStore:
        from sluice.batches.store import SqliteBatchStore

        return SqliteBatchStore(path)

    return await open_backend(settings, "batch store", postgres, sqlite, keep_trying=keep_trying)
