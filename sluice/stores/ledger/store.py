"""The usage ledger's one body, on SQLite (the embedded default, ``<state_dir>/sluice.db``) or PostgreSQL
(production, a psycopg pool); ``sluice.stores.transactions`` runs it on either."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from sluice.domain import RequestClass, UsageRecord, UsageReport
from sluice.stores.ledger.base import (
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
from sluice.stores.ledger.migrations import COMPONENT, MIGRATIONS
from sluice.stores.transactions import SqlRunner, StoreSchema, Tx

_INSERT = (
    f"INSERT INTO usage ({USAGE_COLUMNS}) VALUES ({', '.join('?' * len(USAGE_COLUMNS.split(',')))})"
    f" {KEEP_THE_FIRST}"
)
_TOTALS_SQL, _LATENCIES_SQL = version_traffic_sql()


class SqlLedger(UsageLedger):
    def __init__(self, runner: SqlRunner) -> None:
        self._db = runner

    async def open(self, *, keep_trying: bool = False) -> None:
        """``keep_trying``: a server's start (PostgreSQL only, see ``sluice.stores.db.MigratedPgPool``):
        writes fail, and the usage meter keeps them in its outbox, until the ledger is reached."""
        await self._db.open(keep_trying=keep_trying)

    async def close(self) -> None:
        await self._db.close()

    async def record(self, rec: UsageRecord) -> bool:
        check_record(rec)

        async def insert(tx: Tx) -> bool:
            to_db = tx.codecs.to_db_time
            params = (
                rec.tenant_id,
                rec.request_id,
                rec.model,
                rec.model_version,
                rec.prompt_tokens,
                rec.output_tokens,
                rec.status.value,
                to_db(rec.started_at),
                to_db(rec.finished_at),
                rec.attempt,
                rec.idempotency_key,
                rec.ttft_ms,
                rec.itl_p95_ms,
                rec.request_class.value,
            )
            return await tx.execute(_INSERT, params) == 1  # 0 when the row was there already

        # NOTE: one statement, so atomic without a transaction; finished even if the caller is cancelled
        # (a client's disconnect must not lose the row), and close() waits for it.
        return await self._db.write_one(insert)

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

        async def read(tx: Tx) -> UsageReport:
            to_db = tx.codecs.to_db_time
            where, params = ["tenant_id = ?"], list[object]([tenant_id])
            for condition, value in (
                ("finished_at >= ?", None if since is None else to_db(since)),
                ("finished_at < ?", None if until is None else to_db(until)),
                ("model = ?", model),
                ("idempotency_key = ?", idempotency_key),
                ("request_class = ?", None if request_class is None else request_class.value),
            ):
                if value is not None:
                    where.append(condition)
                    params.append(value)
            cond = " AND ".join(where)
            groups = await tx.fetchall(usage_groups_sql(cond), params)
            rows = await tx.fetchall(
                f"SELECT {USAGE_COLUMNS} FROM usage WHERE {cond}"
                " ORDER BY finished_at DESC, request_id DESC LIMIT ?",
                [*params, limit],
            )
            return UsageReport(
                totals_from(groups), [record_from_row(r, tx.codecs.from_db_time) for r in rows]
            )

        # One snapshot: the totals and the rows agree.
        return await self._db.read(read)

    async def version_traffic(self, model: str, since: datetime) -> list[VersionTraffic]:
        check_version_traffic_args(model, since)

        async def read(tx: Tx) -> list[VersionTraffic]:
            since_db = tx.codecs.to_db_time(since)
            totals = await tx.fetchall(_TOTALS_SQL, [*error_statuses(), model, since_db])
            latencies = {
                version: await tx.fetchall(
                    _LATENCIES_SQL, (model, version, since_db, MAX_LATENCY_ROWS_PER_VERSION)
                )
                for version, *_ in totals
            }
            return version_traffic_from(totals, latencies)

        # One snapshot: the totals and the latencies agree.
        return await self._db.read(read)

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

        async def read(tx: Tx) -> list[TenantUsage]:
            to_db = tx.codecs.to_db_time
            sql, params = usage_by_tenant_sql(
                since=to_db(since),
                until=None if until is None else to_db(until),
                tenant_id=tenant_id,
                model=model,
                request_class=request_class,
            )
            return tenant_usage_from(await tx.fetchall(sql, params))

        return await self._db.run(read)  # one statement: one snapshot by itself


_SCHEMA = StoreSchema("usage ledger", "ledger", COMPONENT, MIGRATIONS, LedgerUnavailable)


class SqliteLedger(SqlLedger):
    """The embedded ledger: one SQLite file (``<state_dir>/sluice.db`` by default)."""

    def __init__(self, path: Path, *, report_outages: bool = True) -> None:
        super().__init__(_SCHEMA.sqlite(path, report_outages=report_outages))


class PostgresLedger(SqlLedger):
    """The production ledger: PostgreSQL through a psycopg async connection pool.

    ``acquire_timeout_s``: a short wait for a connection, so that while the server is unreachable a write
    fails in seconds (the usage meter keeps it in its outbox) rather than holding close() for psycopg's
    default 30 s."""

    def __init__(
        self,
        url: str,
        *,
        pool_max_size: int = 10,
        acquire_timeout_s: float = 5.0,
        report_outages: bool = True,
    ) -> None:
        super().__init__(
            _SCHEMA.postgres(
                url,
                pool_max_size=pool_max_size,
                acquire_timeout_s=acquire_timeout_s,
                report_outages=report_outages,
            )
        )
