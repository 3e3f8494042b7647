"""The embedded batch store: tables in the same SQLite file as the ledger.

Every write is one ``BEGIN IMMEDIATE`` transaction (``sluice.db.transaction``): it takes the file's write
lock before reading, so two runners (two processes on one file) claiming at once are serialised and never
take one batch both.
"""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

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
from sluice.db import SqliteDb, apply_sqlite_migrations, transaction

_INSERT_BATCH = (
    f"INSERT INTO batches ({', '.join(BATCH_COLUMNS)}) VALUES ({', '.join('?' * len(BATCH_COLUMNS))})"
)
_INSERT_PART = "INSERT INTO batch_parts (batch_id, seq, owner, line_indices, num_completed, num_failed,"\
               " output_key, error_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"  # fmt: skip
_ACTIVE = ", ".join(f"'{s.value}'" for s in ACTIVE_STATUSES)
T = TypeVar("T")


def to_text(ts: datetime) -> str:
    """A UTC timestamp as text that sorts as the instants do (fixed width, microseconds)."""
    return rules.utc(ts).isoformat(timespec="microseconds")


def _unavailable(exc: BaseException) -> BatchStoreUnavailable:
    return BatchStoreUnavailable(f"batch store (SQLite) unavailable: {exc}")


def _read_batch(conn: sqlite3.Connection, batch_id: str) -> Batch:
    row = conn.execute(f"{SELECT_BATCH} WHERE batch_id = ?", (batch_id,)).fetchone()
    if row is None:
        raise UnknownBatchError(batch_id)
    return batch_from_row(row, datetime.fromisoformat)


def _require_lease(conn: sqlite3.Connection, batch_id: str, owner: str) -> BatchStatus:
    """The batch's status, if ``owner`` holds its lease; else ``LeaseLost``."""
    row = conn.execute(
        "SELECT status FROM batches WHERE batch_id = ? AND lease_owner = ?", (batch_id, owner)
    ).fetchone()
    if row is None:
        raise LeaseLost(f"{owner!r} does not hold the lease of batch {batch_id!r}")
    return BatchStatus(row[0])


