"""The batch store's one body, on SQLite (the embedded default: tables in the ledger's file) or PostgreSQL
(production, a psycopg pool); ``sluice.stores.transactions`` runs it on either.

Race-freedom: a write of one statement (``claim``, ``renew``, ``release``) is atomic by itself, and SQLite
takes the file's write lock before the statement reads, as ``BEGIN IMMEDIATE`` would; ``claim``'s subquery
picks the oldest claimable batch ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so two runners claiming at once
take different batches (or the second finds none). A write of several statements is one ``write``
transaction whose lease check locks the batch's row on PostgreSQL (``FOR UPDATE``; SQLite's ``BEGIN
IMMEDIATE`` holds the whole file), so a claim cannot slip in between the check and the write.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from sluice.stores.batches import rules
from sluice.stores.batches.base import (
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
from sluice.stores.batches.migrations import (
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
from sluice.stores.transactions import SqlRunner, StoreSchema, Tx

# NOTE: built once from constant column and status names (never from input).
_INSERT_BATCH = (
    f"INSERT INTO batches ({', '.join(BATCH_COLUMNS)}) VALUES ({', '.join('?' * len(BATCH_COLUMNS))})"
    " ON CONFLICT (batch_id) DO NOTHING"
)
_INSERT_PART = "INSERT INTO batch_parts (batch_id, seq, owner, line_indices, num_completed, num_failed,"\
               " output_key, error_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"  # fmt: skip
_RETURNING_BATCH = f" RETURNING {', '.join(BATCH_COLUMNS)}"
_ACTIVE = ", ".join(f"'{s.value}'" for s in ACTIVE_STATUSES)
_CANCELLABLE = ", ".join(f"'{s.value}'" for s in rules.CANCELLABLE_STATUSES)
_CLAIM = (
    "UPDATE batches SET lease_owner = ?, lease_until = ? WHERE batch_id = ("
    f"SELECT batch_id FROM batches AS b WHERE status IN ({_ACTIVE})"
    " AND (lease_owner IS NULL OR lease_until <= ?)"
    " ORDER BY (SELECT count(*) FROM batches AS held WHERE held.tenant_id = b.tenant_id"
    f" AND held.status IN ({_ACTIVE}) AND held.lease_owner IS NOT NULL AND held.lease_until > ?),"
    " created_at, batch_id LIMIT 1{lock})" + _RETURNING_BATCH
)


def _batch(tx: Tx, row: Sequence[Any]) -> Batch:
    return batch_from_row(row, tx.codecs.from_db_time)


def _lease_lost(batch_id: str, owner: str) -> LeaseLost:
    return LeaseLost(f"{owner!r} does not hold the lease of batch {batch_id!r}")


async def _read_batch(tx: Tx, tenant_id: str, batch_id: str) -> Batch:
    row = await tx.fetchone(f"{SELECT_BATCH} WHERE batch_id = ? AND tenant_id = ?", (batch_id, tenant_id))
    if row is None:
        raise UnknownBatchError(batch_id)
    return _batch(tx, row)


async def _require_lease(tx: Tx, batch_id: str, owner: str) -> BatchStatus:
    """Inside the caller's ``write``: the batch's status, if ``owner`` holds its lease (on PostgreSQL its row
    locked until the transaction ends); else ``LeaseLost``."""
    sql = "SELECT status FROM batches WHERE batch_id = ? AND lease_owner = ?"
    if tx.dialect == "postgresql":
        sql += " FOR UPDATE"
    row = await tx.fetchone(sql, (batch_id, owner))
    if row is None:
        raise _lease_lost(batch_id, owner)
    return BatchStatus(row[0])


class SqlBatchStore(BatchStore):
    def __init__(self, runner: SqlRunner) -> None:
        self._db = runner

    async def open(
        self, *, keep_trying: bool = False, after_open: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """``keep_trying``: a server's start (PostgreSQL only, see ``MigratedPgPool``); ``after_open`` runs
        once it is open."""
        await self._db.open(keep_trying=keep_trying, after_open=after_open)

    async def close(self) -> None:
        await self._db.close()

    # ----- the API's side -----
    async def create(self, batch: Batch) -> None:
        rules.check_new_batch(batch)
        utc_row = batch_row(batch, rules.utc)  # a naive timestamp refused here, before any I/O

        async def insert(tx: Tx) -> None:
            to_db = tx.codecs.to_db_time
            row = [to_db(v) if isinstance(v, datetime) else v for v in utc_row]
            if await tx.execute(_INSERT_BATCH, row) == 0:
                raise ValueError(f"batch {batch.batch_id!r} exists")

        await self._db.write_one(insert)  # one statement: atomic by itself

    async def get(self, tenant_id: str, batch_id: str) -> Batch:
        async def read(tx: Tx) -> Batch:
            return await _read_batch(tx, tenant_id, batch_id)

        return await self._db.run(read)

    async def list(
        self, tenant_id: str, *, after: str | None = None, limit: int = 20
    ) -> builtins.list[Batch]:
        rules.check_limit(limit)

        async def read(tx: Tx) -> builtins.list[Batch]:
            where, params = "tenant_id = ?", [tenant_id]
            if after is not None:
                # NOTE: no snapshot needed: a batch's created_at never changes once written.
                cursor = await tx.fetchone(
                    "SELECT created_at FROM batches WHERE batch_id = ? AND tenant_id = ?", (after, tenant_id)
                )
                if cursor is None:
                    raise UnknownBatchError(after)
                where += " AND (created_at, batch_id) < (?, ?)"
                params += [cursor[0], after]
            rows = await tx.fetchall(
                f"{SELECT_BATCH} WHERE {where} ORDER BY created_at DESC, batch_id DESC LIMIT ?",
                (*params, limit),
            )
            return [_batch(tx, r) for r in rows]

        return await self._db.run(read)

    async def num_active(self, tenant_id: str) -> int:
        async def read(tx: Tx) -> int:
            row = await tx.fetchone(
                f"SELECT count(*) FROM batches WHERE tenant_id = ? AND status IN ({_ACTIVE})", (tenant_id,)
            )
            return 0 if row is None else int(row[0])

        return await self._db.run(read)

    async def request_cancel(self, tenant_id: str, batch_id: str, now: datetime) -> Batch:
        now = rules.utc(now)

        async def write(tx: Tx) -> Batch:
            row = await tx.fetchone(
                "UPDATE batches SET status = ?, cancelling_at = COALESCE(cancelling_at, ?)"
                f" WHERE batch_id = ? AND tenant_id = ? AND status IN ({_CANCELLABLE})" + _RETURNING_BATCH,
                (BatchStatus.CANCELLING.value, tx.codecs.to_db_time(now), batch_id, tenant_id),
            )
            if row is not None:
                return _batch(tx, row)
            return await _read_batch(tx, tenant_id, batch_id)  # not cancellable: as it is

        return await self._db.write(write)

    # ----- the runner's side -----
    async def claim(self, owner: str, lease_s: float, now: datetime) -> Batch | None:
        until, now = rules.lease_end(now, lease_s), rules.utc(now)

        async def update(tx: Tx) -> Batch | None:
            to_db = tx.codecs.to_db_time
            lock = " FOR UPDATE OF b SKIP LOCKED" if tx.dialect == "postgresql" else ""
            row = await tx.fetchone(_CLAIM.format(lock=lock), (owner, to_db(until), to_db(now), to_db(now)))
            return None if row is None else _batch(tx, row)

        return await self._db.write_one(update)  # one statement: see the module's docstring

    async def renew(self, batch_id: str, owner: str, lease_s: float, now: datetime) -> Batch:
        until = rules.lease_end(now, lease_s)

        async def update(tx: Tx) -> Batch:
            row = await tx.fetchone(
                "UPDATE batches SET lease_until = ? WHERE batch_id = ? AND lease_owner = ?"
                + _RETURNING_BATCH,
                (tx.codecs.to_db_time(until), batch_id, owner),
            )
            if row is None:
                raise _lease_lost(batch_id, owner)
            return _batch(tx, row)

        return await self._db.write_one(update)

    async def release(self, batch_id: str, owner: str) -> None:
        async def update(tx: Tx) -> None:
            await tx.execute(
                "UPDATE batches SET lease_owner = NULL, lease_until = NULL"
                " WHERE batch_id = ? AND lease_owner = ?",
                (batch_id, owner),
            )

        await self._db.write_one(update)

    async def commit_part(self, batch_id: str, owner: str, part: BatchPart) -> RequestCounts:
        rules.check_part(owner, part)
        row = part_row(batch_id, part)

        async def write(tx: Tx) -> RequestCounts:
            await _require_lease(tx, batch_id, owner)
            rows = await tx.fetchall(f"{SELECT_PARTS} WHERE batch_id = ?", (batch_id,))
            committed = [part_from_row(r) for r in rows]
            rules.check_next_part(part, len(committed), (p.line_indices for p in committed))
            await tx.execute(_INSERT_PART, row)
            counts = await tx.fetchone(
                "UPDATE batches SET num_completed = num_completed + ?, num_failed = num_failed + ?"
                " WHERE batch_id = ? RETURNING num_total, num_completed, num_failed",
                (part.num_completed, part.num_failed, batch_id),
            )
            assert counts is not None  # the lease check found the row (and held it)
            return RequestCounts(int(counts[0]), int(counts[1]), int(counts[2]))

        return await self._db.write(write)

    async def parts(self, batch_id: str) -> builtins.list[BatchPart]:
        async def read(tx: Tx) -> builtins.list[BatchPart]:
            rows = await tx.fetchall(f"{SELECT_PARTS} WHERE batch_id = ? ORDER BY seq", (batch_id,))
            return [part_from_row(r) for r in rows]

        return await self._db.run(read)

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

        async def write(tx: Tx) -> Batch:
            new_status = rules.advanced_status(await _require_lease(tx, batch_id, owner), status)
            sets = advance_columns(new_status, total=total, output_file_id=output_file_id,
                                   error_file_id=error_file_id, errors=errors,
                                   release=rules.releases_lease(new_status))  # fmt: skip
            assignments = [f"{column} = ?" for column in sets]
            params = list(sets.values())
            if new_status in STATUS_TIMESTAMPS:  # NOTE: set the first time only (COALESCE keeps it)
                column = STATUS_TIMESTAMPS[new_status]
                assignments.append(f"{column} = COALESCE({column}, ?)")
                params.append(tx.codecs.to_db_time(now))
            row = await tx.fetchone(
                f"UPDATE batches SET {', '.join(assignments)} WHERE batch_id = ?" + _RETURNING_BATCH,
                (*params, batch_id),
            )
            assert row is not None  # the lease check found the row (and held it)
            return _batch(tx, row)

        return await self._db.write(write)


_SCHEMA = StoreSchema("batch store", "batches", COMPONENT, MIGRATIONS, BatchStoreUnavailable)


class SqliteBatchStore(SqlBatchStore):
    """The embedded batch store: tables in the same SQLite file as the ledger."""

    def __init__(self, path: Path) -> None:
        super().__init__(_SCHEMA.sqlite(path))


class PostgresBatchStore(SqlBatchStore):
    """The production batch store: PostgreSQL through a psycopg async connection pool.

    ``acquire_timeout_s``: a short wait for a connection, as the ledger's: while the server is unreachable a
    Batch API call is a 503 with Retry-After in seconds, not after psycopg's default 30 s (with the client's
    request held all along); the runner tries again at its next renewal, flush or poll anyway."""

    def __init__(self, url: str, *, pool_max_size: int = 5, acquire_timeout_s: float = 5.0) -> None:
        super().__init__(
            _SCHEMA.postgres(url, pool_max_size=pool_max_size, acquire_timeout_s=acquire_timeout_s)
        )
