"""The weight store against moto's S3 server on 127.0.0.1 (tests/s3_server.py): upload and fetch round
trip, the cache, verification, resume, include and concurrent fetches. Parts are 64 KiB so that a few
hundred KiB make many ranged GETs."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from s3_server import MotoS3
from weight_store_clients import DroppingBodiesClient, InterruptingClient, RangedGetLog, SimulatedInterruption

from sluice.weight_store import (
    CacheError,
    FetchResult,
    IntegrityError,
    Manifest,
    ManifestError,
    ManifestNotFoundError,
    StoreAccessError,
    WeightStore,
    WeightStoreError,
)
from sluice.weights_digest import weights_digest

PART_BYTES = 64 * 1024
MakeStore = Callable[..., tuple[WeightStore, RangedGetLog]]


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    """A small checkpoint-like folder: a weights file of 11 parts, tokenizer files, an empty file, and
    two files with the same bytes (one cached object)."""
    src = tmp_path / "artifact"
    (src / "config").mkdir(parents=True)
    (src / "model.safetensors").write_bytes(os.urandom(10 * PART_BYTES + 123))
    (src / "tokenizer.json").write_bytes(os.urandom(3 * PART_BYTES))
    (src / "tokenizer_config.json").write_text('{"bos": 1}')
    (src / "config" / "empty.txt").write_bytes(b"")
    (src / "config" / "same_as_tokenizer_config.json").write_text('{"bos": 1}')
    return src


@pytest.fixture
def make_store(moto_s3: MotoS3, tmp_path: Path) -> MakeStore:
    """``make_store(client=None, cache=<tmp>/cache, **kw)``: a store on its own client, and the log of its
    ranged GETs. A second store on the same cache is a second replica on the same node."""

    def make(
        client: Any = None, cache: Path | None = None, **kwargs: Any
    ) -> tuple[WeightStore, RangedGetLog]:
        real = moto_s3.client()
        log = RangedGetLog(real)
        store = WeightStore(
            real if client is None else client(real),
            cache or tmp_path / "cache",
            part_size_bytes=PART_BYTES,
            max_concurrency=kwargs.pop("max_concurrency", 4),
            quiet=True,
            **kwargs,
        )
        return store, log

    return make


def _num_parts(folder: Path, part_bytes: int = PART_BYTES) -> int:
    """Ranged GETs a fetch of the folder needs: per distinct content, ceil(size / part)."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    sizes = {hashlib.sha256(p.read_bytes()).hexdigest(): p.stat().st_size for p in files}
    return sum(-(-size // part_bytes) for size in sizes.values())


def _same_files(a: Path, b: Path) -> bool:
    files_a = {p.relative_to(a): p.read_bytes() for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b): p.read_bytes() for p in b.rglob("*") if p.is_file()}
    return files_a == files_b


def _cache_is_clean(cache: Path) -> bool:
    """Every object under objects/ hashes to its name, and no partial download is left."""
    for obj in (cache / "objects").rglob("*"):
        if obj.is_file() and hashlib.sha256(obj.read_bytes()).hexdigest() != obj.name:
            return False
    return not any((cache / "partial").glob("*")) if (cache / "partial").exists() else True


def test_round_trip_gives_the_same_files_and_a_stable_digest(
    make_store: MakeStore, s3_bucket: str, artifact: Path, moto_s3: MotoS3
) -> None:
    (artifact / "big.bin").write_bytes(os.urandom(6 * 1024 * 1024))  # above 5 MiB: a multipart upload
    store, log = make_store()
    operations: list[str] = []
    store.client.meta.events.register(
        "provide-client-params.s3", lambda params, event_name, **_: operations.append(event_name)
    )
    uri = f"s3://{s3_bucket}/checkpoints/tiny/1"
    manifest = store.upload_dir(artifact, uri, {"source": "test", "tool": {"sluice": "0.1"}})

    assert "provide-client-params.s3.CompleteMultipartUpload" in operations
    assert operations[-1] == "provide-client-params.s3.PutObject"  # the manifest, last
    assert store.read_manifest(uri) == manifest
    assert manifest.metadata == {"source": "test", "tool": {"sluice": "0.1"}}
    assert {e.path for e in manifest.files} == {
        p.relative_to(artifact).as_posix() for p in artifact.rglob("*") if p.is_file()
    }

    result = store.fetch_artifact(uri)
    assert _same_files(result.path, artifact)
    assert weights_digest(result.path) == weights_digest(artifact)
    assert result.path.name == manifest.artifact_digest.removeprefix("sha256:")
    assert len(log.ranged) == _num_parts(artifact)
    assert result.num_downloaded_files == len({e.sha256 for e in manifest.files})

    again = store.upload_dir(artifact, f"s3://{s3_bucket}/elsewhere", {"other": "metadata"})
    assert again.artifact_digest == manifest.artifact_digest


def test_a_refetch_of_a_cached_artifact_downloads_nothing(
    make_store: MakeStore, s3_bucket: str, artifact: Path
) -> None:
    uri = f"s3://{s3_bucket}/m/1"
    first, _ = make_store()
    first.upload_dir(artifact, uri)
    folder = first.fetch(uri)

    restarted, log = make_store()  # a restart, or a second replica on the node
    result = restarted.fetch_artifact(uri)
    assert result.path == folder and _same_files(folder, artifact)
    assert (result.num_downloaded_files, result.downloaded_bytes) == (0, 0)
    assert log.ranged == [] and log.num_whole_gets == 1  # the manifest only


def test_a_corrupted_object_is_detected_and_nothing_corrupt_is_cached(
    make_store: MakeStore, s3_bucket: str, artifact: Path, moto_s3: MotoS3, tmp_path: Path
) -> None:
    uri = f"s3://{s3_bucket}/m/1"
    store, _ = make_store()
    store.upload_dir(artifact, uri)
    key = "m/1/model.safetensors"
    good = (artifact / "model.safetensors").read_bytes()
    bad = bytearray(good)
    bad[PART_BYTES + 7] ^= 0xFF  # one flipped byte in the second part, same size
    client = moto_s3.client()
    client.put_object(Bucket=s3_bucket, Key=key, Body=bytes(bad))

    with pytest.raises(IntegrityError, match=f"s3://{s3_bucket}/{key}: sha256 .* does not match") as caught:
        store.fetch(uri)
    assert caught.value.key == key
    cache = tmp_path / "cache"
    assert _cache_is_clean(cache)
    bad_sha = hashlib.sha256(bad).hexdigest()
    assert not (cache / "objects" / bad_sha[:2] / bad_sha).exists()

    client.put_object(Bucket=s3_bucket, Key=key, Body=good[:-1])  # now a different size
    with pytest.raises(IntegrityError, match="manifest says") as caught:
        store.fetch(uri)
    assert caught.value.key == key and _cache_is_clean(cache)

    client.put_object(Bucket=s3_bucket, Key=key, Body=good)  # repaired: the next fetch succeeds
    assert _same_files(store.fetch(uri), artifact)


def test_an_interrupted_download_resumes_without_fetching_finished_parts_again(
    make_store: MakeStore, s3_bucket: str, artifact: Path
) -> None:
    uri = f"s3://{s3_bucket}/m/1"
    uploader, _ = make_store()
    uploader.upload_dir(artifact, uri)
    total_parts = _num_parts(artifact)

    cut: list[InterruptingClient] = []

    def interrupting(real: Any) -> InterruptingClient:
        cut.append(InterruptingClient(real, num_allowed=6))
        return cut[0]

    first, _ = make_store(client=interrupting, max_concurrency=2)
    with pytest.raises(SimulatedInterruption):
        first.fetch(uri)
    finished_first = set(cut[0].completed)
    assert 0 < len(finished_first) < total_parts

    second, log = make_store()
    result = second.fetch_artifact(uri)
    assert _same_files(result.path, artifact)
    assert not finished_first & set(log.ranged)  # no finished part fetched again
    assert len(log.ranged) == total_parts - len(finished_first)
    assert result.num_resumed_files >= 1
    assert _cache_is_clean(second.cache_dir)


def test_include_fetches_only_the_files_it_accepts(
    make_store: MakeStore, s3_bucket: str, artifact: Path
) -> None:
    uri = f"s3://{s3_bucket}/m/1"
    store, log = make_store()
    store.upload_dir(artifact, uri)
    log.ranged.clear()

    folder = store.fetch(uri, include=lambda path: path.startswith("tokenizer"))
    assert log.fetched_keys() == {"m/1/tokenizer.json", "m/1/tokenizer_config.json"}
    fetched = sorted(p.name for p in folder.rglob("*") if p.is_file())
    assert fetched == ["tokenizer.json", "tokenizer_config.json"]

    log.ranged.clear()
    assert _same_files(store.fetch(uri), artifact)  # the rest, and only the rest
    assert "m/1/tokenizer.json" not in log.fetched_keys()
    assert "m/1/model.safetensors" in log.fetched_keys()
    with pytest.raises(WeightStoreError, match="include accepted none"):
        store.fetch(uri, include=lambda path: False)


def test_two_concurrent_fetches_of_one_artifact_end_with_one_correct_copy(
    make_store: MakeStore, s3_bucket: str, artifact: Path, tmp_path: Path
) -> None:
    uri = f"s3://{s3_bucket}/m/1"
    uploader, _ = make_store()
    uploader.upload_dir(artifact, uri)
    replicas = [make_store(), make_store()]  # two stores, two clients, one cache folder
    start = threading.Barrier(2)
    results: list[FetchResult] = []
    errors: list[BaseException] = []

    def run(store: WeightStore) -> None:
        start.wait()
        try:
            results.append(store.fetch_artifact(uri))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(store,)) for store, _ in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and len(results) == 2 and results[0].path == results[1].path
    assert _same_files(results[0].path, artifact)
    assert sum(len(log.ranged) for _, log in replicas) == _num_parts(artifact)  # each part once
    num_objects = len(
        {hashlib.sha256(p.read_bytes()).hexdigest() for p in artifact.rglob("*") if p.is_file()}
    )
    assert sum(r.num_downloaded_files for r in results) == num_objects
    cache = tmp_path / "cache"
    assert _cache_is_clean(cache)
    assert len([p for p in (cache / "objects").rglob("*") if p.is_file()]) == num_objects


