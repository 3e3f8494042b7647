"""The usage outbox: an append-only, fsync'd file of usage records not yet in the ledger, and of requests
still running, so that a gateway killed mid-request still bills what its replica produced.

``<directory>/usage.jsonl`` holds one JSON line per event. A ``seq`` names one request's usage:

  ``{"seq": 7, "open": {...}}``   dispatched to a replica: a provisional record (durable before it returns)
  ``{"seq": 7, "ckpt": {"output_tokens": 64, "at": "..."}}``   tokens produced so far (queued, not awaited)
  ``{"seq": 7, "rec": {...}}``    the final record (durable before ``append`` returns); closes an open seq
  ``{"seq": 7, "done": true}``    the ledger accepted it, or an open request ended with nothing to bill

A record is pending while it has no done line. Lines hold the record's fields only: never any text.

Crash safety: a process killed mid-write leaves at most a torn last line; ``open()`` ignores any line
that is not complete, valid JSON. A request still open at ``open()`` (an open line, no rec or done) was
running when a previous process died: it becomes a pending record with status ``gateway_lost``, its last
checkpoint's output tokens and time (none: 0 tokens at the open time). ``open()`` then rewrites the file
with only the pending records (new file, fsync, atomic rename, directory fsync), so the torn bytes never
precede a later append. A done line lost in a crash only means the record is written again, which the
ledger makes a no-op (a row, once written, never changes).

Costs: one thread does all file I/O; every line queued while it writes goes out together with one fsync
(group commit), so a burst of N records, or N streams' checkpoints, costs far fewer than N fsyncs. A line
nobody awaits (a checkpoint, a done line) waits up to ``lazy_flush_s`` for company before it starts a
write of its own (an awaited line starts one at once and takes it along): each write is a thread
hand-off and an fsync, and streams' checkpoints arriving one at a time would otherwise each pay for one
(measured: ~10 µs of gateway CPU per streamed token at 150 streams, bench/gateway_capacity.py). When
most lines are done (or superseded checkpoints) the file is compacted the same way as at open, keeping
each open request's open line and latest checkpoint. One process at a time: ``open()`` takes an exclusive
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
from typing import IO

from gateway.metering.lines import (
    Kind,
    ckpt_line,
    done_line,
    lost_record,
    open_line,
    parse,
    rec_line,
    record_from_json,
)
from sluice.domain import Outcome, UsageRecord

log = logging.getLogger(__name__)

FILE_NAME = "usage.jsonl"
LOCK_NAME = "usage.lock"


@dataclass
class _Op:
    seq: int
    line: bytes
    kind: Kind
    future: asyncio.Future[None] | None  # set once the line is durable (awaited lines only)


class Outbox:
    """``open()`` → the pending records a previous process left (those it left open: ``gateway_lost``);
    ``open_nowait(rec)`` → a running request's seq at once, and a future for its open line's write;
    ``checkpoint(seq, ...)`` while it runs;
    ``append(rec, seq)`` → its final record's seq, once durable; ``mark_done(seq)`` after the ledger
    accepted it (or for an open request with nothing to bill); ``close()``.

    Only the event loop calls these; the file, ``_live`` and ``_open`` belong to the writer thread.
    """

    def __init__(
        self,
        directory: Path,
        *,
        fsync: Callable[[int], None] = os.fsync,
        compact_min_lines: int = 4096,
        lazy_flush_s: float = 0.1,
    ) -> None:
        self.directory = directory
        self.path = directory / FILE_NAME
        self._fsync = fsync
        self._compact_min_lines = compact_min_lines
        self._lazy_flush_s = lazy_flush_s
        self._lazy_flush: asyncio.TimerHandle | None = None  # a write of unawaited lines, not started yet
        self._executor: ThreadPoolExecutor | None = None
        self._file: IO[bytes] | None = None
        self._lock_fd: int | None = None
        self._live: dict[int, bytes] = {}  # pending records' lines by seq (writer thread)
        self._open: dict[int, tuple[bytes, bytes | None]] = {}  # running: (open line, latest ckpt line)
        self._next_seq = 1
        self._queue: list[_Op] = []
        self._flusher: asyncio.Task[None] | None = None
        self.num_fsyncs = 0  # file fsyncs (directory fsyncs not counted)
        self.num_lines = 0  # lines in the file now
        self.num_torn_lines = 0  # unreadable lines skipped at open
        self.num_lost = 0  # requests a previous process left open, billed as gateway_lost at open
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

    async def append(self, rec: UsageRecord, seq: int | None = None) -> int:
        """Write ``rec`` and fsync it (with whatever else is queued); its seq once it is on disk. With the
        ``seq`` of an open request, the record closes it. Raises ``OSError`` if it could not be made
        durable (an open request then stays open: the next ``open()`` bills it as lost)."""
        if seq is None:
            seq = self._new_seq()
        await self._durable(seq, rec_line(seq, rec), Kind.REC)
        return seq

    def open_nowait(self, rec: UsageRecord) -> tuple[int, asyncio.Future[None]]:
        """Record a request as running (``rec``: what it costs if nothing more is heard of it, before its
        output tokens): its seq at once, and a future done once its open line is on disk (with ``OSError``
        if it could not be written). Its write starts now; a caller that never sees the future done
        still closes the seq with its final record (``append``) or ``mark_done``."""
        seq = self._new_seq()
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # NOTE: a write error nobody awaited (the request ended first; its final record says the rest) is
        # not an unretrieved exception: the outbox logged it.
        written.add_done_callback(_retrieve)
        self._enqueue(_Op(seq, open_line(seq, rec), Kind.OPEN, written))
        return seq, written

    def checkpoint(self, seq: int, output_tokens: int, at: datetime) -> None:
        """An open request has produced ``output_tokens`` by ``at``; written with the next group commit,
        not awaited (a crash before it only bills the previous checkpoint)."""
        self._enqueue(_Op(seq, ckpt_line(seq, output_tokens, at), Kind.CKPT, None))

    def mark_done(self, seq: int) -> None:
        """Record that the ledger holds ``seq``, or that open request ``seq`` ended with nothing to bill;
        written with the next group commit, not awaited (losing it in a crash only replays an idempotent
        write, or bills a request that never reached a replica its prompt)."""
        self._enqueue(_Op(seq, done_line(seq), Kind.DONE, None))

    async def close(self) -> None:
        """Write what is queued, then release the file and the lock. Pending records stay on disk."""
        if self._executor is None:
            return
        self._start_flush()  # lines still waiting for company go now
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)
        await asyncio.get_running_loop().run_in_executor(self._executor, self._close_sync)
        self._executor.shutdown(wait=True)
        self._executor = None

    # ------------------------------------------------------------------------------ event loop side

    def _new_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq

    async def _durable(self, seq: int, line: bytes, kind: Kind) -> None:
        """Queue ``line`` and wait until it is on disk (raises what the write raised)."""
        future = asyncio.get_running_loop().create_future()
        self._enqueue(_Op(seq, line, kind, future))
        # NOTE: shielded: a cancelled caller must not cancel a future the flusher will resolve.
        await asyncio.shield(future)

    def _enqueue(self, op: _Op) -> None:
        if self._executor is None:
            raise RuntimeError(f"outbox {self.path} is not open")
        self._queue.append(op)
        if self._flusher is not None and not self._flusher.done():
            return  # the running flusher takes it with its next batch
        if op.future is None and self._lazy_flush_s > 0:
            if self._lazy_flush is None:
                loop = asyncio.get_running_loop()
                self._lazy_flush = loop.call_later(self._lazy_flush_s, self._start_flush)
            return
        self._start_flush()

    def _start_flush(self) -> None:
        if self._lazy_flush is not None:
            self._lazy_flush.cancel()
            self._lazy_flush = None
        if self._queue and (self._flusher is None or self._flusher.done()):
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
        self._bill_the_lost()
        self._rewrite()
        if self.num_torn_lines:
            log.warning("usage outbox %s: skipped %d unreadable lines", self.path, self.num_torn_lines)
        if self.num_lost:
            log.warning(
                "usage outbox %s: %d requests were running when the previous process died; billed as %s"
                " with their last checkpoint's output tokens",
                self.path,
                self.num_lost,
                Outcome.GATEWAY_LOST,
            )
        return [(seq, record_from_json(json.loads(line)["rec"])) for seq, line in sorted(self._live.items())]

    def _replay(self) -> int:
        """Fill ``_live`` and ``_open`` from the file; the highest seq seen (0 when none)."""
        max_seq = 0
        if not self.path.exists():
            return max_seq
        with open(self.path, "rb") as f:
            for raw in f:
                if not raw.endswith(b"\n"):  # a torn last line
                    self.num_torn_lines += 1
                    continue
                try:
                    seq, kind = parse(raw)
                except (ValueError, KeyError, TypeError):  # a line that cannot be replayed is torn
                    self.num_torn_lines += 1
                    continue
                max_seq = max(max_seq, seq)
                self._apply(seq, raw, kind)
        return max_seq

    def _apply(self, seq: int, line: bytes, kind: Kind) -> None:
        """One line's effect on the pending and open sets (the same at replay and after a write)."""
        if kind is Kind.REC:
            self._open.pop(seq, None)
            self._live[seq] = line
        elif kind is Kind.DONE:
            self._live.pop(seq, None)
            self._open.pop(seq, None)
        elif kind is Kind.OPEN:
            self._open[seq] = (line, None)
        elif seq in self._open:  # a checkpoint; one that arrives after its request closed is moot
            self._open[seq] = (self._open[seq][0], line)

    def _bill_the_lost(self) -> None:
        """Requests a dead process left open become pending ``gateway_lost`` records (at open only: one
        process holds the outbox, so none of them can still be running)."""
        for seq, (opened, ckpt) in sorted(self._open.items()):
            rec = record_from_json(json.loads(opened)["open"])
            lost = lost_record(rec, None if ckpt is None else json.loads(ckpt)["ckpt"])
            self._live[seq] = rec_line(seq, lost)
            self.num_lost += 1
        self._open.clear()

    def _rewrite(self) -> None:
        """Replace the file with the pending records only: new file, fsync, rename, directory fsync."""
        if self._file is not None:
            self._file.close()
            self._file = None
        tmp = self.path.with_name(FILE_NAME + ".tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join(self._lines_to_keep()))
            f.flush()
            self._fsync(f.fileno())
            self.num_fsyncs += 1
        os.replace(tmp, self.path)
        _fsync_dir(self.directory)
        self._file = open(self.path, "ab")  # noqa: SIM115 (held open until close)
        self.num_lines = self._num_lines_to_keep()

    def _lines_to_keep(self) -> list[bytes]:
        """Pending records, and each open request's open line and latest checkpoint, in seq order."""
        kept: dict[int, list[bytes]] = {seq: [line] for seq, line in self._live.items()}
        for seq, (opened, ckpt) in self._open.items():
            kept[seq] = [opened] if ckpt is None else [opened, ckpt]
        return [line for seq in sorted(kept) for line in kept[seq]]

    def _num_lines_to_keep(self) -> int:
        return len(self._live) + sum(1 if ckpt is None else 2 for _, ckpt in self._open.values())

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
            self._apply(op.seq, op.line, op.kind)
        if self.num_lines >= self._compact_min_lines and self._num_lines_to_keep() * 4 <= self.num_lines:
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


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
