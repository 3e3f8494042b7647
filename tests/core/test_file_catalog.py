"""The file catalog over a directory store: what a file's metadata says, newest-first listing by
purpose, unknown and malformed ids, deletion, the layout in the store (content first, metadata last), and
a tenant never reaching another tenant's file whatever id it sends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sluice.stores.files.base import ObjectStore
from sluice.stores.files.catalog import FileCatalog, StoredFile, UnknownFileError
from sluice.stores.files.local import LocalObjectStore

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ObjectStore]:
    opened = LocalObjectStore(tmp_path / "files")
    await opened.open()
    yield opened
    await opened.close()


@pytest.fixture
def catalog(store: ObjectStore) -> FileCatalog:
    return FileCatalog(store)


async def test_a_created_file_has_its_metadata_and_content(catalog: FileCatalog) -> None:
    before = datetime.now(UTC)
    stored = await catalog.create("acme", "in put.jsonl", "batch", b'{"custom_id": "a"}\n')
    assert stored.file_id.startswith("file-") and len(stored.file_id) >= 5 + 24
    assert (stored.tenant_id, stored.filename, stored.purpose, stored.num_bytes) == (
        "acme",
        "in put.jsonl",
        "batch",
        19,
    )
    assert before <= stored.created_at <= datetime.now(UTC) and stored.created_at.tzinfo is UTC
    assert await catalog.get("acme", stored.file_id) == stored
    assert await catalog.content("acme", stored.file_id) == b'{"custom_id": "a"}\n'


async def test_content_and_metadata_live_under_the_tenants_prefix(
    catalog: FileCatalog, store: ObjectStore
) -> None:
    stored = await catalog.create("acme", "a.jsonl", "batch", b"x\n")
    assert await store.list("") == [f"files/acme/{stored.file_id}", f"files/acme/{stored.file_id}.json"]


async def test_a_file_without_metadata_does_not_exist(catalog: FileCatalog, store: ObjectStore) -> None:
    orphan = "file-" + "0" * 24  # content written, then the process died before the metadata
    await store.put(f"files/acme/{orphan}", b"half an upload")
    with pytest.raises(UnknownFileError):
        await catalog.get("acme", orphan)
    with pytest.raises(UnknownFileError):
        await catalog.content("acme", orphan)
    assert await catalog.list("acme") == []


async def test_list_is_newest_first_and_filters_by_purpose(catalog: FileCatalog) -> None:
    first = await catalog.create("acme", "1.jsonl", "batch", b"1\n")
    output = await catalog.create("acme", "1_output.jsonl", "batch_output", b"o\n")
    second = await catalog.create("acme", "2.jsonl", "batch", b"2\n")
    await catalog.create("globex", "g.jsonl", "batch", b"g\n")
    assert [f.file_id for f in await catalog.list("acme")] == [second.file_id, output.file_id, first.file_id]
    assert [f.file_id for f in await catalog.list("acme", "batch")] == [second.file_id, first.file_id]
    assert await catalog.list("acme", "batch_output") == [output]
    assert await catalog.list("nobody") == []


async def test_unknown_and_malformed_ids_are_unknown(catalog: FileCatalog) -> None:
    stored = await catalog.create("acme", "a.jsonl", "batch", b"a\n")
    for file_id in [
        "file-" + "f" * 24,
        "file-xyz",
        "",
        "../globex/" + stored.file_id,
        stored.file_id + ".json",
        stored.file_id.upper(),
        "file-" + "a" * 200,
    ]:
        for call in (catalog.get, catalog.content, catalog.delete):
            with pytest.raises(UnknownFileError):
                await call("acme", file_id)


async def test_a_tenant_never_reaches_another_tenants_file(catalog: FileCatalog) -> None:
    theirs = await catalog.create("globex", "secret.jsonl", "batch", b"globex's lines\n")
    for call in (catalog.get, catalog.content, catalog.delete):
        with pytest.raises(UnknownFileError):
            await call("acme", theirs.file_id)
    assert await catalog.list("acme") == []
    assert await catalog.content("globex", theirs.file_id) == b"globex's lines\n"  # the failed delete


async def test_delete_removes_the_file_and_returns_what_it_was(
    catalog: FileCatalog, store: ObjectStore
) -> None:
    kept = await catalog.create("acme", "kept.jsonl", "batch", b"k\n")
    gone = await catalog.create("acme", "gone.jsonl", "batch", b"g\n")
    assert await catalog.delete("acme", gone.file_id) == gone
    with pytest.raises(UnknownFileError):
        await catalog.get("acme", gone.file_id)
    with pytest.raises(UnknownFileError):
        await catalog.delete("acme", gone.file_id)
    assert await catalog.list("acme") == [kept]
    assert await store.list("files/acme/") == [
        f"files/acme/{kept.file_id}",
        f"files/acme/{kept.file_id}.json",
    ]


async def test_an_unknown_purpose_or_a_bad_tenant_is_refused(catalog: FileCatalog) -> None:
    with pytest.raises(ValueError, match="purpose"):
        await catalog.create("acme", "a.jsonl", "fine-tune", b"x")
    with pytest.raises(ValueError, match="tenant_id"):
        await catalog.create("../acme", "a.jsonl", "batch", b"x")
    with pytest.raises(ValueError, match="tenant_id"):
        await catalog.list("Acme/")


async def test_metadata_round_trips_through_a_new_catalog(store: ObjectStore) -> None:
    created = await FileCatalog(store).create("acme", "naïve 名前.jsonl", "batch_output", b"x" * 1000)
    reread = await FileCatalog(store).get("acme", created.file_id)
    assert reread == created
    assert isinstance(reread, StoredFile) and reread.created_at.utcoffset() == timedelta(0)


async def test_a_named_file_id_written_twice_is_one_file(catalog: FileCatalog, store: ObjectStore) -> None:
    file_id = "file-" + "ab" * 12
    await catalog.create("acme", "out.jsonl", "batch_output", b"first\n", file_id=file_id)
    again = await catalog.create("acme", "out.jsonl", "batch_output", b"second\n", file_id=file_id)
    assert again.file_id == file_id and await catalog.content("acme", file_id) == b"second\n"
    assert [f.file_id for f in await catalog.list("acme")] == [file_id]
    with pytest.raises(ValueError):
        await catalog.create("acme", "out.jsonl", "batch_output", b"x", file_id="file-../../etc")
