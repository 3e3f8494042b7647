"""The object store contract, over both backends: a directory (``LocalObjectStore``) and S3
(``S3ObjectStore`` against moto's S3 server on loopback, tests/s3_server.py). Whole writes and replaces,
missing keys, deletes, sorted listing by prefix, bad keys refused, stores under different prefixes of one
bucket never seeing each other's keys, and a store that cannot answer raising ObjectStoreUnavailable."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from ports import free_port
from s3_server import MotoS3, moto_s3  # noqa: F401  (pytest finds fixtures by name)

from sluice.names import parse_files_url
from sluice.settings import Settings, load_settings
from sluice.stores.files.base import ObjectNotFound, ObjectStore, ObjectStoreUnavailable
from sluice.stores.files.local import LocalObjectStore
from sluice.stores.files.s3 import S3ObjectStore
from sluice.stores.openers import open_object_store

pytestmark = pytest.mark.anyio

StoreMaker = Callable[[str], ObjectStore]  # a store under a sub-prefix (S3) or sub-folder (local)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def bucket(moto_s3: MotoS3) -> str:  # noqa: F811
    return moto_s3.create_bucket()


@pytest.fixture(params=["local", "s3"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreMaker:
    if request.param == "local":
        return lambda name: LocalObjectStore(tmp_path / name)
    moto: MotoS3 = request.getfixturevalue("moto_s3")
    bucket: str = request.getfixturevalue("bucket")
    run = tmp_path.name  # unique per test: the module's bucket is shared
    return lambda name: S3ObjectStore(bucket, f"{run}/{name}", endpoint_url=moto.endpoint_url)


@pytest.fixture
async def store(make_store: StoreMaker) -> AsyncIterator[ObjectStore]:
    opened = make_store("main")
    await opened.open()
    yield opened
    await opened.close()


async def test_put_then_get_returns_the_same_bytes(store: ObjectStore) -> None:
    data = bytes(range(256)) * 3 + b"\x00\r\n"
    await store.put("files/acme/a", data)
    assert await store.get("files/acme/a") == data
    await store.put("files/acme/empty", b"")
    assert await store.get("files/acme/empty") == b""


async def test_put_replaces_what_was_there(store: ObjectStore) -> None:
    await store.put("k", b"first version, longer")
    await store.put("k", b"second")
    assert await store.get("k") == b"second"
    assert await store.list("") == ["k"]


async def test_a_missing_key_is_object_not_found(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound):
        await store.get("files/nobody/nothing")
    await store.put("files/acme/a", b"x")
    with pytest.raises(ObjectNotFound):  # a "folder" of keys is not an object
        await store.get("files/acme")


async def test_delete_removes_and_a_missing_key_is_no_error(store: ObjectStore) -> None:
    await store.put("files/acme/a", b"x")
    await store.put("files/acme/b", b"y")
    await store.delete("files/acme/a")
    await store.delete("files/acme/a")
    await store.delete("files/never/was")
    await store.delete("files/acme")  # a "folder": nothing under that key itself
    with pytest.raises(ObjectNotFound):
        await store.get("files/acme/a")
    assert await store.get("files/acme/b") == b"y"


async def test_copy_writes_the_source_whole_under_another_key_and_leaves_the_source(
    store: ObjectStore,
) -> None:
    data = bytes(range(256)) * 40 + b"\r\n"
    await store.put("files/acme/a", data)
    await store.put("batches/acme/b1/input.jsonl", b"what was there before, longer than nothing")
    await store.copy("files/acme/a", "batches/acme/b1/input.jsonl")
    assert await store.get("batches/acme/b1/input.jsonl") == data
    await store.copy("files/acme/a", "batches/acme/b2/input.jsonl")  # a key in no folder yet
    await store.delete("files/acme/a")  # the copy is its own object
    assert await store.get("batches/acme/b2/input.jsonl") == data
    assert await store.list("") == ["batches/acme/b1/input.jsonl", "batches/acme/b2/input.jsonl"]


async def test_copying_a_missing_key_is_object_not_found_and_writes_nothing(store: ObjectStore) -> None:
    await store.put("files/acme/a", b"x")
    for missing in ("files/acme/gone", "files/acme"):  # nothing there; a "folder" of keys
        with pytest.raises(ObjectNotFound) as caught:
            await store.copy(missing, "batches/acme/b1/input.jsonl")
        assert caught.value.args == (missing,)
    assert await store.list("") == ["files/acme/a"]


async def test_list_is_sorted_and_holds_only_keys_under_the_prefix(store: ObjectStore) -> None:
    for key in ["files/b/2", "files/a/1.json", "files/a/1", "files/ab/3", "other/x", "files/a/sub/4"]:
        await store.put(key, b"-")
    assert await store.list("files/a/") == ["files/a/1", "files/a/1.json", "files/a/sub/4"]
    assert await store.list("files/") == [
        "files/a/1",
        "files/a/1.json",
        "files/a/sub/4",
        "files/ab/3",
        "files/b/2",
    ]
    assert await store.list("files/a") == [  # a prefix that is no folder matches as text
        "files/a/1",
        "files/a/1.json",
        "files/a/sub/4",
        "files/ab/3",
    ]
    assert await store.list("nothing/") == []
    assert len(await store.list("")) == 6


async def test_list_pages_through_more_keys_than_one_response_holds(moto_s3: MotoS3, bucket: str) -> None:  # noqa: F811
    store = S3ObjectStore(bucket, "paged", endpoint_url=moto_s3.endpoint_url, list_page_keys=2)
    await store.open()
    try:
        keys = [f"many/{i}" for i in range(5)]
        for key in reversed(keys):
            await store.put(key, b"")
        assert await store.list("many/") == keys
    finally:
        await store.close()


BAD_KEYS = ["", "/abs", "a//b", "a/../b", "..", "a/./b", "trailing/", "sp ace", "a\x00b", "ü", "x" * 513]


async def test_a_bad_key_is_refused_before_any_io(store: ObjectStore) -> None:
    for key in BAD_KEYS:
        calls = (store.get(key), store.put(key, b"x"), store.delete(key), store.copy(key, "ok"),
                 store.copy("ok", key))  # fmt: skip
        for call in calls:
            with pytest.raises(ValueError, match="not an object key"):
                await call
    for prefix in ["../", "/abs/", "a//", "sp ace/"]:
        with pytest.raises(ValueError):
            await store.list(prefix)


async def test_stores_under_two_prefixes_never_see_each_others_keys(make_store: StoreMaker) -> None:
    one, two = make_store("one"), make_store("two")
    await one.open()
    await two.open()
    try:
        await one.put("files/acme/a", b"one's")
        await two.put("files/acme/a", b"two's")
        await two.put("files/acme/b", b"two's only")
        assert await one.get("files/acme/a") == b"one's"
        assert await one.list("") == ["files/acme/a"]
        with pytest.raises(ObjectNotFound):
            await one.get("files/acme/b")
        await one.delete("files/acme/a")
        assert await two.get("files/acme/a") == b"two's"
    finally:
        await one.close()
        await two.close()


async def test_the_local_store_leaves_no_temporary_file_and_lists_none(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "files")
    await store.open()
    await store.put("a/b", b"x" * 100_000)
    assert sorted(p.name for p in (tmp_path / "files" / "a").iterdir()) == ["b"]
    (tmp_path / "files" / "a" / ".b.crashed~tmp").write_bytes(b"half")  # a write a crash cut short
    assert await store.list("") == ["a/b"]


async def test_an_unreachable_s3_is_object_store_unavailable(moto_s3: MotoS3) -> None:  # noqa: F811
    dead = S3ObjectStore("no-server", "p", endpoint_url=f"http://127.0.0.1:{free_port()}", max_attempts=1)
    await dead.open()
    try:
        for call in (dead.get("k"), dead.put("k", b"x"), dead.delete("k"), dead.list("")):
            with pytest.raises(ObjectStoreUnavailable, match="s3://no-server/p"):
                await call
    finally:
        await dead.close()


async def test_a_missing_bucket_is_object_store_unavailable_not_a_missing_key(
    moto_s3: MotoS3,  # noqa: F811
) -> None:
    store = S3ObjectStore("no-such-bucket-here", "p", endpoint_url=moto_s3.endpoint_url, max_attempts=1)
    await store.open()
    try:
        with pytest.raises(ObjectStoreUnavailable, match="NoSuchBucket"):
            await store.get("k")
    finally:
        await store.close()


async def test_a_directory_that_cannot_be_written_is_object_store_unavailable(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "files")
    await store.open()
    (tmp_path / "files" / "a").write_bytes(b"a file where a folder should be")
    with pytest.raises(ObjectStoreUnavailable, match="file store at"):
        await store.put("a/b", b"x")
    with pytest.raises(ObjectStoreUnavailable):  # the root itself cannot be made
        await LocalObjectStore(tmp_path / "files" / "a" / "root").open()
    (tmp_path / "files" / "a").unlink()
    (tmp_path / "files").rename(tmp_path / "moved")  # a store whose folder is gone is broken, not empty
    for call in (store.get("a/b"), store.list("a/")):
        with pytest.raises(ObjectStoreUnavailable, match="no longer a directory"):
            await call


async def test_an_outage_is_reported_by_the_store_once_each_way(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = LocalObjectStore(tmp_path / "files")
    await store.open()
    await store.put("a/b", b"x")
    (tmp_path / "files").rename(tmp_path / "moved")
    with caplog.at_level(logging.DEBUG, logger="sluice.stores.files.local"):
        for _ in range(3):
            with pytest.raises(ObjectStoreUnavailable):
                await store.list("a/")
        (tmp_path / "moved").rename(tmp_path / "files")
        with pytest.raises(ObjectNotFound):  # an answer: the outage is over
            await store.get("a/missing")
        assert await store.get("a/b") == b"x"
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "sluice.stores.files.local"]
    assert [level for level, _ in logged] == ["WARNING", "DEBUG", "DEBUG", "INFO"], logged
    started = logged[0][1]
    assert started.startswith(f"file store at {tmp_path / 'files'} unavailable") and "503" in started
    assert "available again after" in logged[-1][1]


def test_files_url_names_a_bucket_and_a_prefix() -> None:
    assert parse_files_url("s3://my-bucket/sluice/files/") == ("my-bucket", "sluice/files")
    assert parse_files_url("s3://my-bucket") == ("my-bucket", "")
    for bad in ["http://x/y", "s3://Bad_Bucket/p", "s3://b/p", "s3://ok-bucket/a/../b", "s3://ok-bucket/a b"]:
        with pytest.raises(ValueError):
            parse_files_url(bad)
    with pytest.raises(ValueError, match="SLUICE_FILES_URL"):
        load_settings(files_url="file:///tmp")


async def test_settings_pick_the_store(tmp_path: Path, moto_s3: MotoS3) -> None:  # noqa: F811
    local = await open_object_store(Settings(state_dir=tmp_path))
    assert isinstance(local, LocalObjectStore) and local.root == tmp_path / "files"
    remote = await open_object_store(
        Settings(
            state_dir=tmp_path, files_url="s3://some-bucket/pre/fix", s3_endpoint_url=moto_s3.endpoint_url
        )
    )
    try:
        assert isinstance(remote, S3ObjectStore)
        assert (remote.bucket, remote.prefix, remote.endpoint_url) == (
            "some-bucket",
            "pre/fix",
            moto_s3.endpoint_url,
        )
    finally:
        await remote.close()
        await local.close()
