"""The embedded registry: tables in the same SQLite file as the ledger and the tenant store.

Writes are serialised by ``BEGIN IMMEDIATE`` (across processes too), so generations are handed out one
at a time. ``wait_for_change`` polls the generation every ``poll_interval_s`` (SQLite has no
notifications); a write through the same object wakes its waiters at once.
"""

from __future__ import annotations

from pathlib import Path

from sluice.stores.registry.feed import wait_for_generation
from sluice.stores.registry.store import SCHEMA, SqlRegistry


class SqliteRegistry(SqlRegistry):
    def __init__(self, path: Path, *, poll_interval_s: float = 0.2) -> None:
        super().__init__(SCHEMA.sqlite(path))
        self._poll_interval_s = poll_interval_s

    async def wait_for_change(self, after_generation: int, timeout_s: float) -> int:
        return await wait_for_generation(
            self.generation, self._signal, after_generation, timeout_s, lambda: self._poll_interval_s
        )
