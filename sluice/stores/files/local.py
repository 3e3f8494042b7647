"""The embedded object store: one file per key under a root directory (``<state_dir>/files`` by default).

A write goes to a temporary file beside its target, is flushed to disk, then renamed over it
(``os.replace``), so a reader sees the old bytes or the new ones, never part of either, and a crash leaves
at most a stray temporary file (its name holds ``~``, which no key may, so ``list`` never shows it).
Blocking file I/O runs in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from sluice.outages import OutageLog
from sluice.stores.files.base import ObjectNotFound, ObjectStore, ObjectStoreUnavailable, check_key, reported

T = TypeVar("T")
log = logging.getLogger(__name__)

_TEMP_SUFFIX = "~tmp"  # "~" is outside the key alphabet (sluice.stores.files.base.check_key)


class LocalObjectStore(ObjectStore):
    def __init__(self, root: Path) -> None:
        self.root = root
        self._outage = OutageLog(log, f"file store at {root}")

    def __repr__(self) -> str:
        return f"LocalObjectStore({str(self.root)!r})"

    async def open(self) -> None:
        await self._run(self.root.mkdir, parents=True, exist_ok=True)

    async def close(self) -> None:
        return None

    async def put(self, key: str, data: bytes) -> None:
        check_key(key)
        await self._run(self._put, self.root / key, data)

    async def get(self, key: str) -> bytes:
        check_key(key)
        return await self._run(self._get, key)

    async def copy(self, src_key: str, dst_key: str) -> None:
        check_key(src_key)
        check_key(dst_key)
        await self._run(self._copy, src_key, self.root / dst_key)

    async def delete(self, key: str) -> None:
        check_key(key)
        await self._run(self._delete, self.root / key)

    async def list(self, prefix: str) -> list[str]:
        _check_prefix(prefix)
        return await self._run(_list_keys, self.root, prefix)

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a worker thread (``_guarded``), the store's outage reported."""
        return await reported(self._outage, asyncio.to_thread(self._guarded, fn, *args, **kwargs))

    def _guarded(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, with an OSError (but a missing key's) as ObjectStoreUnavailable."""
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            raise ObjectStoreUnavailable(f"file store at {self.root}: {exc}") from exc

    @staticmethod
    def _put(path: Path, data: bytes) -> None:
        _write_whole(path, lambda temp: temp.write(data))

    def _copy(self, src_key: str, dst: Path) -> None:
        try:
            src = (self.root / src_key).open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            _check_root(self.root)
            raise ObjectNotFound(src_key) from None
        with src:  # streamed, not read whole: an input file may be hundreds of MB
            _write_whole(dst, lambda temp: shutil.copyfileobj(src, temp))

    def _get(self, key: str) -> bytes:
        try:
            return (self.root / key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            _check_root(self.root)  # a store whose folder is gone is broken, not empty
            raise ObjectNotFound(key) from None

    @staticmethod
    def _delete(path: Path) -> None:
        try:
            path.unlink(missing_ok=True)
        except (IsADirectoryError, NotADirectoryError):  # a "folder" of other keys, or below a key
            return


def _write_whole(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``write`` into a temporary file beside ``path``, flushed to disk, then renamed over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as temp:
            write(temp)
            temp.flush()
            os.fsync(temp.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


def _list_keys(root: Path, prefix: str) -> list[str]:
    # Walk only the deepest folder the prefix names, then keep the keys that start with it.
    _check_root(root)
    folder = root / prefix.rpartition("/")[0]
    if not folder.is_dir():
        return []
    keys = []
    for dirpath, _dirnames, filenames in os.walk(folder):
        for name in filenames:
            key = Path(dirpath, name).relative_to(root).as_posix()
            if key.startswith(prefix) and _is_key(key):
                keys.append(key)
    return sorted(keys)


def _check_root(root: Path) -> None:
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is no longer a directory")


def _is_key(text: str) -> bool:
    try:
        check_key(text)
    except ValueError:
        return False
    return True


def _check_prefix(prefix: str) -> None:
    """A prefix is empty, or a key with or without its trailing ``/`` (ValueError otherwise)."""
    if prefix:
        check_key(prefix[:-1] if prefix.endswith("/") else prefix)
