"""The usage ledger's schema, as numbered migrations applied at ``open()`` (see ``sluice.stores.db``).

Never edit a migration that has shipped: add the next number. SQLite stores timestamps as fixed-width
ISO-8601 UTC text (``2026-01-02T03:04:05.000006+00:00``), which sorts and compares like time.
"""

from __future__ import annotations

from sluice.stores.db import Migration

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

_IDEMPOTENCY_KEY_DDL = """
            ALTER TABLE usage ADD COLUMN idempotency_key TEXT;
            CREATE INDEX usage_tenant_idempotency_key ON usage (tenant_id, idempotency_key)
        """

# Issue 11: the latencies each request saw, to compare a model's versions on live traffic across tenants
# (hence the index by model and version). Rows from before hold NULL (not measured).
_LATENCY_DDL = """
            ALTER TABLE usage ADD COLUMN ttft_ms {real} CHECK (ttft_ms >= 0);
            ALTER TABLE usage ADD COLUMN itl_p95_ms {real} CHECK (itl_p95_ms >= 0);
            CREATE INDEX usage_model_version_finished ON usage (model, model_version, finished_at)
        """

# Issue 15: the class each request ran at, so usage reports can price batch tokens at a discount. Rows from
# before ran interactive (the batch tier did not exist). The values are spelled out, not read from
# RequestClass: a shipped migration never changes; a new class is a new migration.
_REQUEST_CLASS_DDL = """
            ALTER TABLE usage ADD COLUMN request_class TEXT NOT NULL DEFAULT 'interactive'
                CHECK (request_class IN ('interactive', 'batch'))
        """

# The operator's report across tenants (``usage_by_tenant``, ``sluice usage``) reads a window of
# finished_at without a tenant or model: without this index it read the whole table. NOTE: PostgreSQL
# builds it under a lock that holds usage writes back while it runs (seconds per ten million rows); the
# gateways' usage outboxes keep the rows meanwhile and write them once it is done.
_FINISHED_DDL = "CREATE INDEX usage_finished ON usage (finished_at)"

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
    Migration(
        version=3,
        name="usage idempotency key",
        # Issue 9: one row per attempt (each its own request id), carrying the client's Idempotency-Key so
        # a tenant can see every attempt a key cost. Rows from before hold NULL (no key recorded).
        sqlite=_IDEMPOTENCY_KEY_DDL,
        postgres=_IDEMPOTENCY_KEY_DDL,
    ),
    Migration(
        version=4,
        name="usage latencies",
        sqlite=_LATENCY_DDL.format(real="REAL"),
        postgres=_LATENCY_DDL.format(real="DOUBLE PRECISION"),
    ),
    Migration(
        version=5,
        name="usage request class",
        sqlite=_REQUEST_CLASS_DDL,
        postgres=_REQUEST_CLASS_DDL,
    ),
    Migration(version=6, name="usage finished index", sqlite=_FINISHED_DDL, postgres=_FINISHED_DDL),
]
