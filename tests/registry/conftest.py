"""Fixtures of the registry's contract suite: every test runs on SQLite and on the real PostgreSQL.

PostgreSQL: one database per test session (``sluice_test_<hex>``, created here and dropped at the end)
and one schema per test inside it, reached through ``search_path``, so each test starts empty. The
PostgreSQL params skip, saying why, only when the server cannot be reached (and fail then with
``CI=true``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from pg import PostgresUnreachable, created_database
from psycopg import sql
from registry_backends import RegistryBackend, postgres_backend, sqlite_backend
from services import service_missing

from sluice.stores.registry.base import Registry


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


_PG_UNREACHABLE: list[str] = []


@pytest.fixture(scope="session")
def registry_pg_database() -> Iterator[str | None]:
    """A database created for this run (URL), or None with the reason in ``_PG_UNREACHABLE``."""
    try:
        with created_database("sluice_test_registry") as url:
            yield url
    except PostgresUnreachable as exc:
        _PG_UNREACHABLE.append(str(exc))
        yield None


@pytest.fixture
def pg_url(registry_pg_database: str | None) -> str:
    """A URL whose connections see only a fresh, empty schema of the run's database."""
    if registry_pg_database is None:
        service_missing(_PG_UNREACHABLE[0])
    schema = f"r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(registry_pg_database, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    return f"{registry_pg_database}?options={quote(f'-c search_path={schema}')}"


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> RegistryBackend:
    if request.param == "sqlite":
        return sqlite_backend(tmp_path)
    return postgres_backend(request.getfixturevalue("pg_url"))


@pytest.fixture
async def registry(backend: RegistryBackend) -> AsyncIterator[Registry]:
    async with backend.opened() as registry:
        yield registry
