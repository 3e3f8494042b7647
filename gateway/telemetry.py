"""One telemetry record per admitted request (refusals included), as a JSON line appended to a file.

The file is written by a background thread, never on the event loop: ``write`` only queues. The queue is
bounded; when it is full (the disk stalls, or records come faster than they can be written) a record is
dropped and counted, and the request goes on. The file rotates at a size bound, keeping a few older files
(``telemetry.jsonl.1`` the newest of them), so it cannot fill the disk.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TelemetryRecord:
    request_id: str
    tenant_id: str
    model: str
    model_version: str
    replica: str
    engine_client: str
    # Time in the gateway before the engine call started (the replica's own queue is inside TTFT).
    queue_ms: float
    ttft_ms: float | None  # None when no token came
    replica_ttft_ms: float | None  # from the replica call's start to its first token (inside ttft_ms)
    prompt_tokens: int
    output_tokens: int
    inter_token_p50_ms: float | None
    inter_token_max_ms: float | None
    duration_ms: float
    outcome: str
    finish_reason: str | None
    error: str | None = None
    attempt: int = 1  # with an Idempotency-Key: this attempt's number
    superseded_output_tokens: int = 0  # waste: what the abandoned previous attempt had generated
    idempotency_key: str | None = None  # the client's Idempotency-Key, as on the usage row
    # Prompt tokens the replica served from its prefix cache (its final response's num_cached_tokens);
    # None: it reported none (no final response, or an engine that does not count them).
    cached_tokens: int | None = None
    pool: str = ""  # the replica pool its version's queue was for: "general" or "long-prompt"
    # Failover: dispatches to a replica (0: never dispatched; more than 1: its replica failed before a
    # first token and it went to another); ``replica`` is the last one, the one that served or failed it.
    num_dispatches: int = 0
    failed_replicas: tuple[str, ...] = ()  # the replicas that could not be reached, in order
    # The fallbacks its overloaded model imposed, as the Sluice-Degraded header names them (e.g.
    # "max_tokens_cap=64, to_batch"); None: served as asked.
    degraded: str | None = None
    # A batch line's batch id and custom_id (None: not from a batch).
    batch_id: str | None = None
    custom_id: str | None = None


class TelemetryWriter:
    """Appends records to ``path`` as JSON lines from its own thread (``path`` None: records are
    dropped, no thread). ``write`` never blocks and is safe from any thread; beyond ``max_queued``
    records waiting, it drops the record and calls ``on_drop`` (also called for a record the disk
    refused). ``flush()`` waits until what was queued is written; ``close()`` writes what is queued
    and stops the thread (later records are dropped)."""

    def __init__(
        self,
        path: Path | None,
        *,
        max_bytes: int = 64 * 1024 * 1024,
        num_backups: int = 3,
        max_queued: int = 10_000,
        on_drop: Callable[[], None] | None = None,
    ) -> None:
        self._path = path
        self._max_bytes = max_bytes
        self._num_backups = num_backups
        self._on_drop = on_drop
        self._queue: queue.Queue[TelemetryRecord | threading.Event | None] = queue.Queue(max_queued)
        self._closed = False
        self.num_dropped = 0
        self._thread: threading.Thread | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._thread = threading.Thread(target=self._run, name="telemetry-writer", daemon=True)
            self._thread.start()

    def write(self, record: TelemetryRecord) -> None:
        if self._thread is None:
            return
        if self._closed:
            self._dropped()
            return
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self._dropped()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every record queued before this call is in the file; False if that took longer
        than ``timeout_s``. Not for the event loop."""
        if self._thread is None or self._closed:
            return True
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, then stop the thread. Not for the event loop (``asyncio.to_thread``)."""
        if self._thread is None or self._closed:
            return
        self._closed = True
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            log.error(
                "telemetry writer stuck for %.0f s; %d records not written", timeout_s, self._queue.qsize()
            )
            return
        self._thread.join(timeout_s)

    def _dropped(self) -> None:
        self.num_dropped += 1
        if self._on_drop is not None:
            self._on_drop()

    # ----- the writer thread -----
    def _run(self) -> None:
        assert self._path is not None
        file = _RotatingFile(self._path, self._max_bytes, self._num_backups)
        failing = False  # log a failing disk once per streak, not per record
        try:
            with contextlib.suppress(OSError):  # opened before the first record; retried per record
                file.open()
            while True:
                item = self._queue.get()
                if item is None:
                    return
                try:
                    if isinstance(item, threading.Event):
                        file.flush()
                        continue
                    file.write((json.dumps(asdict(item), separators=(",", ":")) + "\n").encode())
                    if self._queue.empty():  # a burst goes to the file in one go
                        file.flush()
                    failing = False
                except OSError:
                    if not failing:
                        log.exception("telemetry file %s not writable; dropping records", self._path)
                    failing = True
                    file.close()
                    if not isinstance(item, threading.Event):
                        self._dropped()
                finally:
                    if isinstance(item, threading.Event):
                        item.set()
        finally:
            file.close()


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
