"""The batch store's schema, as numbered migrations applied at ``open()`` (see ``sluice.stores.db``), and how
a ``Batch`` and a ``BatchPart`` are laid out in rows (the same for both backends, but for timestamps:
``TIMESTAMPTZ`` in PostgreSQL, ISO-8601 UTC text in SQLite, which sorts as the instants do).

``batches`` holds every ``Batch`` field (``metadata`` a JSON object, ``errors`` a JSON array, the request
counts as ``num_total`` / ``num_completed`` / ``num_failed``) and the lease (``lease_owner``,
``lease_until``: both NULL when no runner holds it). ``batch_parts`` holds the committed parts
(``line_indices`` a JSON array). Version 2 added ``output_expires_after_s`` and ``input_key`` (NULL in
older rows, as in batches that asked for neither).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sluice.stores.batches.base import Batch, BatchError, BatchPart, BatchStatus, RequestCounts
from sluice.stores.db import Migration

COMPONENT = "batches"

_STATUSES = ", ".join(f"'{s.value}'" for s in BatchStatus)

_DDL = f"""
    CREATE TABLE batches (
        batch_id TEXT PRIMARY KEY,
        tenant_id TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        input_file_id TEXT NOT NULL,
        completion_window TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ({_STATUSES})),
        created_at {{ts}} NOT NULL,
        expires_at {{ts}} NOT NULL,
        num_total {{int}} NOT NULL DEFAULT 0 CHECK (num_total >= 0),
        num_completed {{int}} NOT NULL DEFAULT 0 CHECK (num_completed >= 0),
        num_failed {{int}} NOT NULL DEFAULT 0 CHECK (num_failed >= 0),
        metadata TEXT NOT NULL DEFAULT '{{{{}}}}',
        in_progress_at {{ts}},
        finalizing_at {{ts}},
        completed_at {{ts}},
        failed_at {{ts}},
        expired_at {{ts}},
        cancelling_at {{ts}},
        cancelled_at {{ts}},
        output_file_id TEXT,
        error_file_id TEXT,
        errors TEXT NOT NULL DEFAULT '[]',
        lease_owner TEXT,
        lease_until {{ts}},
        CHECK ((lease_owner IS NULL) = (lease_until IS NULL))
    );
    CREATE INDEX batches_claim ON batches (status, created_at);
    CREATE INDEX batches_tenant ON batches (tenant_id, created_at);
    CREATE TABLE batch_parts (
        batch_id TEXT NOT NULL REFERENCES batches (batch_id) ON DELETE CASCADE,
        seq {{int}} NOT NULL CHECK (seq >= 0),
        owner TEXT NOT NULL,
        line_indices TEXT NOT NULL,
        num_completed {{int}} NOT NULL CHECK (num_completed >= 0),
        num_failed {{int}} NOT NULL CHECK (num_failed >= 0),
        output_key TEXT,
        error_key TEXT,
        PRIMARY KEY (batch_id, seq)
    )
"""

# Rows written before version 2 read NULL for both: result files that never expire, no input copy.
_RETENTION_DDL = """
    ALTER TABLE batches ADD COLUMN output_expires_after_s {int} CHECK (output_expires_after_s > 0);
    ALTER TABLE batches ADD COLUMN input_key TEXT
