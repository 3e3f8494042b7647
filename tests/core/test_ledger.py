"""The usage ledger's contract, run over every backend (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest
from storage_backends import Backend

import sluice.stores.ledger.store
from sluice.domain import Outcome, RequestClass, UsageGroup, UsageRecord, UsageTotals
from sluice.stores.db import apply_pg_migrations, apply_sqlite_migrations, open_pg_pool
from sluice.stores.ledger.base import USAGE_COLUMNS, LedgerUnavailable, UsageLedger, VersionTraffic
from sluice.stores.ledger.migrations import COMPONENT, MIGRATIONS
from sluice.stores.ledger.store import PostgresLedger
from sluice.stores.transactions import SQLITE_CODECS

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def rec(tenant_id: str = "acme", request_id: str = "req-1", **kw: object) -> UsageRecord:
    fields: dict[str, object] = dict(
        tenant_id=tenant_id,
        request_id=request_id,
        model="sluice-tiny",
        model_version="1",
        prompt_tokens=10,
        output_tokens=5,
        status=Outcome.FINISHED,
        started_at=T0,
        finished_at=T0 + timedelta(seconds=1),
    )
    fields.update(kw)
    return UsageRecord(**fields)  # type: ignore[arg-type]


@pytest.fixture
async def ledger(backend: Backend) -> AsyncIterator[UsageLedger]:
    ledger = backend.make_ledger()
    await ledger.open()
    try:
        yield ledger
    finally:
        await ledger.close()


async def test_record_then_query_round_trips(ledger: UsageLedger) -> None:
    r = rec(status=Outcome.CANCELLED, output_tokens=3)
    assert await ledger.record(r) is True
    report = await ledger.query("acme")
    assert report.rows == [r]
    assert report.totals.num_requests == 1
    assert (report.totals.prompt_tokens, report.totals.output_tokens) == (10, 3)
    got = report.rows[0]
    assert got.finished_at.utcoffset() == timedelta(0) and got.status is Outcome.CANCELLED


async def test_other_timezones_come_back_as_the_same_instant_in_utc(ledger: UsageLedger) -> None:
    plus2 = timezone(timedelta(hours=2))
    r = rec(started_at=T0.astimezone(plus2), finished_at=(T0 + timedelta(seconds=1)).astimezone(plus2))
    await ledger.record(r)
    (got,) = (await ledger.query("acme")).rows
    assert got.finished_at == r.finished_at and got.finished_at.tzinfo is not None
    assert got.finished_at.utcoffset() == timedelta(0)


async def test_duplicate_is_not_written_and_first_row_is_unchanged(ledger: UsageLedger) -> None:
    first = rec(output_tokens=5)
    assert await ledger.record(first) is True
    assert await ledger.record(rec(output_tokens=99, status=Outcome.FAILED)) is False
    report = await ledger.query("acme")
    assert report.rows == [first]
    assert report.totals.num_requests == 1 and report.totals.output_tokens == 5


async def test_a_row_once_written_never_changes_whatever_attempt_comes_later(
    ledger: UsageLedger, backend: Backend
) -> None:
    """No write can replace (and so lower) a bill: the first row of a request id stays."""
    first = rec(output_tokens=70, status=Outcome.CANCELLED, idempotency_key="k")
    assert await ledger.record(first) is True
    assert await ledger.record(first) is False  # a replay of the same record
    assert await ledger.record(rec(attempt=2, output_tokens=1, idempotency_key="k")) is False
    assert await ledger.record(rec(output_tokens=0, status=Outcome.GATEWAY_LOST)) is False
    assert (await ledger.query("acme")).rows == [first]
    assert len(await backend.read_table("usage")) == 1


async def test_each_attempt_under_a_key_is_its_own_row_and_they_add_up(ledger: UsageLedger) -> None:
    ended = ((1, 70, Outcome.CANCELLED), (2, 1, Outcome.CANCELLED), (3, 40, Outcome.FINISHED))
    attempts = [
        rec(request_id=f"cmpl-{a}", attempt=a, output_tokens=tokens, idempotency_key="order-17",
            status=status, finished_at=T0 + timedelta(seconds=a))
        for a, tokens, status in ended
    ]  # fmt: skip
    # Replayed in any order, some twice (lost done lines): one row each, never a change.
    await asyncio.gather(*(ledger.record(attempts[i]) for i in (2, 0, 1, 2, 0)))
    report = await ledger.query("acme")
    assert report.rows == attempts[::-1]  # newest first
    assert (report.totals.num_requests, report.totals.output_tokens) == (3, 111)
    other = rec(request_id="cmpl-other", idempotency_key="order-18")
    await ledger.record(other)
    await ledger.record(rec(request_id="cmpl-none"))
    by_key = await ledger.query("acme", idempotency_key="order-17")
    assert by_key.rows == attempts[::-1] and by_key.totals.output_tokens == 111
    assert (await ledger.query("acme", idempotency_key="order-18")).rows == [other]
    assert (await ledger.query("globex", idempotency_key="order-17")).rows == []


async def test_same_request_id_in_two_tenants_is_two_rows(ledger: UsageLedger) -> None:
    assert await ledger.record(rec("acme", "r"))
    assert await ledger.record(rec("globex", "r"))
    assert len((await ledger.query("acme")).rows) == 1
    assert len((await ledger.query("globex")).rows) == 1


async def test_a_tenant_never_sees_another_tenants_rows_or_totals(ledger: UsageLedger) -> None:
    for i in range(3):
        await ledger.record(rec("acme", f"a{i}", prompt_tokens=1, output_tokens=1))
    for i in range(5):
        await ledger.record(rec("globex", f"g{i}", prompt_tokens=100, output_tokens=100))
    acme = await ledger.query("acme")
    assert {r.tenant_id for r in acme.rows} == {"acme"}
    assert (acme.totals.num_requests, acme.totals.prompt_tokens, acme.totals.output_tokens) == (3, 3, 3)
    nobody = await ledger.query("initech")
    assert nobody.rows == [] and nobody.totals.num_requests == 0 and nobody.totals.output_tokens == 0


async def test_time_range_model_filters_limit_and_order(ledger: UsageLedger) -> None:
    hour = timedelta(hours=1)
    for i in range(4):  # finished at T0, T0+1h, T0+2h, T0+3h; odd ones on another model
        await ledger.record(
            rec(
                request_id=f"r{i}",
                model="other" if i % 2 else "sluice-tiny",
                prompt_tokens=i,
                output_tokens=10 * i,
                started_at=T0 + i * hour - timedelta(seconds=1),
                finished_at=T0 + i * hour,
            )
        )
    everything = await ledger.query("acme")
    assert [r.request_id for r in everything.rows] == ["r3", "r2", "r1", "r0"]  # newest first

    ranged = await ledger.query("acme", since=T0 + hour, until=T0 + 3 * hour)  # since <= t < until
    assert [r.request_id for r in ranged.rows] == ["r2", "r1"]
    assert (ranged.totals.num_requests, ranged.totals.prompt_tokens, ranged.totals.output_tokens) == (
        2,
        3,
        30,
    )

    assert [r.request_id for r in (await ledger.query("acme", since=T0 + 3 * hour)).rows] == ["r3"]
    assert [r.request_id for r in (await ledger.query("acme", until=T0 + hour)).rows] == ["r0"]

    other = await ledger.query("acme", model="other")
    assert [r.request_id for r in other.rows] == ["r3", "r1"] and other.totals.output_tokens == 40
    both = await ledger.query("acme", model="other", since=T0 + 2 * hour)
    assert [r.request_id for r in both.rows] == ["r3"]

    limited = await ledger.query("acme", limit=1)  # totals cover the whole filter, rows only `limit`
    assert [r.request_id for r in limited.rows] == ["r3"] and limited.totals.num_requests == 4
    assert (await ledger.query("acme", limit=0)).rows == []


async def test_concurrent_records_of_one_key_write_exactly_one_row(
    ledger: UsageLedger, backend: Backend
) -> None:
    attempts = [rec(request_id="dup", output_tokens=i) for i in range(40)]
    written = await asyncio.gather(*(ledger.record(r) for r in attempts))
    assert written.count(True) == 1
    winner = attempts[written.index(True)]
    assert (await ledger.query("acme")).rows == [winner]
    assert len(await backend.read_table("usage")) == 1


async def test_migrations_are_idempotent_and_safe_to_start_concurrently(backend: Backend) -> None:
    a, b = backend.make_ledger(), backend.make_ledger()
    await asyncio.gather(a.open(), b.open())  # two "processes" starting at once on an empty database
    try:
        await a.record(rec())
        c = backend.make_ledger()
        await c.open()  # nothing left to apply: the data survives
        assert len((await c.query("acme")).rows) == 1
        await c.close()
    finally:
        await a.close()
        await b.close()
    applied = [row for row in await backend.read_table("schema_migrations") if row[0] == "ledger"]
    assert [row[1] for row in applied] == [1, 2, 3, 4, 5, 6]


async def test_rows_written_before_the_attempt_and_key_columns_read_as_attempt_1_without_a_key(
    backend: Backend, tmp_path: Path
) -> None:
    """An existing ledger upgrades in place: its rows become attempt 1 with no key, and stay as they are."""
    old = rec(request_id="before-upgrade")
    columns = USAGE_COLUMNS.removesuffix(", attempt, idempotency_key, ttft_ms, itl_p95_ms, request_class")
    values = (old.tenant_id, old.request_id, old.model, old.model_version, old.prompt_tokens,
              old.output_tokens, old.status.value)  # fmt: skip
    if backend.database_url is None:
        # The SQLite backend's file (storage_backends.sqlite_backend).
        with closing(sqlite3.connect(tmp_path / "sluice.db", isolation_level=None)) as conn:
            apply_sqlite_migrations(conn, COMPONENT, MIGRATIONS[:1])
            conn.execute(
                f"INSERT INTO usage ({columns}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    *values,
                    SQLITE_CODECS.to_db_time(old.started_at),
                    SQLITE_CODECS.to_db_time(old.finished_at),
                ),
            )
    else:
        pool = await open_pg_pool(backend.database_url, max_size=1, name="v1")
        try:
            await apply_pg_migrations(pool, COMPONENT, MIGRATIONS[:1])
            async with pool.connection() as conn:
                await conn.execute(
                    f"INSERT INTO usage ({columns}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    (*values, old.started_at, old.finished_at),
                )
        finally:
            await pool.close()
    ledger = backend.make_ledger()
    await ledger.open()  # applies migrations 2 to 5 over the existing row
    try:
        assert (await ledger.query("acme")).rows == [old]  # attempt 1, no key, no latencies, interactive
        (traffic,) = await ledger.version_traffic("sluice-tiny", T0)
        assert (traffic.num_requests, traffic.ttft_p95_ms, traffic.itl_p95_ms) == (1, None, None)
        assert await ledger.record(old) is False
        assert await ledger.record(rec(request_id="before-upgrade", attempt=2, output_tokens=1)) is False
        assert (await ledger.query("acme")).rows == [old]
    finally:
        await ledger.close()


async def test_bad_input_is_refused(ledger: UsageLedger) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        await ledger.record(rec(finished_at=datetime(2026, 1, 1)))
    with pytest.raises(ValueError, match=">= 0"):
        await ledger.record(rec(output_tokens=-1))
    with pytest.raises(ValueError, match="attempt"):
        await ledger.record(rec(attempt=0))
    with pytest.raises(ValueError, match="idempotency_key"):
        await ledger.record(rec(idempotency_key=""))
    for rowless in (Outcome.REFUSED, Outcome.REPLAYED, Outcome.INTERRUPTED):  # they bill nothing
        with pytest.raises(ValueError, match="writes no usage row"):
            await ledger.record(rec(status=rowless))
    with pytest.raises(ValueError, match="timezone-aware"):
        await ledger.query("acme", since=datetime(2026, 1, 1))
    for bad_ms in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="ttft_ms"):
            await ledger.record(rec(ttft_ms=bad_ms))
        with pytest.raises(ValueError, match="itl_p95_ms"):
            await ledger.record(rec(itl_p95_ms=bad_ms))
    with pytest.raises(ValueError, match="timezone-aware"):
        await ledger.version_traffic("sluice-tiny", datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="model"):
        await ledger.version_traffic("", T0)
    assert (await ledger.query("acme")).rows == []


def test_records_hold_no_text_fields() -> None:
    """The ledger stores counts, never prompt or output text: guard the record's shape."""
    assert {f.name for f in dataclasses.fields(UsageRecord)} == {
        "tenant_id",
        "request_id",
        "model",
        "model_version",
        "prompt_tokens",
        "output_tokens",
        "status",
        "started_at",
        "finished_at",
        "attempt",
        "idempotency_key",  # the client's own label for the request, not its content
        "ttft_ms",
        "itl_p95_ms",
        "request_class",
    }