def test_a_prefix_without_a_manifest_is_an_incomplete_upload(
    make_store: MakeStore, s3_bucket: str, moto_s3: MotoS3
) -> None:
    store, _ = make_store()
    moto_s3.client().put_object(Bucket=s3_bucket, Key="m/1/model.bin", Body=b"x")
    for call in (store.read_manifest, store.fetch):
        with pytest.raises(ManifestNotFoundError, match="upload did not finish"):
            call(f"s3://{s3_bucket}/m/1")


def test_a_malformed_manifest_in_the_bucket_is_refused_naming_it(
    make_store: MakeStore, s3_bucket: str, moto_s3: MotoS3
) -> None:
    store, _ = make_store()
    moto_s3.client().put_object(Bucket=s3_bucket, Key="m/1/manifest.json", Body=b'{"format": "x"}')
    with pytest.raises(ManifestError, match=f"s3://{s3_bucket}/m/1/manifest.json: format must be"):
        store.fetch(f"s3://{s3_bucket}/m/1")


def test_uploads_refuse_an_empty_folder_or_one_holding_a_manifest(
    make_store: MakeStore, s3_bucket: str, tmp_path: Path
) -> None:
    store, _ = make_store()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ManifestError, match="holds no files"):
        store.upload_dir(tmp_path / "empty", f"s3://{s3_bucket}/m/1")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "manifest.json").write_text("{}")
    with pytest.raises(ManifestError, match="manifest's own key"):
        store.upload_dir(tmp_path / "odd", f"s3://{s3_bucket}/m/1")
    with pytest.raises(FileNotFoundError):
        store.upload_dir(tmp_path / "missing", f"s3://{s3_bucket}/m/1")