class SqliteBatchStore(BatchStore):
    def __init__(self, path: Path) -> None:
        self._db = SqliteDb(path)

    async def open(self) -> None:
        await self._db.open_or(_unavailable)
        await self._run(lambda conn: apply_sqlite_migrations(conn, COMPONENT, MIGRATIONS))

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` on the connection's thread; a file that cannot be used now raises
        ``BatchStoreUnavailable`` (the driver's types stay inside this backend)."""
        return await self._db.run_or(_unavailable, fn)

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` in one ``BEGIN IMMEDIATE`` transaction."""
        return await self._run(lambda conn: transaction(conn, fn))

    async def close(self) -> None:
        await self._db.close()

    # ----- the API's side -----
    async def create(self, batch: Batch) -> None:
        rules.check_new_batch(batch)
        row = batch_row(batch, to_text)

        def write(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(_INSERT_BATCH, row)
            except sqlite3.IntegrityError:
                raise ValueError(f"batch {batch.batch_id!r} exists") from None

        await self._write(write)

    async def get(self, tenant_id: str, batch_id: str) -> Batch:
        batch = await self._run(lambda conn: _read_batch(conn, batch_id))
        if batch.tenant_id != tenant_id:
            raise UnknownBatchError(batch_id)
        return batch

    async def list(
        self, tenant_id: str, *, after: str | None = None, limit: int = 20
    ) -> builtins.list[Batch]:
        rules.check_limit(limit)

        def read(conn: sqlite3.Connection) -> builtins.list[Batch]:
            where, params = "tenant_id = ?", [tenant_id]
            if after is not None:
                cursor = conn.execute(
                    "SELECT created_at FROM batches WHERE batch_id = ? AND tenant_id = ?", (after, tenant_id)
                ).fetchone()
                if cursor is None:
                    raise UnknownBatchError(after)
                where += " AND (created_at, batch_id) < (?, ?)"
                params += [cursor[0], after]
            rows = conn.execute(
                f"{SELECT_BATCH} WHERE {where} ORDER BY created_at DESC, batch_id DESC LIMIT ?",
                (*params, limit),
            ).fetchall()
            return [batch_from_row(r, datetime.fromisoformat) for r in rows]

        return await self._run(read)

    async def num_active(self, tenant_id: str) -> int:
        row = await self._run(
            lambda conn: conn.execute(
                f"SELECT count(*) FROM batches WHERE tenant_id = ? AND status IN ({_ACTIVE})", (tenant_id,)
            ).fetchone()
        )
        return int(row[0])

    async def request_cancel(self, tenant_id: str, batch_id: str, now: datetime) -> Batch:
        now_text = to_text(now)

        def write(conn: sqlite3.Connection) -> Batch:
            batch = _read_batch(conn, batch_id)
            if batch.tenant_id != tenant_id:
                raise UnknownBatchError(batch_id)
            if batch.status not in rules.CANCELLABLE_STATUSES:
                return batch
            conn.execute(
                "UPDATE batches SET status = ?, cancelling_at = COALESCE(cancelling_at, ?)"
                " WHERE batch_id = ?",
                (BatchStatus.CANCELLING.value, now_text, batch_id),
            )
            return _read_batch(conn, batch_id)

        return await self._write(write)

    # ----- the runner's side -----
    async def claim(self, owner: str, lease_s: float, now: datetime) -> Batch | None:
        until, now_text = to_text(rules.lease_end(now, lease_s)), to_text(now)

        def write(conn: sqlite3.Connection) -> Batch | None:
            row = conn.execute(
                f"SELECT batch_id FROM batches AS b WHERE status IN ({_ACTIVE})"
                " AND (lease_owner IS NULL OR lease_until <= ?)"
                " ORDER BY (SELECT count(*) FROM batches AS held WHERE held.tenant_id = b.tenant_id"
                f" AND held.status IN ({_ACTIVE}) AND held.lease_owner IS NOT NULL AND held.lease_until > ?),"
                " created_at, batch_id LIMIT 1",
                (now_text, now_text),
            ).fetchone()
            if row is None:
                return None
            conn.execute(
                "UPDATE batches SET lease_owner = ?, lease_until = ? WHERE batch_id = ?",
                (owner, until, row[0]),
            )
            return _read_batch(conn, row[0])

        return await self._write(write)

    async def renew(self, batch_id: str, owner: str, lease_s: float, now: datetime) -> Batch:
        until = to_text(rules.lease_end(now, lease_s))

        def write(conn: sqlite3.Connection) -> Batch:
            _require_lease(conn, batch_id, owner)
            conn.execute("UPDATE batches SET lease_until = ? WHERE batch_id = ?", (until, batch_id))
            return _read_batch(conn, batch_id)

        return await self._write(write)

    async def release(self, batch_id: str, owner: str) -> None:
        await self._write(
            lambda conn: conn.execute(
                "UPDATE batches SET lease_owner = NULL, lease_until = NULL"
                " WHERE batch_id = ? AND lease_owner = ?",
                (batch_id, owner),
            )
        )

    async def commit_part(self, batch_id: str, owner: str, part: BatchPart) -> RequestCounts:
        rules.check_part(owner, part)
        row = part_row(batch_id, part)

        def write(conn: sqlite3.Connection) -> RequestCounts:
            _require_lease(conn, batch_id, owner)
            rows = conn.execute(f"{SELECT_PARTS} WHERE batch_id = ?", (batch_id,))
            committed = [part_from_row(r) for r in rows]
            rules.check_next_part(part, len(committed), (p.line_indices for p in committed))
            conn.execute(_INSERT_PART, row)
            total, completed, failed = conn.execute(
                "UPDATE batches SET num_completed = num_completed + ?, num_failed = num_failed + ?"
                " WHERE batch_id = ? RETURNING num_total, num_completed, num_failed",
                (part.num_completed, part.num_failed, batch_id),
            ).fetchone()
            return RequestCounts(total, completed, failed)

        return await self._write(write)

    async def parts(self, batch_id: str) -> builtins.list[BatchPart]:
        rows = await self._run(
            lambda conn: conn.execute(
                f"{SELECT_PARTS} WHERE batch_id = ? ORDER BY seq", (batch_id,)
            ).fetchall()
        )
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
        now_text = to_text(now)

        def write(conn: sqlite3.Connection) -> Batch:
            new_status = rules.advanced_status(_require_lease(conn, batch_id, owner), status)
            sets = advance_columns(new_status, total=total, output_file_id=output_file_id,
                                   error_file_id=error_file_id, errors=errors,
                                   release=rules.releases_lease(new_status))  # fmt: skip
            assignments = [f"{column} = ?" for column in sets]
            params = list(sets.values())
            if new_status in STATUS_TIMESTAMPS:  # NOTE: set the first time only (COALESCE keeps it)
                column = STATUS_TIMESTAMPS[new_status]
                assignments.append(f"{column} = COALESCE({column}, ?)")
                params.append(now_text)
            conn.execute(
                f"UPDATE batches SET {', '.join(assignments)} WHERE batch_id = ?", (*params, batch_id)
            )
            return _read_batch(conn, batch_id)

        return await self._write(write)
