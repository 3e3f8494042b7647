"""The batch store's contract (``sluice.stores.batches.base``), run over SQLite and the real PostgreSQL: the
API's side (tenant-scoped reads, cancel requests), the runner's lease (claim, renew, release, ``LeaseLost``),
committed parts and exact counts, status moves, and what survives a reopen."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from tcp_proxy import TcpProxy

import sluice.stores.batches.store
from sluice.settings import load_settings
from sluice.stores.batches.base import (
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
from sluice.stores.batches.store import PostgresBatchStore, SqliteBatchStore
from sluice.stores.openers import open_batch_store

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LEASE_S = 30.0


@dataclass
class BatchBackend:
    """Fresh store objects on one database (empty at start), and its rows read around the store."""

    make: Callable[[], BatchStore]
    rows: Callable[[str], Awaitable[list[tuple[Any, ...]]]]
    database_url: str | None  # None: SQLite
    execute: Callable[[str], Awaitable[None]]  # a statement, committed


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> BatchBackend:
    if request.param == "sqlite":
        path = tmp_path / "sluice.db"

        async def sqlite_rows(query: str) -> list[tuple[Any, ...]]:
            with closing(sqlite3.connect(path)) as conn:
                return conn.execute(query).fetchall()

        async def sqlite_execute(statement: str) -> None:
            with closing(sqlite3.connect(path)) as conn, conn:
                conn.execute(statement)

        return BatchBackend(lambda: SqliteBatchStore(path), sqlite_rows, None, sqlite_execute)
    url = request.getfixturevalue("pg_schema_url")

    async def pg_rows(query: str) -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            cur = await conn.execute(query.encode())  # bytes: the test's own literal SQL
            return await cur.fetchall()

    async def pg_execute(statement: str) -> None:
        async with await psycopg.AsyncConnection.connect(url) as conn:  # commits at the end
            await conn.execute(statement.encode())

    return BatchBackend(lambda: PostgresBatchStore(url, pool_max_size=4), pg_rows, url, pg_execute)


@pytest.fixture
async def store(backend: BatchBackend) -> AsyncIterator[BatchStore]:
    store = backend.make()
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def new_batch(batch_id: str, tenant_id: str = "acme", *, created_s: float = 0.0, **fields: Any) -> Batch:
    created_at = T0 + timedelta(seconds=created_s)
    return Batch(batch_id=batch_id, tenant_id=tenant_id, endpoint="/v1/chat/completions",
                 input_file_id=f"file-{batch_id}", completion_window="24h",
                 status=fields.pop("status", BatchStatus.VALIDATING), created_at=created_at,
                 expires_at=created_at + timedelta(hours=24), **fields)  # fmt: skip


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def part(seq: int, lines: tuple[int, ...], *, owner: str = "r1", num_failed: int = 0) -> BatchPart:
    error_key = f"batches/b/{owner}/{seq}.err" if num_failed else None
    return BatchPart(seq, owner, lines, len(lines) - num_failed, num_failed, f"batches/b/{owner}/{seq}.out",
                     error_key)  # fmt: skip


async def running(store: BatchStore, batch_id: str, *, total: int = 10, owner: str = "r1") -> Batch:
    """Create ``batch_id`` (the only batch) and have ``owner`` claim it and start it at 1 s."""
    await store.create(new_batch(batch_id))
    claimed = await store.claim(owner, LEASE_S, at(1))
    assert claimed is not None and claimed.batch_id == batch_id
    return await store.advance(batch_id, owner, BatchStatus.IN_PROGRESS, at(1), total=total)


# ----- the API's side -----


async def test_create_then_get_only_for_its_tenant(store: BatchStore) -> None:
    batch = new_batch("batch_a", metadata={"job": "nightly", "team": "search"})
    await store.create(batch)
    assert await store.get("acme", "batch_a") == batch
    with pytest.raises(UnknownBatchError):
        await store.get("globex", "batch_a")  # another tenant's batch is unknown
    with pytest.raises(UnknownBatchError):
        await store.get("acme", "batch_nope")
    with pytest.raises(ValueError, match="exists"):
        await store.create(new_batch("batch_a", "globex"))
    with pytest.raises(ValueError, match="new batch"):
        await store.create(new_batch("batch_b", status=BatchStatus.COMPLETED))
    with pytest.raises(ValueError, match="timezone"):
        await store.create(dataclasses.replace(new_batch("batch_c"), created_at=datetime(2026, 12, 1)))
    assert [b.batch_id for b in await store.list("acme")] == ["batch_a"]


async def test_list_is_newest_first_per_tenant_and_pages_by_cursor(store: BatchStore) -> None:
    for i in range(4):
        await store.create(new_batch(f"batch_{i}", created_s=i))
    await store.create(new_batch("batch_1b", created_s=1))  # same instant as batch_1: id breaks the tie
    await store.create(new_batch("batch_g", "globex", created_s=10))
    expected = ["batch_3", "batch_2", "batch_1b", "batch_1", "batch_0"]
    assert [b.batch_id for b in await store.list("acme")] == expected
    pages, after = [], None
    while page := await store.list("acme", after=after, limit=2):
        pages.append([b.batch_id for b in page])
        after = page[-1].batch_id
    assert pages == [expected[0:2], expected[2:4], expected[4:]]
    assert [b.batch_id for b in await store.list("globex")] == ["batch_g"]
    with pytest.raises(UnknownBatchError):
        await store.list("acme", after="batch_g")  # a cursor of another tenant's
    with pytest.raises(ValueError, match="limit"):
        await store.list("acme", limit=0)


@pytest.mark.parametrize("status", list(BatchStatus))
async def test_request_cancel_moves_only_a_batch_not_yet_ending(
    store: BatchStore, status: BatchStatus
) -> None:
    await store.create(new_batch("batch_a"))
    if status is not BatchStatus.VALIDATING:
        assert await store.claim("r1", LEASE_S, at(1)) is not None
        if status is BatchStatus.CANCELLING:
            await store.request_cancel("acme", "batch_a", at(2))
        else:
            await store.advance("batch_a", "r1", status, at(2))
    before = await store.get("acme", "batch_a")
    with pytest.raises(UnknownBatchError):
        await store.request_cancel("globex", "batch_a", at(3))
    after = await store.request_cancel("acme", "batch_a", at(3))
    if status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS):
        assert after.status is BatchStatus.CANCELLING and after.cancelling_at == at(3)
        assert after == dataclasses.replace(before, status=BatchStatus.CANCELLING, cancelling_at=at(3))
    else:
        assert after == before  # cancelling twice, or an ended batch: nothing changes
    assert await store.get("acme", "batch_a") == after


# ----- the lease -----


async def test_claim_takes_the_oldest_unheld_active_batch(store: BatchStore) -> None:
    assert await store.claim("r1", LEASE_S, at(0)) is None  # nothing to claim
    await store.create(new_batch("batch_new", created_s=3))
    await store.create(new_batch("batch_old", created_s=1))
    await store.create(new_batch("batch_mid", created_s=2, status=BatchStatus.IN_PROGRESS))
    first = await store.claim("r1", LEASE_S, at(10))
    second = await store.claim("r2", 5.0, at(10))
    third = await store.claim("r3", LEASE_S, at(10))
    assert [b.batch_id if b else None for b in (first, second, third)] == [
        "batch_old",
        "batch_mid",
        "batch_new",
    ]
    assert await store.claim("r4", LEASE_S, at(14.9)) is None  # all held
    retaken = await store.claim("r4", LEASE_S, at(15))  # r2's 5 s lease ended at 15 s
    assert retaken is not None and retaken.batch_id == "batch_mid"
    await store.advance("batch_old", "r1", BatchStatus.COMPLETED, at(16))  # ended: released, not claimable
    assert await store.claim("r5", LEASE_S, at(100)) is not None  # batch_new (r3's lease ended at 40 s)
    assert await store.claim("r6", LEASE_S, at(100)) is not None  # batch_mid (r4's ended at 45 s)
    assert await store.claim("r7", LEASE_S, at(100)) is None


async def test_claim_gives_each_tenant_a_running_batch_before_anyone_a_second(store: BatchStore) -> None:
    for i in range(3):
        await store.create(new_batch(f"batch_acme{i}", "acme", created_s=i))
    await store.create(new_batch("batch_globex", "globex", created_s=5))
    await store.create(new_batch("batch_initech", "initech", created_s=6))
    claimed = [await store.claim(f"r{i}", LEASE_S, at(10)) for i in range(4)]
    # acme's oldest, then the other tenants' (newer) before acme's second.
    assert [b.batch_id if b else None for b in claimed] == [
        "batch_acme0", "batch_globex", "batch_initech", "batch_acme1"
    ]  # fmt: skip
    # A lease that ended no longer counts as held: acme's last batch is as welcome as anyone's.
    await store.create(new_batch("batch_globex2", "globex", created_s=7))
    later = await store.claim("r9", LEASE_S, at(100))  # every lease above ended at 40 s
    assert later is not None and later.batch_id == "batch_acme0"


async def test_concurrent_claimers_never_share_a_batch(backend: BatchBackend) -> None:
    stores = [backend.make() for _ in range(4)]  # four runners, each with its own connection(s)
    for s in stores:
        await s.open()
    try:
        for i in range(5):
            await stores[0].create(new_batch(f"batch_{i}", created_s=i))
        claims = await asyncio.gather(*(stores[i % 4].claim(f"r{i}", LEASE_S, at(10)) for i in range(20)))
        won = {b.batch_id: owner for owner, b in zip(range(20), claims, strict=True) if b is not None}
        assert sum(b is not None for b in claims) == 5 and len(won) == 5
        holders = dict(await backend.rows("SELECT batch_id, lease_owner FROM batches"))
        assert holders == {batch_id: f"r{i}" for batch_id, i in won.items()}
    finally:
        for s in stores:
            await s.close()


async def test_renew_and_release_need_the_lease(store: BatchStore) -> None:
    await store.create(new_batch("batch_a"))
    assert await store.claim("r1", 10.0, at(0)) is not None
    renewed = await store.renew("batch_a", "r1", 10.0, at(8))  # now held until 18 s
    assert renewed == await store.get("acme", "batch_a")
    assert await store.claim("r2", 10.0, at(15)) is None
    with pytest.raises(LeaseLost):
        await store.renew("batch_a", "r2", 10.0, at(15))
    await store.release("batch_a", "r2")  # not r2's: nothing happens
    assert await store.claim("r2", 10.0, at(17)) is None
    await store.renew("batch_a", "r1", 10.0, at(30))  # ended at 18 s but nobody claimed it: still r1's
    await store.release("batch_a", "r1")
    with pytest.raises(LeaseLost):
        await store.renew("batch_a", "r1", 10.0, at(31))
    reclaimed = await store.claim("r2", 10.0, at(31))  # released: claimable before 40 s
    assert reclaimed is not None and reclaimed.batch_id == "batch_a"
    with pytest.raises(LeaseLost):
        await store.renew("batch_nope", "r2", 10.0, at(31))
    with pytest.raises(ValueError, match="lease_s"):
        await store.renew("batch_a", "r2", 0.0, at(31))


# ----- parts -----


async def test_commit_part_adds_exact_counts_in_seq_order(store: BatchStore) -> None:
    await running(store, "batch_a", total=10)
    first, second = part(0, (0, 1, 2), num_failed=1), part(1, (5, 3))
    assert await store.commit_part("batch_a", "r1", first) == RequestCounts(10, 2, 1)
    with pytest.raises(ValueError, match="next"):
        await store.commit_part("batch_a", "r1", part(2, (4,)))  # seq 1 is next
    with pytest.raises(ValueError, match=r"already in a committed part: \[2\]"):
        await store.commit_part("batch_a", "r1", part(1, (2, 4)))
    with pytest.raises(ValueError, match="distinct"):
        await store.commit_part("batch_a", "r1", part(1, (4, 4)))
    with pytest.raises(ValueError, match="line indices"):
        await store.commit_part("batch_a", "r1", BatchPart(1, "r1", (4,), 1, 1, "o", "e"))
    with pytest.raises(ValueError, match="written by"):
        await store.commit_part("batch_a", "r1", part(1, (4,), owner="r2"))
    assert await store.commit_part("batch_a", "r1", second) == RequestCounts(10, 4, 1)
    assert await store.parts("batch_a") == [first, second]
    assert (await store.get("acme", "batch_a")).request_counts == RequestCounts(10, 4, 1)
    assert await store.parts("batch_nope") == []


async def test_a_runner_whose_lease_was_taken_records_nothing(store: BatchStore) -> None:
    await running(store, "batch_a", total=4)  # r1 holds it until 31 s
    await store.commit_part("batch_a", "r1", part(0, (0,)))
    taken = await store.claim("r2", LEASE_S, at(40))
    assert taken is not None and taken.request_counts == RequestCounts(4, 1, 0)
    with pytest.raises(LeaseLost):
        await store.commit_part("batch_a", "r1", part(1, (1, 2)))
    with pytest.raises(LeaseLost):
        await store.advance("batch_a", "r1", BatchStatus.FINALIZING, at(41), output_file_id="file-stale")
    with pytest.raises(LeaseLost):
        await store.renew("batch_a", "r1", LEASE_S, at(41))
    await store.release("batch_a", "r1")  # no effect: r2 keeps it
    after = await store.get("acme", "batch_a")
    assert after == taken and await store.parts("batch_a") == [part(0, (0,))]
    assert await store.commit_part("batch_a", "r2", part(1, (1, 2), owner="r2")) == RequestCounts(4, 3, 0)


# ----- status moves -----


async def test_advance_sets_each_timestamp_once_and_an_end_releases_the_lease(store: BatchStore) -> None:
    started = await running(store, "batch_a", total=3)
    assert started.status is BatchStatus.IN_PROGRESS and started.in_progress_at == at(1)
    again = await store.advance("batch_a", "r1", BatchStatus.IN_PROGRESS, at(5))
    assert again.in_progress_at == at(1) and again.request_counts.total == 3  # total kept when not given
    finalizing = await store.advance(
        "batch_a", "r1", BatchStatus.FINALIZING, at(6), output_file_id="file-out"
    )
    assert (finalizing.finalizing_at, finalizing.output_file_id) == (at(6), "file-out")
    done = await store.advance("batch_a", "r1", BatchStatus.COMPLETED, at(7), error_file_id="file-err")
    assert (done.status, done.completed_at, done.output_file_id, done.error_file_id) == (
        BatchStatus.COMPLETED, at(7), "file-out", "file-err")  # fmt: skip
    assert done == await store.get("acme", "batch_a")
    with pytest.raises(LeaseLost):  # released: the runner holds nothing more ...
        await store.renew("batch_a", "r1", LEASE_S, at(8))
    assert await store.claim("r2", LEASE_S, at(8)) is None  # ... and nobody can claim an ended batch


async def test_advance_records_validation_errors(store: BatchStore) -> None:
    await store.create(new_batch("batch_a"))
    assert await store.claim("r1", LEASE_S, at(1)) is not None
    errors = (BatchError("invalid_json", "line 2 is not JSON", line=2),
              BatchError("missing_required_parameter", "no body", line=3, param="body"))  # fmt: skip
    failed = await store.advance("batch_a", "r1", BatchStatus.FAILED, at(2), total=3, errors=errors)
    assert (failed.status, failed.failed_at, failed.errors, failed.request_counts.total) == (
        BatchStatus.FAILED, at(2), errors, 3)  # fmt: skip
    with pytest.raises(ValueError, match="total"):
        await store.advance("batch_a", "r1", BatchStatus.FAILED, at(2), total=-1)


async def test_a_cancel_request_wins_the_race_with_the_runner(store: BatchStore) -> None:
    await running(store, "batch_a", total=2)
    await store.commit_part("batch_a", "r1", part(0, (0,)))
    await store.request_cancel("acme", "batch_a", at(2))
    raced = await store.advance("batch_a", "r1", BatchStatus.FINALIZING, at(3), output_file_id="file-out")
    assert (raced.status, raced.finalizing_at, raced.output_file_id) == (
        BatchStatus.CANCELLING,
        None,
        "file-out",
    )
    raced = await store.advance("batch_a", "r1", BatchStatus.COMPLETED, at(4))
    assert (raced.status, raced.completed_at) == (BatchStatus.CANCELLING, None)
    assert (await store.renew("batch_a", "r1", LEASE_S, at(4))).status is BatchStatus.CANCELLING  # still held
    cancelled = await store.advance("batch_a", "r1", BatchStatus.CANCELLED, at(5))
    assert (cancelled.status, cancelled.cancelling_at, cancelled.cancelled_at) == (
        BatchStatus.CANCELLED, at(2), at(5))  # fmt: skip
    assert cancelled.request_counts == RequestCounts(2, 1, 0)
    assert await store.claim("r2", LEASE_S, at(6)) is None


# ----- durability and schema -----


async def test_everything_is_there_after_a_reopen(backend: BatchBackend) -> None:
    store = backend.make()
    await store.open()
    await running(store, "batch_a", total=5)
    await store.commit_part("batch_a", "r1", part(0, (0, 1), num_failed=1))
    await store.create(new_batch("batch_b", "globex", created_s=2, metadata={"k": "v"}))
    before = [await store.get("acme", "batch_a"), await store.get("globex", "batch_b")]
    await store.close()
    reopened = backend.make()
    await reopened.open()
    try:
        assert [await reopened.get("acme", "batch_a"), await reopened.get("globex", "batch_b")] == before
        assert await reopened.parts("batch_a") == [part(0, (0, 1), num_failed=1)]
        taken = await reopened.claim("r2", LEASE_S, at(10))  # r1's lease lasts to 31 s: batch_b is next
        assert taken is not None and taken.batch_id == "batch_b"
        await reopened.commit_part("batch_a", "r1", part(1, (2,)))  # r1 still holds batch_a
    finally:
        await reopened.close()


async def test_migrations_are_idempotent_and_safe_to_start_concurrently(backend: BatchBackend) -> None:
    a, b = backend.make(), backend.make()
    await asyncio.gather(a.open(), b.open())
    try:
        await a.create(new_batch("batch_a"))
        c = backend.make()
        await c.open()
        assert (await c.get("acme", "batch_a")).batch_id == "batch_a"
        await c.close()
    finally:
        await a.close()
        await b.close()
    rows = await backend.rows("SELECT version FROM schema_migrations WHERE component = 'batches'")
    assert sorted(rows) == [(1,), (2,)]


async def test_result_expiry_and_the_input_copy_round_trip(store: BatchStore) -> None:
    kept = new_batch("batch_a", output_expires_after_s=7200, input_key="batches/acme/batch_a/input.jsonl")
    await store.create(kept)
    await store.create(new_batch("batch_b", created_s=1))
    assert await store.get("acme", "batch_a") == kept
    plain = await store.get("acme", "batch_b")
    assert (plain.output_expires_after_s, plain.input_key) == (None, None)
    claimed = await store.claim("r1", LEASE_S, at(2))
    assert claimed == kept  # the runner's view holds them too
    assert await store.advance("batch_a", "r1", BatchStatus.IN_PROGRESS, at(3)) == dataclasses.replace(
        kept, status=BatchStatus.IN_PROGRESS, in_progress_at=at(3)
    )


async def test_a_batch_written_before_version_2_reads_no_expiry_and_no_input_copy(
    backend: BatchBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a gateway of before: only the first migration
    monkeypatch.setattr(sluice.stores.batches.store, "MIGRATIONS", sluice.stores.batches.store.MIGRATIONS[:1])
    old = backend.make()
    await old.open()
    await old.close()
    monkeypatch.undo()
    await backend.execute(
        "INSERT INTO batches (batch_id, tenant_id, endpoint, input_file_id, completion_window, status,"
        " created_at, expires_at) VALUES ('batch_old', 'acme', '/v1/chat/completions', 'file-batch_old',"
        f" '24h', 'validating', '{T0.isoformat(timespec='microseconds')}',"
        f" '{at(86400).isoformat(timespec='microseconds')}')"
    )
    store = backend.make()
    await store.open()  # applies version 2 to a table with a row in it
    try:
        assert await store.get("acme", "batch_old") == new_batch("batch_old")
        assert (await store.get("acme", "batch_old")).input_key is None  # the runner reads input_file_id
    finally:
        await store.close()


async def test_open_batch_store_follows_the_settings(backend: BatchBackend, tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path / "state", database_url=backend.database_url)
    store = await open_batch_store(settings)
    try:
        expected = PostgresBatchStore if backend.database_url else SqliteBatchStore
        assert type(store) is expected
        await store.create(new_batch("batch_a"))
        assert (await store.get("acme", "batch_a")).batch_id == "batch_a"
    finally:
        await store.close()
    if backend.database_url is None:
        with closing(sqlite3.connect(settings.sqlite_path)) as conn:  # the ledger's file
            assert conn.execute("SELECT batch_id FROM batches").fetchall() == [("batch_a",)]


# ----- outages -----


async def test_postgres_outage_raises_batch_store_unavailable(pg_schema_url: str) -> None:
    info = conninfo_to_dict(pg_schema_url)
    proxy = TcpProxy(str(info.get("host") or "127.0.0.1"), int(str(info.get("port") or 5432)))
    port = await proxy.start()
    store = PostgresBatchStore(make_conninfo(pg_schema_url, host="127.0.0.1", port=port), pool_max_size=1)
    await store.open()
    try:
        await store.create(new_batch("batch_a"))
        await proxy.cut()
        with pytest.raises(BatchStoreUnavailable, match="PostgreSQL"):
            await store.claim("r1", LEASE_S, at(1))
    finally:
        await store.close()
    down = PostgresBatchStore("postgresql://postgres@127.0.0.1:1/sluice_nowhere", acquire_timeout_s=0.5)
    await down.open(keep_trying=True)  # a gateway's start while the server is down
    try:
        with pytest.raises(BatchStoreUnavailable, match="unavailable"):
            await down.get("acme", "batch_a")
    finally:
        await down.close()


async def test_sqlite_failures_raise_batch_store_unavailable(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(BatchStoreUnavailable, match="SQLite"):
        await SqliteBatchStore(tmp_path / "a-file" / "sluice.db").open()  # its directory is a file
    store = SqliteBatchStore(tmp_path / "sluice.db")
    await store.open()
    holder = sqlite3.connect(tmp_path / "sluice.db", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process holding the write lock past the busy timeout
        await store._db.run(lambda tx: tx.execute("PRAGMA busy_timeout = 0"))
        with pytest.raises(BatchStoreUnavailable, match="locked"):
            await store.create(new_batch("batch_a"))
    finally:
        holder.close()
        await store.close()
