"""The embedded admin token store: a table in the same SQLite file as the tenant store and the ledger."""

from __future__ import annotations

import builtins
import hmac
import sqlite3
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sluice.admin_tokens.base import (
    AdminPrincipal,
    AdminToken,
    AdminTokenExistsError,
    AdminTokenStore,
    AdminTokenStoreUnavailable,
    Role,
    UnknownAdminTokenError,
    check_new_token,
    hash_token,
    is_admin_token_format,
    new_admin_token,
    token_prefix,
)
from sluice.admin_tokens.migrations import COMPONENT, LIST_COLUMNS, MIGRATIONS
from sluice.db import SqliteDb, apply_sqlite_migrations, transaction

T = TypeVar("T")


def _unavailable(exc: BaseException) -> AdminTokenStoreUnavailable:
    return AdminTokenStoreUnavailable(f"admin token store (SQLite) unavailable: {exc}")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _token_from_row(row: Sequence[Any]) -> AdminToken:
    name, role, prefix, created_at, last_used_at, revoked_at = row
    return AdminToken(
        name=name,
        role=Role(role),
        token_prefix=prefix,
        created_at=datetime.fromisoformat(created_at),
        last_used_at=_time(last_used_at),
        revoked_at=_time(revoked_at),
    )


def _insert(conn: sqlite3.Connection, name: str, role: Role, token: str) -> None:
    """Inside the caller's transaction (BEGIN IMMEDIATE: nothing can slip in between check and insert)."""
    digest = hash_token(token)
    if conn.execute("SELECT 1 FROM admin_tokens WHERE token_sha256 = ?", (digest,)).fetchone():
        raise AdminTokenExistsError("this admin token is registered already")
    active = "SELECT 1 FROM admin_tokens WHERE name = ? AND revoked_at IS NULL"
    if conn.execute(active, (name,)).fetchone():
        raise AdminTokenExistsError(name)
    conn.execute(
        "INSERT INTO admin_tokens (token_sha256, token_prefix, name, role, created_at)"
        " VALUES (?, ?, ?, ?, ?)",
        (digest, token_prefix(token), name, str(role), _now()),
    )


class SqliteAdminTokenStore(AdminTokenStore):
    def __init__(self, path: Path) -> None:
        self._db = SqliteDb(path)

    async def open(self) -> None:
        await self._db.open_or(_unavailable)
        await self._run(lambda conn: apply_sqlite_migrations(conn, COMPONENT, MIGRATIONS))

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` on the connection's thread; a file that cannot be used now raises
        ``AdminTokenStoreUnavailable`` (the driver's types stay inside this backend)."""
        return await self._db.run_or(_unavailable, fn)

    async def close(self) -> None:
        await self._db.close()

    async def ping(self) -> None:
        await self._run(lambda conn: conn.execute("SELECT count(*) FROM admin_tokens").fetchone())

    async def create(self, name: str, role: Role | str, *, token: str | None = None) -> str:
        token = new_admin_token() if token is None else token
        checked_role = check_new_token(name, role, token)
        await self._run(lambda conn: transaction(conn, lambda c: _insert(c, name, checked_role, token)))
        return token

    async def list(self) -> builtins.list[AdminToken]:
        rows = await self._run(
            lambda conn: conn.execute(
                f"SELECT {LIST_COLUMNS} FROM admin_tokens ORDER BY name, created_at"
            ).fetchall()
        )
        return [_token_from_row(r) for r in rows]

    async def revoke(self, name: str) -> AdminToken:
        rows = await self._run(
            lambda conn: conn.execute(
                f"UPDATE admin_tokens SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL"
                f" RETURNING {LIST_COLUMNS}",
                (_now(), name),
            ).fetchall()
        )
        if not rows:
            raise UnknownAdminTokenError(name)
        return _token_from_row(rows[0])

    async def resolve(self, token: str, *, record_use: bool = True) -> AdminPrincipal | None:
        if not is_admin_token_format(token):
            return None
        digest = hash_token(token)

        def read(conn: sqlite3.Connection) -> list[Any]:
            if record_use:
                return conn.execute(
                    "UPDATE admin_tokens SET last_used_at = ? WHERE token_sha256 = ? AND revoked_at IS NULL"
                    " RETURNING token_sha256, name, role",
                    (_now(), digest),
                ).fetchall()
            return conn.execute(
                "SELECT token_sha256, name, role FROM admin_tokens"
                " WHERE token_sha256 = ? AND revoked_at IS NULL",
                (digest,),
            ).fetchall()

        rows = await self._run(read)
        if not rows or not hmac.compare_digest(rows[0][0], digest):
            return None
        return AdminPrincipal(name=rows[0][1], role=Role(rows[0][2]))