async def test_a_write_lands_even_if_its_caller_is_cancelled(backend: Backend) -> None:
    """The gateway writes the row in a request's finally, possibly while the request is being cancelled."""
    ledger = backend.make_ledger()
    await ledger.open()
    caller = asyncio.create_task(ledger.record(rec(request_id="cancelled-caller")))
    await asyncio.sleep(0)  # the caller reaches its await on the write
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await ledger.close()
    assert [row[1] for row in await backend.read_table("usage")] == ["cancelled-caller"]


async def test_latencies_round_trip_and_are_none_when_not_measured(ledger: UsageLedger) -> None:
    measured = rec(request_id="measured", ttft_ms=123.456, itl_p95_ms=7.25)
    unmeasured = rec(request_id="unmeasured", finished_at=T0 + timedelta(seconds=2))
    assert await ledger.record(measured) and await ledger.record(unmeasured)
    rows = (await ledger.query("acme")).rows
    assert rows == [unmeasured, measured]
    assert (rows[0].ttft_ms, rows[0].itl_p95_ms) == (None, None)
    assert (rows[1].ttft_ms, rows[1].itl_p95_ms) == (123.456, 7.25)


async def test_request_class_round_trips_and_the_table_refuses_an_unknown_one(
    backend: Backend, ledger: UsageLedger, tmp_path: Path
) -> None:
    batch = rec(request_id="batch", request_class=RequestClass.BATCH)
    interactive = rec(request_id="interactive", finished_at=T0 + timedelta(seconds=2))
    assert await ledger.record(batch) and await ledger.record(interactive)
    rows = (await ledger.query("acme")).rows
    assert rows == [interactive, batch]
    assert [r.request_class for r in rows] == [RequestClass.INTERACTIVE, RequestClass.BATCH]
    # The CHECK holds the column to the known classes even for a writer that bypasses the ledger.
    values = (
        "acme",
        "raw",
        "m",
        "1",
        1,
        1,
        "finished",
        SQLITE_CODECS.to_db_time(T0),
        SQLITE_CODECS.to_db_time(T0),
        "premium",
    )
    sql = "INSERT INTO usage (tenant_id, request_id, model, model_version, prompt_tokens, output_tokens,"
    sql += " status, started_at, finished_at, request_class) VALUES ({})"
    if backend.database_url is None:
        with (
            closing(sqlite3.connect(tmp_path / "sluice.db")) as conn,
            pytest.raises(sqlite3.IntegrityError, match="CHECK"),
        ):
            conn.execute(sql.format(", ".join("?" * len(values))), values)
    else:
        async with await psycopg.AsyncConnection.connect(backend.database_url) as conn:
            with pytest.raises(psycopg.errors.CheckViolation):
                await conn.execute(sql.format(", ".join(["%s"] * len(values))), values)


