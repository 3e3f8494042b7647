"""Storage backends for the contract suites: every test runs on SQLite and on the real PostgreSQL.

PostgreSQL: one database per test session (``sluice_test_<hex>``, created here and dropped at the end)
and one schema per test inside it, reached through ``search_path``, so each test starts empty. The
PostgreSQL params skip, saying why, only when the server cannot be reached (and fail then with
``CI=true``). The server is ``TEST_POSTGRES_ADMIN_URL`` (default: postgres on 127.0.0.1:5432, trust auth).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from pg import PostgresUnreachable, created_database
from psycopg import sql
from redis_run import delete_run_keys, unreachable_reason
from services import service_missing
from storage_backends import Backend, postgres_backend, sqlite_backend


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


_PG_UNREACHABLE: list[str] = []  # why the PostgreSQL params skip (or fail), when they do


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str | None]:
    """A database created for this run (URL), or None with the reason in ``_PG_UNREACHABLE``."""
    try:
        with created_database() as url:
            yield url
    except PostgresUnreachable as exc:
        _PG_UNREACHABLE.append(str(exc))
        yield None


@pytest.fixture
def pg_schema_url(pg_database: str | None) -> str:
    """A URL whose connections see only a fresh, empty schema of the run's database."""
    if pg_database is None:
        service_missing(_PG_UNREACHABLE[0])
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    return f"{pg_database}?options={quote(f'-c search_path={schema}')}"


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return sqlite_backend(tmp_path)
    return postgres_backend(request.getfixturevalue("pg_schema_url"))


@pytest.fixture(scope="session")
def redis_up() -> Iterator[str | None]:
    """None if Redis answers (and this run's keys are deleted at the end), else why not."""
    reason = unreachable_reason()
    try:
        yield reason
    finally:
        if reason is None:
            delete_run_keys()
