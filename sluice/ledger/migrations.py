"""The usage ledger's schema, as numbered migrations applied at ``open()`` (see ``sluice.db``).

Never edit a migration that has shipped: add the next number. SQLite stores timestamps as fixed-width
ISO-8601 UTC text (``2026-01-02T03:04:05.000006+00:00``), which sorts and compares like time.
"""

from __future__ import annotations

from sluice.db import Migration

COMPONENT = "ledger"

MIGRATIONS: list[Migration] = [
    Migration(
        version=1,
        name="usage table",
        sqlite="""
            CREATE TABLE usage (
                tenant_id TEXT NOT NULL,
                request_id TEXT NOT NULL,
                model TEXT NOT NULL,
                model_version TEXT NOT NULL,
                prompt_tokens INTEGER NOT NULL CHECK (prompt_tokens >= 0),
                output_tokens INTEGER NOT NULL CHECK (output_tokens >= 0),
                status TEXT NOT NULL,
                started_at TEXT NOT NULL,
                finished_at TEXT NOT NULL,
                PRIMARY KEY (tenant_id, request_id)
            );
            CREATE INDEX usage_tenant_finished ON usage (tenant_id, finished_at)
        """,
        postgres="""
            CREATE TABLE usage (
                tenant_id TEXT NOT NULL,
                request_id TEXT NOT NULL,
                model TEXT NOT NULL,
                model_version TEXT NOT NULL,
                prompt_tokens INTEGER NOT NULL CHECK (prompt_tokens >= 0),
                output_tokens INTEGER NOT NULL CHECK (output_tokens >= 0),
                status TEXT NOT NULL,
                started_at TIMESTAMPTZ NOT NULL,
                finished_at TIMESTAMPTZ NOT NULL,
                PRIMARY KEY (tenant_id, request_id)
            );
            CREATE INDEX usage_tenant_finished ON usage (tenant_id, finished_at)
        """,
    ),
    Migration(
        version=2,
        name="usage attempt",
        # Issue 5: one row per (tenant, request) across retries; the row holds the latest attempt.
        sqlite="ALTER TABLE usage ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1)",
        postgres="ALTER TABLE usage ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1)",
    ),
]
