"""The usage outbox: an append-only, fsync'd file of usage records not yet in the ledger.

``<directory>/usage.jsonl`` holds one JSON line per event: ``{"seq": 7, "rec": {...}}`` when a record is
appended (durable before ``append`` returns), ``{"seq": 7, "done": true}`` once the ledger accepted it.
A record is pending while it has no done line. Lines hold the record's fields only: never any text.

Crash safety: a process killed mid-write leaves at most a torn last line; ``open()`` ignores any line
that is not complete, valid JSON, then rewrites the file with only the pending records (new file, fsync,
atomic rename, directory fsync), so the torn bytes never precede a later append. A done line lost in a
crash only means the record is written again, which the ledger's upsert makes a no-op.

Costs: one thread does all file I/O; appends and done lines queued while it writes go out together with
one fsync (group commit), so a burst of N records costs far fewer than N fsyncs. When most lines are done
the file is compacted the same way as at open. One process at a time: ``open()`` takes an exclusive
``flock`` on ``usage.lock`` (released by the kernel however the process ends).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from sluice.domain import Outcome, UsageRecord

log = logging.getLogger(__name__)

FILE_NAME = "usage.jsonl"
LOCK_NAME = "usage.lock"


def record_to_json(rec: UsageRecord) -> dict[str, Any]:
    return {
        "tenant_id": rec.tenant_id,
        "request_id": rec.request_id,
        "model": rec.model,
        "model_version": rec.model_version,
        "prompt_tokens": rec.prompt_tokens,
        "output_tokens": rec.output_tokens,
        "status": rec.status.value,
        "started_at": rec.started_at.isoformat(),
        "finished_at": rec.finished_at.isoformat(),
        "attempt": rec.attempt,
    }


def record_from_json(d: dict[str, Any]) -> UsageRecord:
    return UsageRecord(
        tenant_id=d["tenant_id"],
        request_id=d["request_id"],
        model=d["model"],
        model_version=d["model_version"],
        prompt_tokens=int(d["prompt_tokens"]),
        output_tokens=int(d["output_tokens"]),
        status=Outcome(d["status"]),
        started_at=datetime.fromisoformat(d["started_at"]),
        finished_at=datetime.fromisoformat(d["finished_at"]),
        attempt=int(d.get("attempt", 1)),
    )


def rec_line(seq: int, rec: UsageRecord) -> bytes:
    return _line({"seq": seq, "rec": record_to_json(rec)})


def done_line(seq: int) -> bytes:
    return _line({"seq": seq, "done": True})


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


@dataclass
class _Op:
    seq: int
    line: bytes
    is_done: bool
    future: asyncio.Future[None] | None  # set once the line is durable (appends only)


class Outbox:
    """``open()`` → the pending records a previous process left; ``append(rec)`` → its seq, once durable;
    ``mark_done(seq)`` after the ledger accepted it; ``close()``.

    Only the event loop calls these; the file and ``_live`` belong to the writer thread.
    """

    def __init__(
        self,
        directory: Path,
        *,
        fsync: Callable[[int], None] = os.fsync,
        compact_min_lines: int = 4096,
    ) -> None:
        self.directory = directory
        self.path = directory / FILE_NAME
        self._fsync = fsync
        self._compact_min_lines = compact_min_lines
        self._executor: ThreadPoolExecutor | None = None
        self._file: IO[bytes] | None = None
        self._lock_fd: int | None = None
        self._live: dict[int, bytes] = {}  # pending records' lines by seq (writer thread)
        self._next_seq = 1
        self._queue: list[_Op] = []
        self._flusher: asyncio.Task[None] | None = None
        self.num_fsyncs = 0  # file fsyncs (directory fsyncs not counted)
        self.num_lines = 0  # lines in the file now
        self.num_torn_lines = 0  # unreadable lines skipped at open
        self.num_compactions = 0

    async def open(self) -> list[tuple[int, UsageRecord]]:
        """Take the lock, replay the file and compact it; the pending records, oldest first."""
        if self._executor is not None:
            raise RuntimeError(f"outbox {self.path} is already open")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="usage-outbox")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._open_sync)
        except BaseException:
            self._executor.shutdown(wait=True)
            self._executor = None
            raise

    async def append(self, rec: UsageRecord) -> int:
        """Write ``rec`` and fsync it (with whatever else is queued); its seq once it is on disk.
        Raises ``OSError`` if it could not be made durable."""
        seq = self._next_seq
        self._next_seq += 1
        future = asyncio.get_running_loop().create_future()
        self._enqueue(_Op(seq, rec_line(seq, rec), False, future))
        # NOTE: shielded: a cancelled caller must not cancel a future the flusher will resolve.
        await asyncio.shield(future)
        return seq

    def mark_done(self, seq: int) -> None:
        """Record that the ledger holds ``seq``; written with the next group commit, not awaited
        (losing it in a crash only replays an idempotent write)."""
        self._enqueue(_Op(seq, done_line(seq), True, None))

    async def close(self) -> None:
        """Write what is queued, then release the file and the lock. Pending records stay on disk."""
        if self._executor is None:
            return
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)
        await asyncio.get_running_loop().run_in_executor(self._executor, self._close_sync)
        self._executor.shutdown(wait=True)
        self._executor = None

    # ------------------------------------------------------------------------------ event loop side

    def _enqueue(self, op: _Op) -> None:
        if self._executor is None:
            raise RuntimeError(f"outbox {self.path} is not open")
        self._queue.append(op)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        """Group commit: everything queued while the previous batch was being written goes out next."""
        loop = asyncio.get_running_loop()
        while self._queue:
            batch, self._queue = self._queue, []
            assert self._executor is not None
            error: BaseException | None = None
            try:
                await loop.run_in_executor(self._executor, self._write_sync, batch)
            except Exception as exc:
                log.exception("usage outbox %s: a write of %d lines failed", self.path, len(batch))
                error = exc
            for op in batch:
                if op.future is not None and not op.future.done():
                    if error is None:
                        op.future.set_result(None)
                    else:
                        op.future.set_exception(error)

    # ------------------------------------------------------------------------------ writer thread

    def _open_sync(self) -> list[tuple[int, UsageRecord]]:
        created = not self.directory.exists()
        self.directory.mkdir(parents=True, exist_ok=True)
        if created:
            _fsync_dir(self.directory.parent)
        self._lock_fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise RuntimeError(
                f"usage outbox {self.directory} is in use by another process (one gateway per state_dir)"
            ) from None
        max_seq = self._replay()
        self._next_seq = max_seq + 1
        self._rewrite()
        if self.num_torn_lines:
            log.warning("usage outbox %s: skipped %d unreadable lines", self.path, self.num_torn_lines)
        return [(seq, record_from_json(json.loads(line)["rec"])) for seq, line in sorted(self._live.items())]

    def _replay(self) -> int:
        """Fill ``_live`` from the file; the highest seq seen (0 when none)."""
        max_seq = 0
        if not self.path.exists():
            return max_seq
        with open(self.path, "rb") as f:
            for raw in f:
                if not raw.endswith(b"\n"):  # a torn last line
                    self.num_torn_lines += 1
                    continue
                try:
                    obj = json.loads(raw)
                    seq = int(obj["seq"])
                    if not obj.get("done"):
                        record_from_json(obj["rec"])  # a line that cannot be replayed is torn
                except (ValueError, KeyError, TypeError):
                    self.num_torn_lines += 1
                    continue
                max_seq = max(max_seq, seq)
                if obj.get("done"):
                    self._live.pop(seq, None)
                else:
                    self._live[seq] = raw
        return max_seq

    def _rewrite(self) -> None:
        """Replace the file with the pending records only: new file, fsync, rename, directory fsync."""
        if self._file is not None:
            self._file.close()
            self._file = None
        tmp = self.path.with_name(FILE_NAME + ".tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join(self._live[seq] for seq in sorted(self._live)))
            f.flush()
            self._fsync(f.fileno())
            self.num_fsyncs += 1
        os.replace(tmp, self.path)
        _fsync_dir(self.directory)
        self._file = open(self.path, "ab")  # noqa: SIM115 (held open until close)
        self.num_lines = len(self._live)

    def _write_sync(self, batch: list[_Op]) -> None:
        assert self._file is not None
        pos = self._file.tell()
        try:
            self._file.write(b"".join(op.line for op in batch))
            self._file.flush()
            self._fsync(self._file.fileno())
        except BaseException:
            # NOTE: cut a partly written batch off, or its torn tail would swallow the next line.
            self._file.truncate(pos)
            raise
        self.num_fsyncs += 1
        self.num_lines += len(batch)
        for op in batch:
            if op.is_done:
                self._live.pop(op.seq, None)
            else:
                self._live[op.seq] = op.line
        if self.num_lines >= self._compact_min_lines and len(self._live) * 4 <= self.num_lines:
            self._rewrite()
            self.num_compactions += 1

    def _close_sync(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None


def _fsync_dir(directory: Path) -> None:
    """Make a file's creation or rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
