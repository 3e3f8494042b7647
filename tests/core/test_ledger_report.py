"""The ledger's read across tenants (``usage_by_tenant``, the operator's usage and cost report), run over
every backend (SQLite and PostgreSQL), and the report window's parser (``sluice.stores.ledger.window``)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from storage_backends import Backend

from sluice.domain import Outcome, RequestClass, UsageRecord
from sluice.stores.ledger.base import LedgerUnavailable, TenantUsage, UsageLedger, usage_by_tenant_sql
from sluice.stores.ledger.store import PostgresLedger, SqliteLedger
from sluice.stores.ledger.window import DEFAULT_WINDOW, WindowError, parse_instant, report_window

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
UNTIL = T0 + timedelta(hours=1)
BATCH, INTERACTIVE = RequestClass.BATCH, RequestClass.INTERACTIVE


def rec(tenant_id: str, request_id: str, **kw: object) -> UsageRecord:
    fields: dict[str, object] = dict(
        tenant_id=tenant_id,
        request_id=request_id,
        model="sluice-tiny",
        model_version="1",
        prompt_tokens=10,
        output_tokens=5,
        status=Outcome.FINISHED,
        started_at=T0 - timedelta(seconds=1),
        finished_at=T0,
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


async def write_two_tenants(ledger: UsageLedger) -> None:
    """acme and globex, on two models and both classes, each outcome once, and rows just outside the
    window ``[T0, T0 + 1 h)`` on both sides."""
    outcomes = list(Outcome)
    rows = [
        # acme, sluice-tiny interactive: one row per outcome that writes a row (3 of them errors).
        *(
            rec("acme", f"a-{i}", status=o, prompt_tokens=i + 1, output_tokens=10 * (i + 1),
                finished_at=T0 + timedelta(minutes=i))
            for i, o in enumerate(outcomes)
            if o not in (Outcome.REFUSED, Outcome.REPLAYED, Outcome.INTERRUPTED)
        ),
        rec("acme", "a-batch", request_class=BATCH, prompt_tokens=100, output_tokens=1000),
        rec("acme", "a-large", model="sluice-large", prompt_tokens=7, output_tokens=3),
        # globex: the same request ids as acme's (two tenants, two rows), its own numbers.
        rec("globex", "a-0", prompt_tokens=1000, output_tokens=2000, status=Outcome.FAILED),
        rec("globex", "a-batch", request_class=BATCH, model="sluice-large", prompt_tokens=3,
            output_tokens=4),
        # Outside the window: one microsecond before since, and exactly at until.
        rec("acme", "before", finished_at=T0 - timedelta(microseconds=1), prompt_tokens=99_999),
        rec("globex", "at-until", finished_at=T0 + timedelta(hours=1), prompt_tokens=99_999),
    ]  # fmt: skip
    for r in rows:
        assert await ledger.record(r)


async def test_totals_per_tenant_model_and_class_over_the_window(ledger: UsageLedger) -> None:
    await write_two_tenants(ledger)
    report = await ledger.usage_by_tenant(since=T0, until=UNTIL)
    # acme interactive: finished(1) cancelled(2) deadline(3) failed(4) filtered(5) gateway_lost(8):
    # prompts 1+2+3+4+5+8 = 23, outputs 230; errors: deadline, failed, gateway_lost.
    assert report == [
        TenantUsage("acme", "sluice-large", INTERACTIVE, 1, 0, 7, 3),
        TenantUsage("acme", "sluice-tiny", BATCH, 1, 0, 100, 1000),
        TenantUsage("acme", "sluice-tiny", INTERACTIVE, 6, 3, 23, 230),
        TenantUsage("globex", "sluice-large", BATCH, 1, 0, 3, 4),
        TenantUsage("globex", "sluice-tiny", INTERACTIVE, 1, 1, 1000, 2000),
    ]
    assert report[2].group.num_requests == 6 and report[2].group.model == "sluice-tiny"


async def test_a_tenant_filter_never_counts_another_tenants_rows(ledger: UsageLedger) -> None:
    await write_two_tenants(ledger)
    acme = await ledger.usage_by_tenant(since=T0, until=UNTIL, tenant_id="acme")
    globex = await ledger.usage_by_tenant(since=T0, until=UNTIL, tenant_id="globex")
    assert {u.tenant_id for u in acme} == {"acme"} and {u.tenant_id for u in globex} == {"globex"}
    # globex's row with acme's request id "a-0" (1000 prompt tokens) is not in acme's numbers, and the
    # other way round.
    assert sum(u.prompt_tokens for u in acme) == 7 + 100 + 23
    assert globex == [
        TenantUsage("globex", "sluice-large", BATCH, 1, 0, 3, 4),
        TenantUsage("globex", "sluice-tiny", INTERACTIVE, 1, 1, 1000, 2000),
    ]
    assert await ledger.usage_by_tenant(since=T0, until=UNTIL, tenant_id="initech") == []


async def test_model_and_class_filters_and_the_window_ends(ledger: UsageLedger) -> None:
    await write_two_tenants(ledger)
    large = await ledger.usage_by_tenant(since=T0, until=UNTIL, model="sluice-large")
    assert [(u.tenant_id, u.request_class) for u in large] == [("acme", INTERACTIVE), ("globex", BATCH)]
    batch = await ledger.usage_by_tenant(since=T0, until=UNTIL, request_class=BATCH, tenant_id="acme")
    assert batch == [TenantUsage("acme", "sluice-tiny", BATCH, 1, 0, 100, 1000)]
    # No until: up to now and on, so the row at UNTIL counts; a since one microsecond earlier takes the
    # row before T0. Other timezones are the same instants.
    open_ended = await ledger.usage_by_tenant(since=T0, tenant_id="globex", model="sluice-tiny")
    assert [u.num_requests for u in open_ended] == [2]
    earlier = T0.astimezone(timezone(timedelta(hours=-5))) - timedelta(microseconds=1)
    acme_tiny = await ledger.usage_by_tenant(
        since=earlier, until=UNTIL, tenant_id="acme", model="sluice-tiny"
    )
    assert [u.num_requests for u in acme_tiny] == [1, 7]
    assert await ledger.usage_by_tenant(since=UNTIL + timedelta(days=1)) == []


async def test_bad_arguments_are_refused(ledger: UsageLedger) -> None:
    naive = datetime(2026, 3, 1, 12)
    for kwargs in (
        dict(since=naive),
        dict(since=T0, until=naive),
        dict(since=T0, until=T0),
        dict(since=UNTIL, until=T0),
        dict(since=T0, tenant_id=""),
        dict(since=T0, model=""),
        dict(since=None),
    ):
        with pytest.raises(ValueError):
            await ledger.usage_by_tenant(**kwargs)


async def test_raises_ledger_unavailable_while_postgresql_is_down() -> None:
    ledger = PostgresLedger("postgresql://postgres@127.0.0.1:1/sluice_nowhere", acquire_timeout_s=0.5)
    await ledger.open(keep_trying=True)  # a control plane's start: the server cannot be reached
    try:
        with pytest.raises(LedgerUnavailable, match="unavailable"):
            await ledger.usage_by_tenant(since=T0)
    finally:
        await ledger.close()


# ---- the report window (pure) ----

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "instant"),
    [
        ("24h", NOW - timedelta(hours=24)),
        ("7d", NOW - timedelta(days=7)),
        ("90m", NOW - timedelta(minutes=90)),
        ("2026-11-30T10:00:00Z", datetime(2026, 11, 30, 10, tzinfo=UTC)),
        ("2026-11-30T10:00:00-05:00", datetime(2026, 11, 30, 15, tzinfo=UTC)),
        ("2026-11-30", datetime(2026, 11, 30, tzinfo=UTC)),  # naive is UTC
        ("1764590400", datetime(2025, 12, 1, 12, tzinfo=UTC)),
        ("1764590400.5", datetime(2025, 12, 1, 12, 0, 0, 500000, tzinfo=UTC)),
    ],
)
def test_window_ends_parse_as_aware_utc(text: str, instant: datetime) -> None:
    parsed = parse_instant(text, now=NOW)
    assert parsed == instant and parsed.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "text", ["", "yesterday", "24x", "-24h", "nan", "inf", "1e20", "9999-12-31T23:59:59-05:00", "9999999d"]
)
def test_window_ends_that_are_no_time_are_refused_by_name(text: str) -> None:
    with pytest.raises(WindowError, match=r"^until must be an ISO 8601 time") as refused:
        parse_instant(text, now=NOW, name="until")
    assert refused.value.param == "until"


def test_the_window_defaults_to_the_last_day_and_refuses_an_empty_one() -> None:
    assert report_window(None, None, now=NOW) == (NOW - DEFAULT_WINDOW, NOW)
    end = datetime(2026, 11, 1, tzinfo=UTC)
    assert report_window("", "2026-11-01", now=NOW) == (end - DEFAULT_WINDOW, end)
    for since, until in (("1h", "2h"), ("2026-11-01", "2026-11-01")):
        with pytest.raises(WindowError, match="since must be before until") as refused:
            report_window(since, until, now=NOW)
        assert refused.value.param == "since"
    with pytest.raises(WindowError) as early:
        report_window(None, "0001-01-01T01:00:00Z", now=NOW)
    assert early.value.param == "until"


async def test_the_report_across_tenants_reads_its_window_by_index(tmp_path: Path) -> None:
    """Without a tenant or model the report's read finds its window by the finished_at index (ledger
    migration 6), not by reading every row (SQLite's plan; PostgreSQL has the same index)."""
    ledger = SqliteLedger(tmp_path / "ledger.db")
    await ledger.open()
    await ledger.close()
    sql, params = usage_by_tenant_sql(
        since=T0.isoformat(), until=UNTIL.isoformat(), tenant_id=None, model=None, request_class=None
    )
    with sqlite3.connect(tmp_path / "ledger.db") as conn:
        plan = " ".join(str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    assert "USING INDEX usage_finished" in plan, plan
