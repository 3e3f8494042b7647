"""A PostgreSQL database made for a test and dropped after it, on the server this machine runs
(``TEST_POSTGRES_ADMIN_URL``, default the local trust-auth server). Never touches other databases. With
``CI=true`` an unreachable server fails the test here (``services``); else ``PostgresUnreachable`` says
why, and the test skips."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from services import fail_if_required

ADMIN_URL = os.environ.get("TEST_POSTGRES_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


class PostgresUnreachable(RuntimeError):
    pass


@contextmanager
def created_database(prefix: str = "sluice_test") -> Iterator[str]:
    """The URL of a new database; dropped (forcefully) on exit. ``PostgresUnreachable`` if no server
    (a test failure instead with ``CI=true``)."""
    try:
        admin = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        reason = f"PostgreSQL at {ADMIN_URL} unreachable: {' '.join(str(exc).split())}"
        fail_if_required(reason)
        raise PostgresUnreachable(reason) from None
    dbname = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        try:
            yield f"{ADMIN_URL.rpartition('/')[0]}/{dbname}"
        finally:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


def through_proxy(url: str, port: int) -> str:
    """``url`` (a database's, on the server) reached through a proxy on 127.0.0.1:``port`` instead."""
    server, _, dbname = url.rpartition("/")
    return f"{server.rpartition('@')[0]}@127.0.0.1:{port}/{dbname}"
