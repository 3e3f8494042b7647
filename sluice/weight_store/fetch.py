"""Fetch an artifact into the cache: the files the cache lacks, each split into ranged GETs run in
parallel (parts of several files at once), written in place into a partial file whose finished parts are
recorded, so an interrupted fetch resumes where it stopped; then each file is checked against its sha256
and only then published into the cache. See ``WeightStore.fetch_artifact`` and ``cache.py``."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sluice.weight_store.cache import ObjectCache, PartsRecord
from sluice.weight_store.errors import IntegrityError, WeightStoreError
from sluice.weight_store.manifest import Manifest, ManifestEntry, file_sha256
from sluice.weight_store.progress import Progress
from sluice.weight_store.s3 import store_errors
from sluice.weight_store.uri import S3Uri

log = logging.getLogger(__name__)

_READ_CHUNK_BYTES = 1 << 20
_CONTENT_RANGE_TOTAL = re.compile(r"/(\d+)$")
_MAX_FILES_AT_ONCE = 4


@dataclass(frozen=True)
class FileOutcome:
    downloaded_bytes: int
    resumed: bool


class _Stopped(Exception):
    """Another part or file failed: parts not yet started are skipped (their record stays for a resume)."""


@dataclass
class _Fetch:
    """One fetch call's shared pieces: the client, where the files come from, and the pools."""

    client: Any
    uri: S3Uri
    cache: ObjectCache
    part_size_bytes: int
    part_pool: ThreadPoolExecutor
    progress: Progress
    stop: threading.Event

    def file(self, entry: ManifestEntry) -> FileOutcome:
        """Download, verify and publish one object unless the cache has it (checked under its lock)."""
        with self.cache.lock(entry.sha256):
            if self.cache.has(entry):
                return FileOutcome(0, resumed=False)  # another fetch published it while we waited
            key = self.uri.key(entry.path)
            partial = self.cache.partial_path(entry.sha256)
            record = PartsRecord(
                self.cache.record_path(entry.sha256),
                key=key,
                size_bytes=entry.size_bytes,
                part_size_bytes=self.part_size_bytes,
            )
            done = record.load(partial)
            if not done:
                partial.parent.mkdir(parents=True, exist_ok=True)
                with partial.open("wb") as f:
                    f.truncate(entry.size_bytes)
            num_parts = -(-entry.size_bytes // self.part_size_bytes)
            todo = [i for i in range(num_parts) if i not in done]
            self.progress.add(entry.size_bytes - sum(self._part_len(entry, i) for i in todo))
            fd = os.open(partial, os.O_RDWR)
            try:
                futures = [self.part_pool.submit(self.part, fd, entry, key, i, record) for i in todo]
                _wait_all(futures, self.stop)
                os.fsync(fd)
            except IntegrityError:
                partial.unlink(missing_ok=True)
                record.discard()
                raise
            finally:
                os.close(fd)
            self._verify_and_publish(entry, key, partial, record)
            return FileOutcome(sum(self._part_len(entry, i) for i in todo), resumed=bool(done))

    def part(self, fd: int, entry: ManifestEntry, key: str, index: int, record: PartsRecord) -> None:
        """One ranged GET written at its offset, then recorded as finished."""
        if self.stop.is_set():
            raise _Stopped
        start = index * self.part_size_bytes
        length = self._part_len(entry, index)
        where = f"GET s3://{self.uri.bucket}/{key} bytes {start}-{start + length - 1}"
        with store_errors(where):
            response = self.client.get_object(
                Bucket=self.uri.bucket, Key=key, Range=f"bytes={start}-{start + length - 1}"
            )
            total = _CONTENT_RANGE_TOTAL.search(str(response.get("ContentRange", "")))
            if total is not None and int(total.group(1)) != entry.size_bytes:
                raise IntegrityError(
                    f"s3://{self.uri.bucket}/{key} is {total.group(1)} bytes but its manifest says "
                    f"{entry.size_bytes}: the object was changed after its upload; download discarded",
                    key=key,
                )
            offset = start
            body = response["Body"]
            while chunk := body.read(min(_READ_CHUNK_BYTES, start + length - offset)):
                os.pwrite(fd, chunk, offset)
                offset += len(chunk)
                if offset >= start + length:
                    break
        if offset != start + length:
            raise IntegrityError(
                f"{where}: got {offset - start} bytes, expected {length}: the object is shorter than its "
                "manifest says; download discarded",
                key=key,
            )
        record.mark_done(index)
        self.progress.add(length)

    def _verify_and_publish(
        self, entry: ManifestEntry, key: str, partial: Any, record: PartsRecord
    ) -> None:
        actual = file_sha256(partial)
        if actual != entry.sha256:
            partial.unlink(missing_ok=True)
            record.discard()
            raise IntegrityError(
                f"s3://{self.uri.bucket}/{key}: sha256 {actual} does not match its manifest "
                f"({entry.sha256}); the download was discarded and nothing of it is cached",
                key=key,
            )
        self.cache.publish(partial, entry.sha256)
        record.discard()

    def _part_len(self, entry: ManifestEntry, index: int) -> int:
        start = index * self.part_size_bytes
        return min(self.part_size_bytes, entry.size_bytes - start)


def fetch_files(
    client: Any,
    uri: S3Uri,
    manifest: Manifest,
    cache: ObjectCache,
    *,
    include: Callable[[str], bool] | None,
    part_size_bytes: int,
    max_concurrency: int,
    quiet: bool,
) -> tuple[list[ManifestEntry], list[FileOutcome]]:
    """Make every wanted file of ``manifest`` present in the cache and linked into the artifact's folder.
    Returns the wanted entries and what was done for each object that had to be fetched."""
    wanted = [e for e in manifest.files if include is None or include(e.path)]
    if not wanted:
        raise WeightStoreError(f"{uri}: include accepted none of the artifact's {len(manifest.files)} files")
    by_sha = {e.sha256: e for e in wanted if not cache.has(e)}  # identical files are fetched once
    missing = list(by_sha.values())
    outcomes: list[FileOutcome] = []
    if missing:
        progress = Progress(f"fetch {uri}", sum(e.size_bytes for e in missing), quiet=quiet)
        stop = threading.Event()
        num_file_workers = min(_MAX_FILES_AT_ONCE, len(missing))
        with (
            ThreadPoolExecutor(max_concurrency, thread_name_prefix="weight-part") as part_pool,
            ThreadPoolExecutor(num_file_workers, thread_name_prefix="weight-file") as file_pool,
        ):
            job = _Fetch(client, uri, cache, part_size_bytes, part_pool, progress, stop)
            futures = [file_pool.submit(job.file, e) for e in missing]
            outcomes = _wait_all(futures, stop)
        progress.close()
    view = cache.view_dir(manifest.artifact_digest)
    for entry in wanted:
        cache.link_into_view(view, entry)
    cache.save_manifest(manifest)
    return wanted, outcomes


def _wait_all(futures: list[Future[Any]], stop: threading.Event) -> list[Any]:
    """Every future's result; on the first failure, ``stop`` is set (so queued work is skipped), the rest
    are waited for, and the first real error (not a ``_Stopped``) is raised."""
    results: list[Any] = []
    first_error: BaseException | None = None
    for future in futures:
        try:
            results.append(future.result())
        except BaseException as exc:
            stop.set()
            if first_error is None or isinstance(first_error, _Stopped):
                first_error = exc
    if first_error is not None:
        raise first_error
    return results