def test_a_missing_bucket_is_a_store_access_error(make_store: MakeStore) -> None:
    store, _ = make_store()
    with pytest.raises(StoreAccessError, match="NoSuchBucket"):
        store.read_manifest("s3://no-such-bucket-here/m/1")


def test_the_manifest_read_back_equals_the_one_returned(
    make_store: MakeStore, s3_bucket: str, artifact: Path
) -> None:
    store, _ = make_store()
    manifest = store.upload_dir(artifact, f"s3://{s3_bucket}/m/1", {"k": [1, 2]})
    saved = (store.cache_dir / "artifacts").glob("*.manifest.json")
    assert list(saved) == []  # nothing fetched yet
    store.fetch(f"s3://{s3_bucket}/m/1")
    (saved_path,) = (store.cache_dir / "artifacts").glob("*.manifest.json")
    assert Manifest.from_json(saved_path.read_text()) == manifest


def test_uploading_the_same_files_and_metadata_again_uploads_nothing(
    make_store: MakeStore, s3_bucket: str, artifact: Path, moto_s3: MotoS3
) -> None:
    store, _ = make_store()
    uri = f"s3://{s3_bucket}/m/1"
    first = store.upload_dir(artifact, uri, {"build": 1})
    writes: list[str] = []
    store.client.meta.events.register(
        "provide-client-params.s3",
        lambda event_name, **_: (
            writes.append(event_name) if "Put" in event_name or "Upload" in event_name else None
        ),
    )
    assert store.upload_dir(artifact, uri, {"build": 1}) == first
    assert writes == []

    store.upload_dir(artifact, uri, {"build": 2})  # other metadata: a new manifest
    assert writes and writes[-1].endswith("PutObject")
    assert store.read_manifest(uri).metadata == {"build": 2}

    moto_s3.client().delete_object(Bucket=s3_bucket, Key="m/1/tokenizer.json")
    writes.clear()
    store.upload_dir(artifact, uri, {"build": 2})  # an object went missing: everything again
    assert len(writes) > 1
    assert _same_files(store.fetch(uri), artifact)


def test_a_part_whose_body_breaks_midway_is_fetched_again(
    make_store: MakeStore, s3_bucket: str, artifact: Path
) -> None:
    uri = f"s3://{s3_bucket}/m/1"
    uploader, _ = make_store()
    uploader.upload_dir(artifact, uri)
    store, log = make_store(client=lambda real: DroppingBodiesClient(real, num_broken=2))
    assert _same_files(store.fetch(uri), artifact)
    assert len(log.ranged) == _num_parts(artifact) + 2  # the two broken parts, once more each


def test_a_cache_that_cannot_be_written_is_a_cache_error(
    make_store: MakeStore, s3_bucket: str, artifact: Path, tmp_path: Path
) -> None:
    uri = f"s3://{s3_bucket}/m/1"
    not_a_folder = tmp_path / "cache-file"
    not_a_folder.write_text("")
    store, _ = make_store(cache=not_a_folder)
    store.upload_dir(artifact, uri)
    with pytest.raises(CacheError, match=r"the weight cache at .*cache-file failed"):
        store.fetch(uri)
