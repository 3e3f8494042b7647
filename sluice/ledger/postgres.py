"""The production ledger: PostgreSQL through a psycopg async connection pool."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from psycopg_pool import AsyncConnectionPool

from sluice.db import PG_UNREACHABLE, MigratedPgPool
from sluice.domain import RequestClass, UsageRecord, UsageReport
from sluice.ledger.base import (
    KEEP_THE_FIRST,
    MAX_LATENCY_ROWS_PER_VERSION,
    USAGE_COLUMNS,
    LedgerUnavailable,
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

_PLACEHOLDERS = ", ".join(["%s"] * len(USAGE_COLUMNS.split(",")))
_TOTALS_SQL, _LATENCIES_SQL = version_traffic_sql("%s")


class PostgresLedger(UsageLedger):
    def __init__(self, url: str, *, pool_max_size: int = 10, acquire_timeout_s: float = 5.0) -> None:
        # NOTE: a short wait for a connection: while the server is unreachable a write fails in seconds
        # (the usage meter keeps it in its outbox) rather than holding close() for psycopg's default 30 s.
        self._db = MigratedPgPool(
            url,
            max_size=pool_max_size,
            name="ledger",
            component=COMPONENT,
            migrations=MIGRATIONS,
            acquire_timeout_s=acquire_timeout_s,
        )
        self._in_flight: set[asyncio.Task[bool]] = set()

    @property
    def pool(self) -> AsyncConnectionPool:
        return self._db.pool

    async def open(self, *, keep_trying: bool = False) -> None:
        """``keep_trying``: a server's start, see ``MigratedPgPool``: writes fail (and the usage meter keeps
        them in its outbox) until the ledger is reached."""
        await self._db.open(keep_trying=keep_trying)

    async def close(self) -> None:
        if self._in_flight:  # writes whose callers were cancelled: let them land
            await asyncio.gather(*self._in_flight, return_exceptions=True)
        await self._db.close()

    async def record(self, rec: UsageRecord) -> bool:
        check_record(rec)
        # NOTE: the write runs in its own task, shielded: a caller cancelled mid-write (a client disconnect
        # reaching the request's finally) must not lose the row. close() waits for writes still in flight.
        task = asyncio.create_task(self._insert(rec))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        return await asyncio.shield(task)

    async def _insert(self, rec: UsageRecord) -> bool:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"INSERT INTO usage ({USAGE_COLUMNS}) VALUES ({_PLACEHOLDERS}) {KEEP_THE_FIRST}",
                (
                    rec.tenant_id,
                    rec.request_id,
                    rec.model,
                    rec.model_version,
                    rec.prompt_tokens,
                    rec.output_tokens,
                    rec.status.value,
                    rec.started_at,
                    rec.finished_at,
                    rec.attempt,
                    rec.idempotency_key,
                    rec.ttft_ms,
                    rec.itl_p95_ms,
                    rec.request_class.value,
                ),
            )
            return cur.rowcount == 1  # 0 when the row was there already

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
        where, params = ["tenant_id = %s"], list[object]([tenant_id])
        if since is not None:
            where.append("finished_at >= %s")
            params.append(since)
        if until is not None:
            where.append("finished_at < %s")
            params.append(until)
        if model is not None:
            where.append("model = %s")
            params.append(model)
        if idempotency_key is not None:
            where.append("idempotency_key = %s")
            params.append(idempotency_key)
        if request_class is not None:
            where.append("request_class = %s")
            params.append(request_class.value)
        try:
            return await self._query(" AND ".join(where), params, limit)
        except PG_UNREACHABLE as exc:
            raise LedgerUnavailable(f"usage ledger (PostgreSQL) unavailable: {exc}") from exc

    async def _query(self, cond: str, params: list[object], limit: int) -> UsageReport:
        async with self.pool.connection() as conn, conn.transaction():
            # REPEATABLE READ: the totals and the rows see the same snapshot.
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur = await conn.execute(usage_groups_sql(cond), params)
            groups = await cur.fetchall()
            cur = await conn.execute(
                f"SELECT {USAGE_COLUMNS} FROM usage WHERE {cond}"
                " ORDER BY finished_at DESC, request_id DESC LIMIT %s",
                [*params, limit],
            )
            rows = await cur.fetchall()
        return UsageReport(
            totals_from(groups),
            [record_from_row(r, lambda ts: ts.astimezone(UTC)) for r in rows],
        )

    async def version_traffic(self, model: str, since: datetime) -> list[VersionTraffic]:
        check_version_traffic_args(model, since)
        try:
            async with self.pool.connection() as conn, conn.transaction():
                # REPEATABLE READ: the totals and the latencies see the same snapshot.
                await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur = await conn.execute(_TOTALS_SQL, [*error_statuses(), model, since])
                totals = await cur.fetchall()
                latencies = {}
                for version, *_ in totals:
                    cur = await conn.execute(
                        _LATENCIES_SQL, (model, version, since, MAX_LATENCY_ROWS_PER_VERSION)
                    )
                    latencies[version] = await cur.fetchall()
        except PG_UNREACHABLE as exc:
            raise LedgerUnavailable(f"usage ledger (PostgreSQL) unavailable: {exc}") from exc
        return version_traffic_from(totals, latencies)

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
            "%s", since=since, until=until, tenant_id=tenant_id, model=model, request_class=request_class
        )
        try:
            async with self.pool.connection() as conn:
                cur = await conn.execute(sql, params)
                rows = await cur.fetchall()
        except PG_UNREACHABLE as exc:
            raise LedgerUnavailable(f"usage ledger (PostgreSQL) unavailable: {exc}") from exc
        return tenant_usage_from(rows)
