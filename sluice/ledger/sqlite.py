"""The embedded ledger: one SQLite file (``<state_dir>/sluice.db`` by default)."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from sluice.db import SqliteDb, apply_sqlite_migrations
from sluice.domain import RequestClass, UsageRecord, UsageReport
from sluice.ledger.base import (
    KEEP_THE_FIRST,
    MAX_LATENCY_ROWS_PER_VERSION,
    USAGE_COLUMNS,
    TenantUsage,
    UsageLedger,
    VersionTraffic,
    check_query_args,
    check_record,
    check_usage_by_tenant_args,
    check_version_traffic_args,
    error_statuses,
    record_from_row,
    tenant_usage_from,
    totals_from,
    usage_by_tenant_sql,
    usage_groups_sql,
    version_traffic_from,
    version_traffic_sql,
)
from sluice.ledger.migrations import COMPONENT, MIGRATIONS


def to_text(ts: datetime) -> str:
    """Fixed-width UTC ISO-8601, so text order is time order."""
    return ts.astimezone(UTC).isoformat(timespec="microseconds")


class SqliteLedger(UsageLedger):
    def __init__(self, path: Path) -> None:
        self._db = SqliteDb(path)

    async def open(self) -> None:
        await self._db.open()
        await self._db.run(lambda conn: apply_sqlite_migrations(conn, COMPONENT, MIGRATIONS))

    async def close(self) -> None:
        await self._db.close()

    async def record(self, rec: UsageRecord) -> bool:
        check_record(rec)
        params = (
            rec.tenant_id,
            rec.request_id,
            rec.model,
            rec.model_version,
            rec.prompt_tokens,
            rec.output_tokens,
            rec.status.value,
            to_text(rec.started_at),
            to_text(rec.finished_at),
            rec.attempt,
            rec.idempotency_key,
            rec.ttft_ms,
            rec.itl_p95_ms,
            rec.request_class.value,
        )

        def insert(conn: sqlite3.Connection) -> bool:
            placeholders = ", ".join("?" * len(params))
            cur = conn.execute(
                f"INSERT INTO usage ({USAGE_COLUMNS}) VALUES ({placeholders}) {KEEP_THE_FIRST}", params
            )
            return cur.rowcount == 1  # 0 when the row was there already

        # NOTE: one statement, so atomic without BEGIN. A cancelled caller does not stop the write
        # (SqliteDb.run is shielded) and close() runs the connection's queue dry before closing.
        return await self._db.run(insert)

    async def query(
        self,
        tenant_id: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        model: str | None = None,
        idempotency_key: str | None = None,
        request_class: RequestClass | None = None,
        limit: int = 100,
    ) -> UsageReport:
        check_query_args(since, until, limit)
        where, params = ["tenant_id = ?"], [tenant_id]
        if since is not None:
            where.append("finished_at >= ?")
            params.append(to_text(since))
        if until is not None:
            where.append("finished_at < ?")
            params.append(to_text(until))
        if model is not None:
            where.append("model = ?")
            params.append(model)
        if idempotency_key is not None:
            where.append("idempotency_key = ?")
            params.append(idempotency_key)
        if request_class is not None:
            where.append("request_class = ?")
            params.append(request_class.value)
        cond = " AND ".join(where)

        def read(conn: sqlite3.Connection) -> UsageReport:
            # One read transaction: the totals and the rows see the same snapshot.
            conn.execute("BEGIN")
            try:
                groups = conn.execute(usage_groups_sql(cond), params).fetchall()
                rows = conn.execute(
                    f"SELECT {USAGE_COLUMNS} FROM usage WHERE {cond}"
                    " ORDER BY finished_at DESC, request_id DESC LIMIT ?",
                    [*params, limit],
                ).fetchall()
            finally:
                conn.execute("COMMIT")
            return UsageReport(
                totals_from(groups), [record_from_row(r, datetime.fromisoformat) for r in rows]
            )

        return await self._db.run(read)

    async def version_traffic(self, model: str, since: datetime) -> list[VersionTraffic]:
        check_version_traffic_args(model, since)
        totals_sql, latencies_sql = version_traffic_sql("?")
        since_text = to_text(since)

        def read(conn: sqlite3.Connection) -> list[VersionTraffic]:
            # One read transaction: the totals and the latencies see the same snapshot.
            conn.execute("BEGIN")
            try:
                totals = conn.execute(totals_sql, [*error_statuses(), model, since_text]).fetchall()
                latencies = {
                    version: conn.execute(
                        latencies_sql, (model, version, since_text, MAX_LATENCY_ROWS_PER_VERSION)
                    ).fetchall()
                    for version, *_ in totals
                }
            finally:
                conn.execute("COMMIT")
            return version_traffic_from(totals, latencies)

        return await self._db.run(read)

    async def usage_by_tenant(
        self,
        *,
        since: datetime,
        until: datetime | None = None,
        tenant_id: str | None = None,
        model: str | None = None,
        request_class: RequestClass | None = None,
    ) -> list[TenantUsage]:
        check_usage_by_tenant_args(since, until, tenant_id, model)
        sql, params = usage_by_tenant_sql(
            "?",
            since=to_text(since),
            until=None if until is None else to_text(until),
            tenant_id=tenant_id,
            model=model,
            request_class=request_class,
        )
        # One statement: one snapshot without BEGIN.
        rows = await self._db.run(lambda conn: conn.execute(sql, params).fetchall())
        return tenant_usage_from(rows)
