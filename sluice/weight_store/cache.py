"""The local, content-addressed weight cache (``SLUICE_WEIGHT_CACHE_DIR``), shared by every process on a
node::

    objects/<sha[:2]>/<sha>      verified file contents, read-only, named by their sha256
    partial/<sha>.part           a download in progress (the file's full size, parts written in place)
    partial/<sha>.parts          which parts of it are finished (the resume record, appended to)
    locks/<sha>.lock             held (flock) by whoever downloads that object
    artifacts/<digest hex>/      an artifact's folder: hard links to objects, by relative path
    artifacts/<digest hex>.manifest.json

An object appears under ``objects/`` only by an atomic rename after its sha256 was checked, so a reader
never sees a partial or unverified file there. Two fetches of one object (threads or processes) serialise
on its lock file; the second finds the object present and downloads nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sluice.weight_store.manifest import Manifest, ManifestEntry


class ObjectCache:
    """Paths and atomic steps of the cache layout above; holds no state beyond its root."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def object_path(self, sha256: str) -> Path:
        return self.root / "objects" / sha256[:2] / sha256

    def has(self, entry: ManifestEntry) -> bool:
        """Whether the verified object for ``entry`` is present (its size is checked, not re-hashed)."""
        try:
            return self.object_path(entry.sha256).stat().st_size == entry.size_bytes
        except FileNotFoundError:
            return False

    def partial_path(self, sha256: str) -> Path:
        return self.root / "partial" / f"{sha256}.part"

    def record_path(self, sha256: str) -> Path:
        return self.root / "partial" / f"{sha256}.parts"

    @contextmanager
    def lock(self, sha256: str) -> Iterator[None]:
        """Hold the object's lock file (an exclusive flock: other processes and other threads, each with
        their own open file, wait). The kernel drops it if the holder dies, so no stale locks."""
        path = self.root / "locks" / f"{sha256}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    def publish(self, verified_file: Path, sha256: str) -> None:
        """Move a verified file into ``objects/`` (read-only, atomic rename)."""
        target = self.object_path(sha256)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(verified_file, 0o444)
        os.replace(verified_file, target)

    def view_dir(self, artifact_digest: str) -> Path:
        return self.root / "artifacts" / artifact_digest.removeprefix("sha256:")

    def link_into_view(self, view: Path, entry: ManifestEntry) -> None:
        """Make ``view/<entry.path>`` the cached object (a hard link; a copy where links are refused),
        atomically, so a concurrent reader sees either nothing or the whole file."""
        source = self.object_path(entry.sha256)
        dest = view / entry.path
        if dest.exists() and os.path.samefile(source, dest):
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.{uuid.uuid4().hex}")
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)
            os.chmod(tmp, 0o444)
        os.replace(tmp, dest)
        # NOTE: rename() does nothing when both names are already links to one inode (another fetch linked
        # the same object meanwhile), leaving the temporary name behind.
        tmp.unlink(missing_ok=True)

    def save_manifest(self, manifest: Manifest) -> None:
        """Keep the artifact's manifest beside its folder (for operators; the folder holds only files)."""
        path = self.view_dir(manifest.artifact_digest).with_suffix(".manifest.json")
        write_atomically(path, manifest.to_json())


class PartsRecord:
    """Which parts of one partial download are finished: a file whose first line names the download
    (key, size, part size) and each further line one finished part index, appended as it finishes (a
    write of a few bytes, not a rewrite of the whole list, so 10,000 parts cost 10,000 small appends). A
    kill mid-append leaves at most a last line without its newline, which is ignored. A record for another
    download, or whose partial file is missing or of another size, starts over."""

    def __init__(self, path: Path, *, key: str, size_bytes: int, part_size_bytes: int) -> None:
        self.path = path
        self._identity = {"key": key, "size_bytes": size_bytes, "part_size_bytes": part_size_bytes}
        self._num_parts = -(-size_bytes // part_size_bytes)
        self._size_bytes = size_bytes
        self._lock = threading.Lock()
        self._fd: int | None = None

    def open(self, partial: Path) -> set[int]:
        """The parts of ``partial`` already finished (empty: start over, with a new record); after it,
        ``mark_done`` appends to the record until ``close``."""
        done = self._load(partial)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if done:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        else:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(self._fd, (json.dumps(self._identity, sort_keys=True) + "\n").encode())
        return done

    def mark_done(self, part_index: int) -> None:
        with self._lock:
            assert self._fd is not None, "mark_done() before open()"
            os.write(self._fd, f"{part_index}\n".encode())

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def discard(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def _load(self, partial: Path) -> set[int]:
        try:
            header, *lines = self.path.read_text().split("\n")
            if json.loads(header) != self._identity:
                return set()
            if partial.stat().st_size != self._size_bytes:
                return set()
        except (OSError, ValueError):
            return set()
        # lines[-1] is what follows the last newline: "" or a torn line; never trusted.
        return {int(line) for line in lines[:-1] if line.isdigit() and int(line) < self._num_parts}


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
