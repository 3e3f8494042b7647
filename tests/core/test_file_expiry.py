"""Files that expire (OpenAI's ``expires_after``), over a directory store: ``expires_at`` is the creation
time plus the seconds asked; from that instant the file is unknown to every read (get, content, list, a
copy of its content) though its objects stay, until ``sweep_expired`` deletes them (metadata first, only
expired files, every tenant's, nothing else in the store; a second sweep, or two at once, is harmless);
metadata written before files could expire never expires."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sluice.stores.files.base import ObjectStore
from sluice.stores.files.catalog import FileCatalog, UnknownFileError
from sluice.stores.files.local import LocalObjectStore

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOUR_S = 3600


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class DeleteOrder(LocalObjectStore):
    """A directory store that records the keys it deletes, in order."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.deleted: list[str] = []

    async def delete(self, key: str) -> None:
        self.deleted.append(key)
        await super().delete(key)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[DeleteOrder]:
    opened = DeleteOrder(tmp_path / "files")
    await opened.open()
    yield opened
    await opened.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def catalog(store: ObjectStore, clock: Clock) -> FileCatalog:
    return FileCatalog(store, clock=clock)


async def test_expires_at_is_the_creation_plus_the_seconds_asked_and_round_trips(
    catalog: FileCatalog, store: ObjectStore, clock: Clock
) -> None:
    stored = await catalog.create("acme", "a.jsonl", "batch", b"x\n", expires_after_s=HOUR_S)
    assert (stored.created_at, stored.expires_at) == (T0, T0 + timedelta(seconds=HOUR_S))
    assert await FileCatalog(store, clock=clock).get("acme", stored.file_id) == stored
    forever = await catalog.create("acme", "b.jsonl", "batch", b"y\n")
    assert forever.expires_at is None
    for bad_s in (0, -5):
        with pytest.raises(ValueError, match="expires_after_s"):
            await catalog.create("acme", "c.jsonl", "batch", b"z\n", expires_after_s=bad_s)


async def test_an_expired_file_is_unknown_to_every_read_before_it_is_deleted(
    catalog: FileCatalog, store: ObjectStore, clock: Clock
) -> None:
    expiring = await catalog.create("acme", "a.jsonl", "batch", b"x\n", expires_after_s=HOUR_S)
    kept = await catalog.create("acme", "b.jsonl", "batch", b"y\n")
    clock.advance(HOUR_S - 1)
    assert await catalog.get("acme", expiring.file_id) == expiring
    await catalog.copy_content("acme", expiring.file_id, "batches/acme/b1/input.jsonl")
    assert await store.get("batches/acme/b1/input.jsonl") == b"x\n"
    clock.advance(1)  # expires_at itself: expired
    for call in (catalog.get, catalog.content, catalog.delete):
        with pytest.raises(UnknownFileError):
            await call("acme", expiring.file_id)
    with pytest.raises(UnknownFileError):
        await catalog.copy_content("acme", expiring.file_id, "batches/acme/b2/input.jsonl")
    assert await catalog.list("acme") == [kept]
    assert f"files/acme/{expiring.file_id}.json" in await store.list("files/acme/")  # not deleted yet
    assert await store.get("batches/acme/b1/input.jsonl") == b"x\n"  # a copy made before is its own


async def test_metadata_without_expires_at_never_expires(
    catalog: FileCatalog, store: ObjectStore, clock: Clock
) -> None:
    file_id = "file-" + "0a" * 12
    old = {"file_id": file_id, "tenant_id": "acme", "filename": "old.jsonl", "purpose": "batch",
           "num_bytes": 2, "created_at": "2025-01-01T00:00:00+00:00"}  # fmt: skip
    await store.put(f"files/acme/{file_id}", b"o\n")
    await store.put(f"files/acme/{file_id}.json", json.dumps(old).encode())
    clock.advance(10 * 365 * 24 * HOUR_S)
    stored = await catalog.get("acme", file_id)
    assert stored.expires_at is None and await catalog.content("acme", file_id) == b"o\n"
    assert await catalog.sweep_expired() == []
    assert [f.file_id for f in await catalog.list("acme")] == [file_id]


async def test_the_sweep_deletes_every_tenants_expired_files_metadata_first_and_nothing_else(
    catalog: FileCatalog, store: DeleteOrder, clock: Clock
) -> None:
    acme_old = await catalog.create("acme", "a.jsonl", "batch", b"a\n", expires_after_s=HOUR_S)
    globex_old = await catalog.create("globex", "g.jsonl", "batch_output", b"g\n", expires_after_s=HOUR_S)
    later = await catalog.create("acme", "l.jsonl", "batch", b"l\n", expires_after_s=2 * HOUR_S)
    forever = await catalog.create("globex", "f.jsonl", "batch", b"f\n")
    await store.put("batches/acme/b1/input.jsonl", b"a batch's own copy\n")
    await store.put("files/acme/file-" + "cd" * 12, b"an upload whose metadata is not written yet\n")
    assert await catalog.sweep_expired() == []  # nothing expired yet
    clock.advance(HOUR_S)
    swept = await catalog.sweep_expired()
    assert sorted(f.file_id for f in swept) == sorted([acme_old.file_id, globex_old.file_id])
    for stored in swept:
        metadata = store.deleted.index(f"files/{stored.tenant_id}/{stored.file_id}.json")
        assert store.deleted.index(f"files/{stored.tenant_id}/{stored.file_id}") == metadata + 1
    assert sorted(await store.list("")) == sorted([
        f"files/acme/{later.file_id}", f"files/acme/{later.file_id}.json",
        f"files/globex/{forever.file_id}", f"files/globex/{forever.file_id}.json",
        "batches/acme/b1/input.jsonl", "files/acme/file-" + "cd" * 12,
    ])  # fmt: skip
    assert await catalog.sweep_expired() == []


async def test_sweeps_at_once_on_several_gateways_are_harmless(store: ObjectStore, clock: Clock) -> None:
    catalogs = [FileCatalog(store, clock=clock) for _ in range(3)]  # three gateways, one store
    created = [
        await catalogs[0].create("acme", f"{i}.jsonl", "batch", b"x\n", expires_after_s=HOUR_S)
        for i in range(20)
    ]
    clock.advance(HOUR_S)
    results = await asyncio.gather(*(c.sweep_expired() for c in catalogs))
    swept = {f.file_id for result in results for f in result}
    assert swept == {f.file_id for f in created}
    assert await store.list("") == []
