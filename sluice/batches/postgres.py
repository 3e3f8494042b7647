"""The production batch store: PostgreSQL through a psycopg async connection pool.

Race-freedom: ``claim`` is one ``UPDATE`` whose subquery picks the oldest claimable batch ``FOR UPDATE SKIP
LOCKED``, so two runners claiming at once lock different rows (or the second finds none); every other
runner write locks its batch's row (``FOR UPDATE``) before checking the lease, so a claim cannot slip in
between the check and the write.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from sluice.batches import rules
from sluice.batches.base import (
    ACTIVE_STATUSES,
    STATUS_TIMESTAMPS,
    Batch,
    BatchError,
    BatchPart,
    BatchStatus,
    BatchStore,
    BatchStoreUnavailable,
    LeaseLost,
    RequestCounts,
    UnknownBatchError,
)
from sluice.batches.migrations import (
    BATCH_COLUMNS,
    COMPONENT,
    MIGRATIONS,
    SELECT_BATCH,
    SELECT_PARTS,
    advance_columns,
    batch_from_row,
    batch_row,
    part_from_row,
    part_row,
)
from sluice.db import MigratedPgPool

# NOTE: built once from constant column names (never from input), so still literal SQL.
_INSERT_BATCH = (
    f"INSERT INTO batches ({', '.join(BATCH_COLUMNS)}) VALUES ({', '.join(['%s'] * len(BATCH_COLUMNS))})"
    " ON CONFLICT (batch_id) DO NOTHING"
)
_INSERT_PART = (
    "INSERT INTO batch_parts (batch_id, seq, owner, line_indices, num_completed, num_failed, output_key,"
    " error_key) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)
_CLAIM = (
    "UPDATE batches SET lease_owner = %s, lease_until = %s WHERE batch_id = ("
    "SELECT batch_id FROM batches AS b WHERE status = ANY(%s) AND (lease_owner IS NULL OR lease_until <= %s)"
    " ORDER BY (SELECT count(*) FROM batches AS held WHERE held.tenant_id = b.tenant_id"
    " AND held.status = ANY(%s) AND held.lease_owner IS NOT NULL AND held.lease_until > %s),"
    " created_at, batch_id LIMIT 1 FOR UPDATE OF b SKIP LOCKED)"
    f" RETURNING {', '.join(BATCH_COLUMNS)}"
)
_RETURNING_BATCH = f" RETURNING {', '.join(BATCH_COLUMNS)}"
_ACTIVE = [s.value for s in ACTIVE_STATUSES]


def _from_db(ts: datetime) -> datetime:
    return ts.astimezone(UTC)


def _batch(row: Any) -> Batch:
    return batch_from_row(row, _from_db)


async def _require_lease(conn: psycopg.AsyncConnection, batch_id: str, owner: str) -> BatchStatus:
    """Inside the caller's transaction: the batch's status, its row locked until the transaction ends, if
    ``owner`` holds its lease; else ``LeaseLost``."""
    cur = await conn.execute(
        "SELECT status FROM batches WHERE batch_id = %s AND lease_owner = %s FOR UPDATE", (batch_id, owner)
    )
    row = await cur.fetchone()
    if row is None:
        raise LeaseLost(f"{owner!r} does not hold the lease of batch {batch_id!r}")
    return BatchStatus(row[0])


def _unavailable(exc: BaseException) -> BatchStoreUnavailable:
    return BatchStoreUnavailable(f"batch store (PostgreSQL) unavailable: {exc}")


class PostgresBatchStore(BatchStore):
    def __init__(self, url: str, *, pool_max_size: int = 5, acquire_timeout_s: float = 5.0) -> None:
        # NOTE: a short wait for a connection, as the ledger's: while the server is unreachable a Batch API
        # call is a 503 with Retry-After in seconds, not after psycopg's default 30 s (with the client's
        # request held all along); the runner tries again at its next renewal, flush or poll anyway.
        self._db = MigratedPgPool(
            url,
            max_size=pool_max_size,
            name="batches",
            component=COMPONENT,
            migrations=MIGRATIONS,
            acquire_timeout_s=acquire_timeout_s,
        )

    @property
    def pool(self) -> AsyncConnectionPool:
        return self._db.pool

    async def open(
        self, *, keep_trying: bool = False, after_open: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """``keep_trying``: a server's start, see ``MigratedPgPool``; ``after_open`` runs once it is open."""
        await self._db.open_or(_unavailable, keep_trying=keep_trying, after_open=after_open)

    def _connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection]:
        """A pooled connection; the server or network failing, here or in the caller's block, raises
        ``BatchStoreUnavailable`` (the driver's types stay inside this backend)."""
        return self._db.connection_or(_unavailable)

    async def close(self) -> None:
        await self._db.close()

    # ----- the API's side -----
    async def create(self, batch: Batch) -> None:
        rules.check_new_batch(batch)
        async with self._connection() as conn:
            cur = await conn.execute(_INSERT_BATCH, batch_row(batch, rules.utc))
            if cur.rowcount == 0:
                raise ValueError(f"batch {batch.batch_id!r} exists")

    async def get(self, tenant_id: str, batch_id: str) -> Batch:
        async with self._connection() as conn:
            cur = await conn.execute(
                f"{SELECT_BATCH} WHERE batch_id = %s AND tenant_id = %s", (batch_id, tenant_id)
            )
            row = await cur.fetchone()
        if row is None:
            raise UnknownBatchError(batch_id)
        return _batch(row)

    async def list(
        self, tenant_id: str, *, after: str | None = None, limit: int = 20
    ) -> builtins.list[Batch]:
        rules.check_limit(limit)
        async with self._connection() as conn:
            if after is None:
                cur = await conn.execute(
                    f"{SELECT_BATCH} WHERE tenant_id = %s ORDER BY created_at DESC, batch_id DESC LIMIT %s",
                    (tenant_id, limit),
                )
            else:
                cur = await conn.execute(
                    f"{SELECT_BATCH} WHERE tenant_id = %s AND (created_at, batch_id) <"
                    " (SELECT created_at, batch_id FROM batches WHERE batch_id = %s AND tenant_id = %s)"
                    " ORDER BY created_at DESC, batch_id DESC LIMIT %s",
                    (tenant_id, after, tenant_id, limit),
                )
            rows = await cur.fetchall()
            if after is not None and not rows:  # an empty page, or a cursor that is not the tenant's
                cur = await conn.execute(
                    "SELECT 1 FROM batches WHERE batch_id = %s AND tenant_id = %s", (after, tenant_id)
                )
                if await cur.fetchone() is None:
                    raise UnknownBatchError(after)
        return [_batch(r) for r in rows]

    async def num_active(self, tenant_id: str) -> int:
        async with self._connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM batches WHERE tenant_id = %s AND status = ANY(%s)", (tenant_id, _ACTIVE)
            )
            row = await cur.fetchone()
        return 0 if row is None else int(row[0])

    async def request_cancel(self, tenant_id: str, batch_id: str, now: datetime) -> Batch:
        async with self._connection() as conn:
            cur = await conn.execute(
                "UPDATE batches SET status = %s, cancelling_at = COALESCE(cancelling_at, %s)"
                " WHERE batch_id = %s AND tenant_id = %s AND status = ANY(%s)" + _RETURNING_BATCH,
                (BatchStatus.CANCELLING.value, rules.utc(now), batch_id, tenant_id,
                 [s.value for s in rules.CANCELLABLE_STATUSES]),
            )  # fmt: skip
            row = await cur.fetchone()
        if row is not None:
            return _batch(row)
        return await self.get(tenant_id, batch_id)  # not cancellable: as it is

    # ----- the runner's side -----
    async def claim(self, owner: str, lease_s: float, now: datetime) -> Batch | None:
        until = rules.lease_end(now, lease_s)
        async with self._connection() as conn:
            now_utc = rules.utc(now)
            cur = await conn.execute(_CLAIM, (owner, until, _ACTIVE, now_utc, _ACTIVE, now_utc))
            row = await cur.fetchone()
        return None if row is None else _batch(row)

    async def renew(self, batch_id: str, owner: str, lease_s: float, now: datetime) -> Batch:
        until = rules.lease_end(now, lease_s)
        async with self._connection() as conn:
            cur = await conn.execute(
                "UPDATE batches SET lease_until = %s WHERE batch_id = %s AND lease_owner = %s"
                + _RETURNING_BATCH,
                (until, batch_id, owner),
            )
            row = await cur.fetchone()
        if row is None:
            raise LeaseLost(f"{owner!r} does not hold the lease of batch {batch_id!r}")
        return _batch(row)

    async def release(self, batch_id: str, owner: str) -> None:
        async with self._connection() as conn:
            await conn.execute(
                "UPDATE batches SET lease_owner = NULL, lease_until = NULL"
                " WHERE batch_id = %s AND lease_owner = %s",
                (batch_id, owner),
            )

    async def commit_part(self, batch_id: str, owner: str, part: BatchPart) -> RequestCounts:
        rules.check_part(owner, part)
        async with self._connection() as conn, conn.transaction():
            await _require_lease(conn, batch_id, owner)
            cur = await conn.execute(f"{SELECT_PARTS} WHERE batch_id = %s", (batch_id,))
            committed = [part_from_row(r) for r in await cur.fetchall()]
            rules.check_next_part(part, len(committed), (p.line_indices for p in committed))
            await conn.execute(_INSERT_PART, part_row(batch_id, part))
            cur = await conn.execute(
                "UPDATE batches SET num_completed = num_completed + %s, num_failed = num_failed + %s"
                " WHERE batch_id = %s RETURNING num_total, num_completed, num_failed",
                (part.num_completed, part.num_failed, batch_id),
            )
            row = await cur.fetchone()
        assert row is not None  # the row is locked by _require_lease
        return RequestCounts(int(row[0]), int(row[1]), int(row[2]))

    async def parts(self, batch_id: str) -> builtins.list[BatchPart]:
        async with self._connection() as conn:
            cur = await conn.execute(f"{SELECT_PARTS} WHERE batch_id = %s ORDER BY seq", (batch_id,))
            rows = await cur.fetchall()
        return [part_from_row(r) for r in rows]

    async def advance(
        self,
        batch_id: str,
        owner: str,
        status: BatchStatus,
        now: datetime,
        *,
        total: int | None = None,
        output_file_id: str | None = None,
        error_file_id: str | None = None,
        errors: tuple[BatchError, ...] = (),
    ) -> Batch:
        if total is not None and total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        now = rules.utc(now)
        async with self._connection() as conn, conn.transaction():
            new_status = rules.advanced_status(await _require_lease(conn, batch_id, owner), status)
            columns = advance_columns(new_status, total=total, output_file_id=output_file_id,
                                      error_file_id=error_file_id, errors=errors,
                                      release=rules.releases_lease(new_status))  # fmt: skip
            assignments = [sql.SQL("{} = %s").format(sql.Identifier(c)) for c in columns]
            params: list[Any] = list(columns.values())
            if new_status in STATUS_TIMESTAMPS:  # NOTE: set the first time only (COALESCE keeps it)
                column = sql.Identifier(STATUS_TIMESTAMPS[new_status])
                assignments.append(sql.SQL("{} = COALESCE({}, %s)").format(column, column))
                params.append(now)
            query = sql.SQL("UPDATE batches SET {} WHERE batch_id = %s" + _RETURNING_BATCH).format(
                sql.SQL(", ").join(assignments)
            )
            cur = await conn.execute(query, (*params, batch_id))
            row = await cur.fetchone()
        assert row is not None  # the row is locked by _require_lease
        return _batch(row)