async def test_totals_by_model_and_class_cover_the_whole_filter_and_the_class_filters(
    ledger: UsageLedger,
) -> None:
    second = timedelta(seconds=1)
    for i, (model, cls, p, o) in enumerate(
        [
            ("sluice-tiny", RequestClass.BATCH, 100, 10),
            ("sluice-tiny", RequestClass.INTERACTIVE, 7, 3),
            ("sluice-tiny", RequestClass.BATCH, 200, 20),
            ("alpha", RequestClass.INTERACTIVE, 1, 1),
            ("sluice-tiny", RequestClass.INTERACTIVE, 5, 2),
        ]
    ):
        r = rec(request_id=f"r{i}", model=model, request_class=cls, prompt_tokens=p, output_tokens=o)
        await ledger.record(dataclasses.replace(r, finished_at=T0 + i * second))
    await ledger.record(rec(tenant_id="globex", request_id="g", request_class=RequestClass.BATCH))

    report = await ledger.query("acme", limit=1)  # the totals cover every row, not only the one returned
    assert [r.request_id for r in report.rows] == ["r4"]
    assert report.totals == UsageTotals(
        5,
        313,
        36,
        (
            UsageGroup("alpha", RequestClass.INTERACTIVE, 1, 1, 1),
            UsageGroup("sluice-tiny", RequestClass.BATCH, 2, 300, 30),
            UsageGroup("sluice-tiny", RequestClass.INTERACTIVE, 2, 12, 5),
        ),
    )
    batch = await ledger.query("acme", request_class=RequestClass.BATCH)
    assert [r.request_id for r in batch.rows] == ["r2", "r0"]
    assert batch.totals == UsageTotals(
        2, 300, 30, (UsageGroup("sluice-tiny", RequestClass.BATCH, 2, 300, 30),)
    )
    tiny_interactive = await ledger.query("acme", model="sluice-tiny", request_class=RequestClass.INTERACTIVE)
    assert [r.request_id for r in tiny_interactive.rows] == ["r4", "r1"]
    assert (await ledger.query("initech")).totals == UsageTotals(0, 0, 0, ())
    globex = await ledger.query("globex")
    assert globex.totals.groups == (UsageGroup("sluice-tiny", RequestClass.BATCH, 1, 10, 5),)


