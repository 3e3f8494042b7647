"""The file sink: records as JSON lines appended to a file that rotates at a size bound, keeping a few older
files (``telemetry.jsonl.1`` the newest of them), so it cannot fill the disk. A disk that refuses a write
costs that batch (dropped, counted); the file is reopened for the next one."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from gateway.telemetry.sink import QueuedSink


class FileSink(QueuedSink):
    """Appends records to ``path`` (its folder created) from the sink's thread; rotates past
    ``max_bytes`` keeping ``num_backups`` older files. See ``QueuedSink`` for the queue and drops."""

    name = "file"

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int = 64 * 1024 * 1024,
        num_backups: int = 3,
        max_queued: int = 10_000,
        on_drop: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(max_queued=max_queued, on_drop=on_drop)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = _RotatingFile(path, max_bytes, num_backups)
        self._start()

    def _begin(self) -> None:
        with contextlib.suppress(OSError):  # opened before the first record; retried per batch
            self._file.open()

    def _send(self, lines: list[str]) -> int:
        try:
            for line in lines:
                self._file.write((line + "\n").encode())
            self._file.flush()
        except OSError:
            self._file.close()  # reopened for the next batch
            raise
        return 0

    def _shut(self) -> None:
        self._file.close()


class _RotatingFile:
    """``path`` opened for appending; a line that would take it past ``max_bytes`` goes to a fresh file
    after the current one becomes ``path.1`` (``path.1`` becomes ``path.2``, ... up to ``num_backups``;
    the oldest is deleted). One thread only."""

    def __init__(self, path: Path, max_bytes: int, num_backups: int) -> None:
        self._path = path
        self._max_bytes = max_bytes
        self._num_backups = num_backups
        self._file: BinaryIO | None = None
        self._num_bytes = 0  # the file's size, written and buffered

    def open(self) -> None:
        if self._file is None:
            self._file = open(self._path, "ab")  # noqa: SIM115 -- held open across records
            self._num_bytes = os.fstat(self._file.fileno()).st_size

    def write(self, line: bytes) -> None:
        self.open()
        if self._num_bytes > 0 and self._num_bytes + len(line) > self._max_bytes:
            self._rotate()
        assert self._file is not None
        self._file.write(line)
        self._num_bytes += len(line)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def _rotate(self) -> None:
        self.close()
        for i in range(self._num_backups - 1, 0, -1):
            older = self._path.with_name(f"{self._path.name}.{i}")
            if older.exists():
                older.replace(self._path.with_name(f"{self._path.name}.{i + 1}"))
        if self._num_backups > 0:
            self._path.replace(self._path.with_name(f"{self._path.name}.1"))
        else:
            self._path.unlink()
        self.open()
