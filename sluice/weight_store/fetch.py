"""Fetch an artifact into the cache: the files the cache lacks, each split into ranged GETs run in
parallel (parts of several files at once), written in place into a partial file whose finished parts are
recorded, so an interrupted fetch resumes where it stopped. Each file is hashed while it arrives (the
parts in order, read back from the page cache as soon as they are contiguous), checked against its
sha256, and only then published into the cache. See ``WeightStore.fetch_artifact`` and ``cache.py``."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sluice.weight_store.cache import ObjectCache, PartsRecord
from sluice.weight_store.errors import IntegrityError, StoreAccessError, WeightStoreError
from sluice.weight_store.manifest import Manifest, ManifestEntry
from sluice.weight_store.progress import Progress
from sluice.weight_store.s3 import store_errors
from sluice.weight_store.uri import S3Uri

log = logging.getLogger(__name__)

_READ_CHUNK_BYTES = 1 << 20
_CONTENT_RANGE_TOTAL = re.compile(r"/(\d+)$")
_MAX_FILES_AT_ONCE = 4
_PART_ATTEMPTS = 3


@dataclass(frozen=True)
class FileOutcome:
    """One missing object: whether this fetch downloaded it (False: another fetch on the node published
    it while this one waited for its lock), how many bytes it got, and whether it resumed a partial."""

    downloaded: bool
    downloaded_bytes: int
    resumed: bool


class _Stopped(Exception):
    """Another part or file failed: parts not yet started are skipped (their record stays for a resume)."""


class _InOrderHash:
    """The sha256 of a file whose parts finish in any order: each finished part is hashed as soon as every
    part before it is, by whichever thread finds it next in line (the others do not wait for it)."""

    def __init__(self, fd: int, sizes: list[int], finished: set[int]) -> None:
        self._fd = fd
        self._sizes = sizes
        self._finished = set(finished)
        self._finished_lock = threading.Lock()
        self._hashing = threading.Lock()
        self._sha = hashlib.sha256()
        self._next = 0
        self._offset = 0

    def finished(self, index: int) -> None:
        with self._finished_lock:
            self._finished.add(index)
        self._advance(blocking=False)

    def hexdigest(self) -> str:
        """Once every part has finished: hash what is left in line and return the digest."""
        self._advance(blocking=True)
        assert self._next == len(self._sizes), "hexdigest() before every part finished"
        return self._sha.hexdigest()

    def _advance(self, *, blocking: bool) -> None:
        # NOTE: re-check after releasing: a part that finished while we held the lock found it taken.
        while self._ready() and self._hashing.acquire(blocking=blocking):
            try:
                while self._ready():
                    self._hash_part()
            finally:
                self._hashing.release()

    def _ready(self) -> bool:
        with self._finished_lock:
            return self._next in self._finished

    def _hash_part(self) -> None:
        end = self._offset + self._sizes[self._next]
        while self._offset < end:
            chunk = os.pread(self._fd, min(_READ_CHUNK_BYTES, end - self._offset), self._offset)
            if not chunk:
                raise OSError(f"partial file shorter than {end} bytes")
            self._sha.update(chunk)
            self._offset += len(chunk)
        self._next += 1


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
                return FileOutcome(False, 0, resumed=False)  # another fetch published it meanwhile
            key = self.uri.key(entry.path)
            partial = self.cache.partial_path(entry.sha256)
            record = PartsRecord(
                self.cache.record_path(entry.sha256),
                key=key,
                size_bytes=entry.size_bytes,
                part_size_bytes=self.part_size_bytes,
            )
            done = record.open(partial)
            if not done:
                partial.parent.mkdir(parents=True, exist_ok=True)
                with partial.open("wb") as f:
                    f.truncate(entry.size_bytes)
            sizes = self._part_sizes(entry)
            todo = [i for i in range(len(sizes)) if i not in done]
            self.progress.skip(entry.size_bytes - sum(sizes[i] for i in todo))
            fd = os.open(partial, os.O_RDWR)
            try:
                sha = _InOrderHash(fd, sizes, done)
                futures = [self.part_pool.submit(self.part, fd, entry, key, i, record, sha) for i in todo]
                _wait_all(futures, self.stop)
                os.fsync(fd)
                actual = sha.hexdigest()
                if actual != entry.sha256:
                    raise IntegrityError(
                        f"s3://{self.uri.bucket}/{key}: sha256 {actual} does not match its manifest "
                        f"({entry.sha256}); the download was discarded and nothing of it is cached",
                        key=key,
                    )
            except IntegrityError:
                partial.unlink(missing_ok=True)
                record.discard()
                raise
            finally:
                os.close(fd)
                record.close()
            self.cache.publish(partial, entry.sha256)
            record.discard()
            return FileOutcome(True, sum(sizes[i] for i in todo), resumed=bool(done))

    def part(
        self, fd: int, entry: ManifestEntry, key: str, index: int, record: PartsRecord, sha: _InOrderHash
    ) -> None:
        """One ranged GET written at its offset, then recorded as finished. A transport failure while
        the body streams (which botocore does not retry) is retried from the part's start."""
        start = index * self.part_size_bytes
        end = start + self._part_sizes(entry)[index]  # exclusive
        for attempt in range(1, _PART_ATTEMPTS + 1):
            if self.stop.is_set():
                raise _Stopped
            try:
                self._get_range(fd, entry, key, start, end)
                break
            except StoreAccessError as exc:
                if attempt == _PART_ATTEMPTS or not _is_transport_error(exc):
                    raise
                log.warning("%s (attempt %d of %d); retrying the part", exc, attempt, _PART_ATTEMPTS)
        record.mark_done(index)
        self.progress.add(end - start)
        sha.finished(index)

    def _get_range(self, fd: int, entry: ManifestEntry, key: str, start: int, end: int) -> None:
        where = f"GET s3://{self.uri.bucket}/{key} bytes {start}-{end - 1}"
        with store_errors(where):
            response = self.client.get_object(
                Bucket=self.uri.bucket, Key=key, Range=f"bytes={start}-{end - 1}"
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
            while offset < end and (chunk := body.read(min(_READ_CHUNK_BYTES, end - offset))):
                os.pwrite(fd, chunk, offset)
                offset += len(chunk)
        if offset != end:
            raise IntegrityError(
                f"{where}: got {offset - start} bytes: the object is shorter than its manifest says; "
                "download discarded",
                key=key,
            )

    def _part_sizes(self, entry: ManifestEntry) -> list[int]:
        starts = range(0, entry.size_bytes, self.part_size_bytes)
        return [min(self.part_size_bytes, entry.size_bytes - start) for start in starts]


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
        with (
            ThreadPoolExecutor(max_concurrency, thread_name_prefix="weight-part") as part_pool,
            ThreadPoolExecutor(
                min(_MAX_FILES_AT_ONCE, len(missing)), thread_name_prefix="weight-file"
            ) as files,
        ):
            job = _Fetch(client, uri, cache, part_size_bytes, part_pool, progress, stop)
            outcomes = _wait_all([files.submit(job.file, e) for e in missing], stop)
        progress.close()
    view = cache.view_dir(manifest.artifact_digest)
    for entry in wanted:
        cache.link_into_view(view, entry)
    cache.save_manifest(manifest)
    return wanted, outcomes


def _is_transport_error(exc: StoreAccessError) -> bool:
    """A connection or read failure (worth another try), not a refusal by the server."""
    from botocore.exceptions import BotoCoreError

    return isinstance(exc.__cause__, BotoCoreError)


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
