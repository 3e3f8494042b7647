"""The admin token store's one body, on SQLite (a table in ``<state_dir>/sluice.db``, beside the tenant store
and the ledger) or PostgreSQL (production, a small psycopg pool of its own); ``sluice.stores.transactions``
runs it on either."""

from __future__ import annotations

import builtins
import hmac
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from sluice.stores.admin_tokens.base import (
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
from sluice.stores.admin_tokens.migrations import COMPONENT, LIST_COLUMNS, MIGRATIONS
from sluice.stores.transactions import Codecs, Row, SqlRunner, StoreSchema, Tx


def _token_from_row(row: Row, codecs: Codecs) -> AdminToken:
    name, role, prefix, created_at, last_used_at, revoked_at = row
    from_db = codecs.from_db_time
    return AdminToken(
        name=name,
        role=Role(role),
        token_prefix=prefix,
        created_at=from_db(created_at),
        last_used_at=None if last_used_at is None else from_db(last_used_at),
        revoked_at=None if revoked_at is None else from_db(revoked_at),
    )


def _now(tx: Tx) -> object:
    return tx.codecs.to_db_time(datetime.now(UTC))


class SqlAdminTokenStore(AdminTokenStore):
    def __init__(self, runner: SqlRunner) -> None:
        self._db = runner

    async def open(
        self, *, keep_trying: bool = False, after_open: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """``keep_trying``: a server's start (PostgreSQL only, see ``sluice.stores.db.MigratedPgPool``);
        ``after_open`` runs once it is open."""
        await self._db.open(keep_trying=keep_trying, after_open=after_open)

    async def close(self) -> None:
        await self._db.close()

    async def ping(self) -> None:
        async def count(tx: Tx) -> None:
            await tx.fetchone("SELECT count(*) FROM admin_tokens")

        await self._db.run(count)

    async def create(self, name: str, role: Role | str, *, token: str | None = None) -> str:
        token = new_admin_token() if token is None else token
        checked_role = check_new_token(name, role, token)
        digest = hash_token(token)

        async def insert(tx: Tx) -> None:
            # Both unique constraints (the hash, the active name) end in DO NOTHING: no exception to
            # unwind, and concurrent creates of one name leave exactly one row.
            inserted = await tx.execute(
                "INSERT INTO admin_tokens (token_sha256, token_prefix, name, role, created_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (digest, token_prefix(token), name, str(checked_role), _now(tx)),
            )
            if inserted == 1:
                return
            taken = await tx.fetchone("SELECT 1 FROM admin_tokens WHERE token_sha256 = ?", (digest,))
            if taken is not None:
                raise AdminTokenExistsError("this admin token is registered already")
            raise AdminTokenExistsError(name)

        await self._db.write(insert)
        return token

    async def list(self) -> builtins.list[AdminToken]:
        async def read(tx: Tx) -> builtins.list[AdminToken]:
            rows = await tx.fetchall(f"SELECT {LIST_COLUMNS} FROM admin_tokens ORDER BY name, created_at")
            return [_token_from_row(r, tx.codecs) for r in rows]

        return await self._db.run(read)  # one statement: one snapshot by itself

    async def revoke(self, name: str) -> AdminToken:
        async def update(tx: Tx) -> AdminToken | None:
            # NOTE: fetchall, here and in ``resolve``: SQLite ends an UPDATE ... RETURNING (and, outside a
            # transaction, commits it) only once its rows are read to the end.
            rows = await tx.fetchall(
                "UPDATE admin_tokens SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL"
                f" RETURNING {LIST_COLUMNS}",
                (_now(tx), name),
            )
            return _token_from_row(rows[0], tx.codecs) if rows else None

        revoked = await self._db.write_one(update)  # one statement: atomic by itself
        if revoked is None:
            raise UnknownAdminTokenError(name)
        return revoked

    async def resolve(self, token: str, *, record_use: bool = True) -> AdminPrincipal | None:
        if not is_admin_token_format(token):
            return None
        digest = hash_token(token)

        async def look_up(tx: Tx) -> builtins.list[Row]:
            if record_use:
                return await tx.fetchall(
                    "UPDATE admin_tokens SET last_used_at = ? WHERE token_sha256 = ? AND revoked_at IS NULL"
                    " RETURNING token_sha256, name, role",
                    (_now(tx), digest),
                )
            return await tx.fetchall(
                "SELECT token_sha256, name, role FROM admin_tokens"
                " WHERE token_sha256 = ? AND revoked_at IS NULL",
                (digest,),
            )

        rows = await self._db.run(look_up)  # one statement either way
        if not rows or not hmac.compare_digest(rows[0][0], digest):
            return None
        return AdminPrincipal(name=rows[0][1], role=Role(rows[0][2]))


_SCHEMA = StoreSchema("admin token store", "admin_tokens", COMPONENT, MIGRATIONS, AdminTokenStoreUnavailable)


class SqliteAdminTokenStore(SqlAdminTokenStore):
    """The embedded store: a table in the same SQLite file as the tenant store and the ledger."""

    def __init__(self, path: Path) -> None:
        super().__init__(_SCHEMA.sqlite(path))


class PostgresAdminTokenStore(SqlAdminTokenStore):
    """The production store: PostgreSQL through a psycopg async connection pool."""

    def __init__(self, url: str, *, pool_max_size: int = 2, acquire_timeout_s: float = 5.0) -> None:
        """Admin calls are few: a small pool of its own, beside the tenant store's and the ledger's. A call
        that waits ``acquire_timeout_s`` for a connection fails as unavailable (an operator or a probe
        learns of an outage in seconds, not after the pool's usual 30)."""
        super().__init__(
            _SCHEMA.postgres(url, pool_max_size=pool_max_size, acquire_timeout_s=acquire_timeout_s)
        )
