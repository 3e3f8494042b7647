"""The backends the registry's contract suite runs over (fixtures in conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.stores.registry.base import Registry
from sluice.stores.registry.postgres import PostgresRegistry
from sluice.stores.registry.sqlite import SqliteRegistry


@dataclass
class RegistryBackend:
    """Fresh registry objects on one database (empty at start). ``make(**options)`` passes backend options
    through (PostgreSQL's listen and poll intervals); ``database_url`` is None for SQLite."""

    name: str
    make: Callable[..., Registry]
    database_url: str | None

    @asynccontextmanager
    async def opened(self, **options: Any) -> AsyncIterator[Registry]:
        registry = self.make(**options)
        await registry.open()
        try:
            yield registry
        finally:
            await registry.close()


def sqlite_backend(tmp_path: Path) -> RegistryBackend:
    path = tmp_path / "sluice.db"
    return RegistryBackend("sqlite", lambda **options: SqliteRegistry(path, **options), None)


def postgres_backend(url: str) -> RegistryBackend:
    return RegistryBackend(
        "postgres", lambda **options: PostgresRegistry(url, **{"pool_max_size": 3, **options}), url
    )
