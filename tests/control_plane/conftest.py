"""Fixtures for the control plane's tests: the admin token store's backends (SQLite, and the real
PostgreSQL in a database made for this run with a fresh schema per test), and a clean environment.

The PostgreSQL params skip, saying why, only when the server cannot be reached (and fail then with
``CI=true``), as in tests/core.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from admin_backends import AdminBackend, postgres_backend, sqlite_backend
from pg import PostgresUnreachable, created_database
from psycopg import sql
from services import service_missing

from sluice.settings import get_settings


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """No SLUICE_* variable from the caller's shell; state under tmp_path (returned); no dev tenants
    unless a test turns them on; get_settings() reads afresh."""
    for name in list(os.environ):
        if name.upper().startswith("SLUICE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SLUICE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SLUICE_DEV_TENANTS", "false")
    get_settings.cache_clear()
    yield tmp_path / "state"
    get_settings.cache_clear()


_PG_UNREACHABLE: list[str] = []  # why the PostgreSQL params skip (or fail), when they do


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str | None]:
    """A database created for this run (URL), dropped at its end; None with the reason recorded."""
    try:
        with created_database("sluice_cp_test") as url:
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
def admin_backend(request: pytest.FixtureRequest, tmp_path: Path) -> AdminBackend:
    if request.param == "sqlite":
        return sqlite_backend(tmp_path)
    return postgres_backend(request.getfixturevalue("pg_schema_url"))