async def test_version_traffic_per_version_of_one_model_over_the_window(ledger: UsageLedger) -> None:
    since = T0 + timedelta(hours=1)
    odd_outcomes = {0: Outcome.FAILED, 1: Outcome.GATEWAY_LOST, 2: Outcome.DEADLINE,
                    3: Outcome.CANCELLED, 4: Outcome.FILTERED}  # fmt: skip
    # v1: 20 measured rows over both tenants, the first finishing exactly at `since` (in the window).
    for i in range(20):
        await ledger.record(
            rec("acme" if i % 2 else "globex", f"v1-{i}", model_version="v1", prompt_tokens=10,
                output_tokens=i, status=odd_outcomes.get(i, Outcome.FINISHED),
                finished_at=since + timedelta(seconds=i), ttft_ms=10.0 * (i + 1), itl_p95_ms=i + 1.0)
        )  # fmt: skip
    # ... and one failed request that saw no token: counted, but no latency.
    await ledger.record(rec(request_id="v1-none", model_version="v1", status=Outcome.FAILED,
                            output_tokens=0, finished_at=since + timedelta(minutes=5)))  # fmt: skip
    # Outside the window or another model: not counted.
    just_before = since - timedelta(microseconds=1)
    await ledger.record(rec(request_id="v1-old", model_version="v1", finished_at=just_before,
                            status=Outcome.FAILED, ttft_ms=9999.0, itl_p95_ms=9999.0))  # fmt: skip
    await ledger.record(rec(request_id="v0-old", model_version="v0", finished_at=T0, ttft_ms=1.0))
    await ledger.record(rec(request_id="other", model="other", model_version="v1", ttft_ms=9999.0,
                            status=Outcome.FAILED, finished_at=since + timedelta(seconds=1)))  # fmt: skip
    # v2: nothing measured; v3: one TTFT (a single delta has no inter-token gap).
    for i in range(2):
        await ledger.record(rec(request_id=f"v2-{i}", model_version="v2", finished_at=since))
    await ledger.record(rec(request_id="v3-0", model_version="v3", finished_at=since, ttft_ms=50.0))

    traffic = await ledger.version_traffic("sluice-tiny", since)
    assert traffic == [
        # Errors: failed (2), gateway_lost, deadline; not cancelled or filtered. Nearest-rank p95 of 20
        # values is the 19th.
        VersionTraffic("v1", num_requests=21, num_errors=4, prompt_tokens=210, output_tokens=190,
                       ttft_p95_ms=190.0, itl_p95_ms=19.0),
        VersionTraffic("v2", 2, 0, 20, 10, ttft_p95_ms=None, itl_p95_ms=None),
        VersionTraffic("v3", 1, 0, 10, 5, ttft_p95_ms=50.0, itl_p95_ms=None),
    ]  # fmt: skip
    assert traffic[0].error_rate == 4 / 21 and traffic[1].error_rate == 0.0
    from_the_start = await ledger.version_traffic("sluice-tiny", T0)
    assert [t.model_version for t in from_the_start] == ["v0", "v1", "v2", "v3"]
    assert await ledger.version_traffic("sluice-tiny", since + timedelta(days=1)) == []
    assert await ledger.version_traffic("unknown-model", T0) == []


