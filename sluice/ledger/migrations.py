"""The usage ledger's schema, as numbered migrations applied at ``open()`` (see ``sluice.db``).

Never edit a migration that has shipped: add the next number. SQLite stores timestamps as fixed-width
ISO-8601 UTC text (``2026-01-02T03:04:05.000006+00:00``), which sorts and compares like time.
"""

from __future__ import annotations

from sluice.db import Migration

COMPONENT = "ledger"

# The two dialects differ only in the timestamp type.
_USAGE_DDL = """
            CREATE TABLE usage (
                tenant_id TEXT NOT NULL,
                request_id TEXT NOT NULL,
                model TEXT NOT NULL,
                model_version TEXT NOT NULL,
                prompt_tokens INTEGER NOT NULL CHECK (prompt_tokens >= 0),
                output_tokens INTEGER NOT NULL CHECK (output_tokens >= 0),
                status TEXT NOT NULL,
                started_at {ts} NOT NULL,
                finished_at {ts} NOT NULL,
                PRIMARY KEY (tenant_id, request_id)
            );
            CREATE INDEX usage_tenant_finished ON usage (tenant_id, finished_at)
        """

MIGRATIONS: list[Migration] = [
    Migration(
        version=1,
        name="usage table",
        sqlite=_USAGE_DDL.format(ts="TEXT"),
        postgres=_USAGE_DDL.format(ts="TIMESTAMPTZ"),
    ),
    Migration(
        version=2,
        name="usage attempt",
        # Issue 5: one row per (tenant, request) across retries; the row holds the latest attempt.
        sqlite="ALTER TABLE usage ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1)",
        postgres="ALTER TABLE usage ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1)",
    ),
]
