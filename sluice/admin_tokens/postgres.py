"""The production admin token store: PostgreSQL through a psycopg async connection pool."""

from __future__ import annotations

import builtins
import hmac
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

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
from sluice.db import MigratedPgPool


def _unavailable(exc: BaseException) -> AdminTokenStoreUnavailable:
    return AdminTokenStoreUnavailable(f"admin token store (PostgreSQL) unavailable: {exc}")


def _token_from_row(row: Sequence[Any]) -> AdminToken:
    name, role, prefix, created_at, last_used_at, revoked_at = row
    return AdminToken(name, Role(role), prefix, created_at, last_used_at, revoked_at)


class PostgresAdminTokenStore(AdminTokenStore):
    def __init__(self, url: str, *, pool_max_size: int = 2, acquire_timeout_s: float = 5.0) -> None:
        """Admin calls are few: a small pool of its own, beside the tenant store's and the ledger's. A call
        that waits ``acquire_timeout_s`` for a connection fails as unavailable (an operator or a probe
        learns of an outage in seconds, not after the pool's usual 30)."""
        self._db = MigratedPgPool(
            url,
            max_size=pool_max_size,
            name="admin_tokens",
            component=COMPONENT,
            migrations=MIGRATIONS,
            acquire_timeout_s=acquire_timeout_s,
        )

    async def open(
        self, *, keep_trying: bool = False, after_open: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """``keep_trying``: a server's start, see ``MigratedPgPool``; ``after_open`` runs once it is open."""
        await self._db.open_or(_unavailable, keep_trying=keep_trying, after_open=after_open)

    def _connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection]:
        """A pooled connection; the server or network failing, here or in the caller's block, raises
        ``AdminTokenStoreUnavailable`` (the driver's types stay inside this backend)."""
        return self._db.connection_or(_unavailable)

    async def close(self) -> None:
        await self._db.close()

    async def ping(self) -> None:
        async with self._connection() as conn:
            await conn.execute("SELECT count(*) FROM admin_tokens")

    async def create(self, name: str, role: Role | str, *, token: str | None = None) -> str:
        token = new_admin_token() if token is None else token
        checked_role = check_new_token(name, role, token)
        digest = hash_token(token)
        async with self._connection() as conn, conn.transaction():
            # Both unique constraints (the hash, the active name) end in DO NOTHING: no exception to
            # unwind, and concurrent creates of one name leave exactly one row.
            cur = await conn.execute(
                "INSERT INTO admin_tokens (token_sha256, token_prefix, name, role, created_at)"
                " VALUES (%s, %s, %s, %s, now()) ON CONFLICT DO NOTHING",
                (digest, token_prefix(token), name, str(checked_role)),
            )
            if cur.rowcount == 1:
                return token
            cur = await conn.execute("SELECT 1 FROM admin_tokens WHERE token_sha256 = %s", (digest,))
            if await cur.fetchone() is not None:
                raise AdminTokenExistsError("this admin token is registered already")
        raise AdminTokenExistsError(name)

    async def list(self) -> builtins.list[AdminToken]:
        async with self._connection() as conn:
            cur = await conn.execute(f"SELECT {LIST_COLUMNS} FROM admin_tokens ORDER BY name, created_at")
            rows = await cur.fetchall()
        return [_token_from_row(r) for r in rows]

    async def revoke(self, name: str) -> AdminToken:
        async with self._connection() as conn:
            cur = await conn.execute(
                "UPDATE admin_tokens SET revoked_at = now() WHERE name = %s AND revoked_at IS NULL"
                f" RETURNING {LIST_COLUMNS}",
                (name,),
            )
            row = await cur.fetchone()
        if row is None:
            raise UnknownAdminTokenError(name)
        return _token_from_row(row)

    async def resolve(self, token: str, *, record_use: bool = True) -> AdminPrincipal | None:
        if not is_admin_token_format(token):
            return None
        digest = hash_token(token)
        async with self._connection() as conn:
            if record_use:
                cur = await conn.execute(
                    "UPDATE admin_tokens SET last_used_at = now()"
                    " WHERE token_sha256 = %s AND revoked_at IS NULL RETURNING token_sha256, name, role",
                    (digest,),
                )
            else:
                cur = await conn.execute(
                    "SELECT token_sha256, name, role FROM admin_tokens"
                    " WHERE token_sha256 = %s AND revoked_at IS NULL",
                    (digest,),
                )
            row = await cur.fetchone()
        if row is None or not hmac.compare_digest(row[0], digest):
            return None
        return AdminPrincipal(name=row[1], role=Role(row[2]))
