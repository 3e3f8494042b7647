"""The registry's change feed, concurrency and outages, over every backend: a change made through another
registry object on the same database reaches ``wait_for_change`` within a second (on PostgreSQL by NOTIFY,
and by polling while the LISTEN connection is lost), concurrent writers never share a generation,
snapshots are consistent under writes, and an unreachable database raises ``RegistryUnavailable``."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from registry_backends import RegistryBackend
from tcp_proxy import TcpProxy

from sluice.settings import load_settings
from sluice.stores.openers import open_registry
from sluice.stores.registry.base import Registry, RegistryUnavailable
from sluice.stores.registry.feed import LISTEN_APPLICATION_NAME
from sluice.stores.registry.postgres import PostgresRegistry
from sluice.stores.registry.sqlite import SqliteRegistry
from sluice.stores.transactions import Tx

pytestmark = pytest.mark.anyio

DIGEST = "sha256:" + "cd" * 32


async def add(registry: Registry, version: str, model: str = "tiny") -> None:
    await registry.add_version(
        model, version, artifact_uri=f"file:///m/{version}", weights_digest=DIGEST, build_config={}, actor="t"
    )


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def seen_within(follower: Registry, writer: Registry, bound_s: float = 1.0) -> float:
    """Seconds from a write through ``writer`` to ``follower.wait_for_change`` returning its generation;
    fails past ``bound_s``."""
    after = await follower.generation()
    waiting = asyncio.create_task(follower.wait_for_change(after, timeout_s=10.0))
    await asyncio.sleep(0.3)  # the follower is inside its wait, past its first read
    assert not waiting.done()
    written_at = time.monotonic()
    await writer.create_model(f"m{after}", actor="writer")
    generation = await asyncio.wait_for(waiting, bound_s + 1.0)
    elapsed_s = time.monotonic() - written_at
    assert generation == after + 1
    assert elapsed_s < bound_s, f"the change took {elapsed_s:.2f} s to arrive"
    return elapsed_s


async def test_wait_for_change_returns_at_once_or_at_the_timeout(registry: Registry) -> None:
    assert await registry.wait_for_change(0, timeout_s=0) == 0
    started = time.monotonic()
    assert await registry.wait_for_change(0, timeout_s=0.3) == 0
    assert 0.25 < time.monotonic() - started < 2.0
    await registry.create_model("tiny", actor="a")
    started = time.monotonic()
    assert await registry.wait_for_change(0, timeout_s=10) == 1
    assert time.monotonic() - started < 0.5
    with pytest.raises(ValueError):
        await registry.wait_for_change(-1, timeout_s=1)
    with pytest.raises(ValueError):
        await registry.wait_for_change(0, timeout_s=float("inf"))


async def test_a_change_through_another_object_is_seen_within_a_second(backend: RegistryBackend) -> None:
    async with backend.opened() as follower, backend.opened() as writer:
        if isinstance(follower, PostgresRegistry):
            await wait_until(lambda: follower.is_listening)
        await seen_within(follower, writer)
        await seen_within(follower, follower)  # and through the same object


async def test_postgres_changes_arrive_by_notify(pg_url: str) -> None:
    """Polling is made too slow to meet the bound: only a NOTIFY can wake the follower in time."""
    follower = PostgresRegistry(pg_url, poll_interval_s=30.0, listen_check_interval_s=30.0)
    writer = PostgresRegistry(pg_url, poll_interval_s=30.0, listen_check_interval_s=30.0)
    await follower.open()
    await writer.open()
    try:
        await wait_until(lambda: follower.is_listening)
        for _ in range(3):
            await seen_within(follower, writer)
    finally:
        await follower.close()
        await writer.close()


async def _listener_pids(url: str) -> set[int]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        cur = await admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
            (LISTEN_APPLICATION_NAME,),
        )
        return {pid for (pid,) in await cur.fetchall()}


async def _terminate(url: str, pids: set[int]) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        for pid in pids:
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def test_postgres_falls_back_to_polling_while_listen_is_lost(pg_url: str) -> None:
    follower = PostgresRegistry(
        pg_url, poll_interval_s=0.2, listen_check_interval_s=30.0, listen_retry_initial_s=60.0
    )
    writer = PostgresRegistry(pg_url, listen_retry_initial_s=60.0)
    await follower.open()
    await writer.open()
    try:
        await wait_until(lambda: follower.is_listening and writer.is_listening)
        pids = await _listener_pids(pg_url)
        assert len(pids) == 2
        await _terminate(pg_url, pids)
        await wait_until(lambda: not follower.is_listening and not writer.is_listening)
        assert await _listener_pids(pg_url) == set()  # nobody listens: no NOTIFY can arrive
        for _ in range(2):
            await seen_within(follower, writer)  # so this is the polling
    finally:
        await follower.close()
        await writer.close()


async def test_postgres_listen_reconnects_after_it_is_lost(pg_url: str) -> None:
    follower = PostgresRegistry(pg_url, poll_interval_s=30.0, listen_retry_initial_s=0.05)
    writer = PostgresRegistry(pg_url, poll_interval_s=30.0)
    await follower.open()
    await writer.open()
    try:
        await wait_until(lambda: follower.is_listening and writer.is_listening)
        old = await _listener_pids(pg_url)
        await _terminate(pg_url, old)
        deadline = time.monotonic() + 5.0
        while not (await _listener_pids(pg_url)) - old or not follower.is_listening:
            assert time.monotonic() < deadline, "the LISTEN connection did not come back"
            await asyncio.sleep(0.05)
        await seen_within(follower, writer)  # by NOTIFY again: polling is at 30 s
    finally:
        await follower.close()
        await writer.close()


async def test_concurrent_writers_never_share_a_generation(backend: RegistryBackend) -> None:
    num_writers, num_writes = 4, 6
    async with backend.opened() as first:
        await first.create_model("tiny", actor="setup")
        writers = [backend.make() for _ in range(num_writers)]
        await asyncio.gather(*(w.open() for w in writers))
        try:

            async def write(i: int) -> None:
                for j in range(num_writes):
                    await add(writers[i], f"w{i}-{j}")

            await asyncio.gather(*(write(i) for i in range(num_writers)))
        finally:
            await asyncio.gather(*(w.close() for w in writers))
        total = 1 + num_writers * num_writes
        assert await first.generation() == total
        entries = await first.changes(after_generation=0)
        assert [e.generation for e in entries] == list(range(1, total + 1))
        assert len({e.subject for e in entries[1:]}) == num_writers * num_writes


async def test_snapshots_are_consistent_under_concurrent_writes(backend: RegistryBackend) -> None:
    """Every change after the first adds one version, so a consistent snapshot has exactly
    ``generation - 1`` versions."""
    async with backend.opened() as writer, backend.opened() as reader:
        await writer.create_model("tiny", actor="setup")
        done = asyncio.Event()

        async def write() -> None:
            try:
                for i in range(40):
                    await add(writer, f"v{i:02d}")
            finally:
                done.set()

        task = asyncio.create_task(write())
        num_snapshots = 0
        while not done.is_set():
            snap = await reader.snapshot()
            assert len(snap.versions) == snap.generation - 1
            num_snapshots += 1
        await task
        assert num_snapshots > 1
        assert len((await reader.snapshot()).versions) == 40


async def test_postgres_outage_raises_registry_unavailable(pg_url: str) -> None:
    info = conninfo_to_dict(pg_url)
    proxy = TcpProxy(str(info.get("host") or "127.0.0.1"), int(str(info.get("port") or 5432)))
    port = await proxy.start()
    url = make_conninfo(pg_url, host="127.0.0.1", port=port)
    registry = PostgresRegistry(url, pool_max_size=1, pool_acquire_timeout_s=1.0)
    await registry.open()
    try:
        await registry.create_model("tiny", actor="a")
        await proxy.cut()
        for call in (
            registry.generation,
            registry.snapshot,
            lambda: registry.create_model("small", actor="a"),
            lambda: registry.wait_for_change(0, timeout_s=1),
        ):
            with pytest.raises(RegistryUnavailable, match="PostgreSQL"):
                await call()
        await proxy.restore()
        await wait_until_true(registry.generation, 1)
    finally:
        await registry.close()
        await proxy.cut()


async def wait_until_true(read: Callable[[], object], expected: object, timeout_s: float = 10.0) -> None:
    """Call ``read`` until it returns ``expected`` (an outage raising meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if await read() == expected:  # type: ignore[misc]
                return
        except RegistryUnavailable:
            pass
        assert time.monotonic() < deadline, "never recovered"
        await asyncio.sleep(0.1)


async def test_postgres_down_at_start(pg_url: str) -> None:
    """With ``keep_trying`` (a gateway's start) the open returns, calls raise ``RegistryUnavailable`` until
    the server answers, then the registry opens on its own."""
    info = conninfo_to_dict(pg_url)
    proxy = TcpProxy(str(info.get("host") or "127.0.0.1"), int(str(info.get("port") or 5432)))
    await proxy.start()
    await proxy.cut()
    url = make_conninfo(pg_url, host="127.0.0.1", port=proxy.port)
    registry = PostgresRegistry(url, pool_acquire_timeout_s=1.0)
    await registry.open(keep_trying=True)
    try:
        with pytest.raises(RegistryUnavailable):
            await registry.generation()
        await proxy.restore()
        await wait_until_true(registry.generation, 0)
    finally:
        await registry.close()
        await proxy.cut()


async def test_sqlite_failures_raise_registry_unavailable(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(RegistryUnavailable, match="SQLite"):
        await SqliteRegistry(tmp_path / "a-file" / "sluice.db").open()  # its directory is a file
    registry = SqliteRegistry(tmp_path / "sluice.db")
    await registry.open()
    try:
        await registry.create_model("tiny", actor="a")

        async def refuse(tx: Tx) -> None:
            raise sqlite3.OperationalError("database is locked")  # what a writer past busy_timeout sees

        with pytest.raises(RegistryUnavailable, match="locked"):
            await registry._db.run(refuse)

        async def bug(tx: Tx) -> None:
            await tx.execute("SELECT * FROM no_such_table")

        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await registry._db.run(bug)  # our own mistake is not an outage
    finally:
        await registry.close()


async def test_a_locked_sqlite_file_raises_registry_unavailable(tmp_path: Path) -> None:
    """Another process holding the write lock past the busy timeout: the write is refused as an outage
    and nothing moves."""
    registry = SqliteRegistry(tmp_path / "sluice.db")
    registry._db._db._busy_timeout_s = 0.2  # a short wait, so the test is quick
    await registry.open()
    try:
        await registry.create_model("tiny", actor="a")
        holder = sqlite3.connect(tmp_path / "sluice.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(RegistryUnavailable, match="locked"):
                await registry.create_model("small", actor="a")
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert await registry.generation() == 1
    finally:
        await registry.close()


async def test_migrations_are_idempotent_and_safe_to_start_concurrently(backend: RegistryBackend) -> None:
    a, b = backend.make(), backend.make()
    await asyncio.gather(a.open(), b.open())
    try:
        await a.create_model("tiny", actor="a")
        async with backend.opened() as c:
            assert [m.name for m in await c.list_models()] == ["tiny"]
    finally:
        await a.close()
        await b.close()


async def test_the_opener_picks_the_backend_from_settings(backend: RegistryBackend, tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path / "state", database_url=backend.database_url)
    registry = await open_registry(settings)
    try:
        expected = PostgresRegistry if backend.database_url else SqliteRegistry
        assert type(registry) is expected
        await registry.create_model("tiny", actor="a")
        assert await registry.generation() == 1
    finally:
        await registry.close()
    assert (backend.database_url is None) == settings.sqlite_path.exists()