async def test_version_traffic_percentiles_read_only_the_newest_measured_rows(
    ledger: UsageLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sluice.stores.ledger.store, "MAX_LATENCY_ROWS_PER_VERSION", 3)
    for i in range(10):  # the newer, the faster: 1000 ms first, 100 ms last
        await ledger.record(rec(request_id=f"r{i}", finished_at=T0 + timedelta(seconds=i),
                                ttft_ms=1000.0 - 100 * i, itl_p95_ms=100.0 - 10 * i))  # fmt: skip
    for i in range(10, 12):  # newer still, unmeasured: they do not take the bound's places
        await ledger.record(rec(request_id=f"r{i}", finished_at=T0 + timedelta(seconds=i)))
    (traffic,) = await ledger.version_traffic("sluice-tiny", T0)
    assert traffic.num_requests == 12 and traffic.output_tokens == 60  # the counts cover every row
    assert (traffic.ttft_p95_ms, traffic.itl_p95_ms) == (300.0, 30.0)  # of rows r7..r9 only


async def test_version_traffic_raises_ledger_unavailable_while_postgresql_is_down() -> None:
    ledger = PostgresLedger("postgresql://postgres@127.0.0.1:1/sluice_nowhere", acquire_timeout_s=0.5)
    await ledger.open(keep_trying=True)  # a gateway's start: the server cannot be reached
    try:
        with pytest.raises(LedgerUnavailable, match="unavailable"):
            await ledger.version_traffic("sluice-tiny", T0)
    finally:
        await ledger.close()