"""

MIGRATIONS: list[Migration] = [
    Migration(
        version=1,
        name="batches and their committed parts",
        sqlite=_DDL.format(ts="TEXT", int="INTEGER"),
        postgres=_DDL.format(ts="TIMESTAMPTZ", int="BIGINT"),
    ),
    Migration(
        version=2,
        name="result files' expiry and the batch's own copy of its input file",
        sqlite=_RETENTION_DDL.format(int="INTEGER"),
        postgres=_RETENTION_DDL.format(int="BIGINT"),
    ),
]

# The batch's columns, in the order of ``batch_row`` and ``batch_from_row`` (the lease is not a field).
BATCH_COLUMNS: tuple[str, ...] = (
    "batch_id",
    "tenant_id",
    "endpoint",
    "input_file_id",
    "completion_window",
    "status",
    "created_at",
    "expires_at",
    "num_total",
    "num_completed",
    "num_failed",
    "metadata",
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "output_file_id",
    "error_file_id",
    "errors",
    "output_expires_after_s",
    "input_key",
)
PART_COLUMNS: tuple[str, ...] = (
    "seq",
    "owner",
    "line_indices",
    "num_completed",
    "num_failed",
    "output_key",
    "error_key",
)
SELECT_BATCH = f"SELECT {', '.join(BATCH_COLUMNS)} FROM batches"
SELECT_PARTS = f"SELECT {', '.join(PART_COLUMNS)} FROM batch_parts"

# How a backend writes a timestamp (``to_db``) and reads one back (``from_db``).
ToDb = Callable[[datetime], Any]
FromDb = Callable[[Any], datetime]


def errors_json(errors: Sequence[BatchError]) -> str:
    return json.dumps([{"code": e.code, "message": e.message, "line": e.line, "param": e.param}
                       for e in errors])  # fmt: skip


def batch_row(batch: Batch, to_db: ToDb) -> tuple[Any, ...]:
    """The values of ``BATCH_COLUMNS`` for this batch."""

    def ts(value: datetime | None) -> Any:
        return None if value is None else to_db(value)

    counts = batch.request_counts
    return (
        batch.batch_id,
        batch.tenant_id,
        batch.endpoint,
        batch.input_file_id,
        batch.completion_window,
        str(batch.status),
        to_db(batch.created_at),
        to_db(batch.expires_at),
        counts.total,
        counts.completed,
        counts.failed,
        json.dumps(batch.metadata, sort_keys=True),
        ts(batch.in_progress_at),
        ts(batch.finalizing_at),
        ts(batch.completed_at),
        ts(batch.failed_at),
        ts(batch.expired_at),
        ts(batch.cancelling_at),
        ts(batch.cancelled_at),
        batch.output_file_id,
        batch.error_file_id,
        errors_json(batch.errors),
        batch.output_expires_after_s,
        batch.input_key,
    )


def batch_from_row(row: Sequence[Any], from_db: FromDb) -> Batch:
    batch_id, tenant_id, endpoint, input_file_id, window, status, created_at, expires_at = row[:8]
    total, completed, failed, metadata = row[8:12]
    status_times, (output_file_id, error_file_id, errors) = row[12:19], row[19:22]
    output_expires_after_s, input_key = row[22:]

    def ts(value: Any) -> datetime | None:
        return None if value is None else from_db(value)

    in_progress, finalizing, completed_at, failed_at, expired, cancelling, cancelled = map(ts, status_times)
    return Batch(
        batch_id=batch_id,
        tenant_id=tenant_id,
        endpoint=endpoint,
        input_file_id=input_file_id,
        completion_window=window,
        status=BatchStatus(status),
        created_at=from_db(created_at),
        expires_at=from_db(expires_at),
        request_counts=RequestCounts(int(total), int(completed), int(failed)),
        metadata=json.loads(metadata),
        in_progress_at=in_progress,
        finalizing_at=finalizing,
        completed_at=completed_at,
        failed_at=failed_at,
        expired_at=expired,
        cancelling_at=cancelling,
        cancelled_at=cancelled,
        output_file_id=output_file_id,
        error_file_id=error_file_id,
        errors=tuple(BatchError(**e) for e in json.loads(errors)),
        output_expires_after_s=None if output_expires_after_s is None else int(output_expires_after_s),
        input_key=input_key,
    )


def part_row(batch_id: str, part: BatchPart) -> tuple[Any, ...]:
    """``batch_id`` then the values of ``PART_COLUMNS``."""
    return (batch_id, part.seq, part.owner, json.dumps(list(part.line_indices)), part.num_completed,
            part.num_failed, part.output_key, part.error_key)  # fmt: skip


def part_from_row(row: Sequence[Any]) -> BatchPart:
    seq, owner, lines, num_completed, num_failed, output_key, error_key = row
    return BatchPart(int(seq), owner, tuple(json.loads(lines)), int(num_completed), int(num_failed),
                     output_key, error_key)  # fmt: skip


def advance_columns(
    status: BatchStatus,
    *,
    total: int | None,
    output_file_id: str | None,
    error_file_id: str | None,
    errors: Sequence[BatchError],
    release: bool,
) -> dict[str, Any]:
    """The columns ``advance`` sets (column → value): the status, and only what is given; the lease's
    columns to NULL when ``release``. The status timestamp is the backend's (it is set only if NULL)."""
    columns: dict[str, Any] = {"status": status.value}
    if total is not None:
        columns["num_total"] = total
    if output_file_id is not None:
        columns["output_file_id"] = output_file_id
    if error_file_id is not None:
        columns["error_file_id"] = error_file_id
    if errors:
        columns["errors"] = errors_json(errors)
    if release:
        columns["lease_owner"] = columns["lease_until"] = None
    return columns
