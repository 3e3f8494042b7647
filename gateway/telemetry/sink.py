"""The sink interface, and ``QueuedSink``: the bounded queue and the one thread every sink writes from.

A request ends by handing its record to ``write``, on the event loop: it must never block or raise.
So a sink only queues there; its thread serializes and sends batches (up to ``MAX_BATCH_RECORDS``, what
is queued when it wakes). A record that finds the queue full, or that its destination refused, is
dropped and counted (``num_dropped``, and ``on_drop(n)``, the metric): telemetry is at most once, and a
slow or dead destination costs records, never latency.
"""

from __future__ import annotations

import logging
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable

from gateway.telemetry.record import TelemetryRecord, record_json

log = logging.getLogger(__name__)

MAX_BATCH_RECORDS = 256


class _Stop:
    """The queue item that stops the thread, after what was queued before it."""


_STOP = _Stop()
_Item = TelemetryRecord | threading.Event | _Stop  # an Event: a flush, set once what came before is out


class TelemetrySink(ABC):
    """Where records go. ``name`` is the sink's label on ``sluice_gateway_telemetry_dropped_total``."""

    name: str

    @property
    @abstractmethod
    def num_dropped(self) -> int:
        """Records this sink did not deliver (queue full, destination failing, or written after close)."""

    @abstractmethod
    def write(self, record: TelemetryRecord) -> None:
        """Queue ``record``; never blocks, never raises, safe from any thread."""

    @abstractmethod
    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until what was queued before this call is delivered (or dropped); False if that took
        longer than ``timeout_s``. Blocks: not for the event loop."""

    @abstractmethod
    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued, then stop (later records are dropped). Blocks (``asyncio.to_thread``)."""


class QueuedSink(TelemetrySink):
    """A sink whose ``_send`` runs on its own thread. Subclasses implement ``_send`` (deliver lines,
    return how many the destination refused; raise if it is failing: the whole batch is dropped), may
    override ``_begin`` and ``_shut`` (the thread's first and last acts), and call ``_start()`` last in
    ``__init__``."""

    def __init__(self, *, max_queued: int, on_drop: Callable[[int], None] | None) -> None:
        self._queue: queue.Queue[_Item] = queue.Queue(max_queued)
        self._on_drop = on_drop
        self._closed = False
        self._num_dropped = 0
        self._drop_lock = threading.Lock()  # counted from callers and from the thread
        self._failing = False  # the destination refuses; logged once per streak, not per batch
        self._thread = threading.Thread(target=self._run, name=f"telemetry-{self.name}", daemon=True)

    @property
    def num_dropped(self) -> int:
        return self._num_dropped

    def write(self, record: TelemetryRecord) -> None:
        if self._closed:
            self._dropped(1)
            return
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self._dropped(1)

    def flush(self, timeout_s: float = 10.0) -> bool:
        if self._closed:
            return True
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            log.error(
                "telemetry sink %s stuck for %.0f s; %d records not delivered",
                self.name,
                timeout_s,
                self._queue.qsize(),
            )
            return
        self._thread.join(timeout_s)

    @abstractmethod
    def _send(self, lines: list[str]) -> int:
        """Deliver ``lines`` (JSON, no newline); the number the destination refused. Raises if it fails."""

    def _begin(self) -> None:
        """Prepare the destination (the thread's first act: it may block, ``__init__`` must not)."""

    def _shut(self) -> None:
        """Release the destination (the thread's last act)."""

    def _start(self) -> None:
        self._thread.start()

    def _dropped(self, num_records: int) -> None:
        with self._drop_lock:
            self._num_dropped += num_records
        if self._on_drop is not None:
            self._on_drop(num_records)

    # ----- the sink's thread -----
    def _run(self) -> None:
        try:
            self._begin()
            pending: _Item | None = None  # taken from the queue while batching, not handled yet
            while True:
                item = pending if pending is not None else self._queue.get()
                pending = None
                if isinstance(item, _Stop):
                    return
                if isinstance(item, threading.Event):  # a flush: what came before it is out
                    item.set()
                    continue
                batch = [item]  # and what else is queued now, up to the bound
                while len(batch) < MAX_BATCH_RECORDS:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if not isinstance(item, TelemetryRecord):
                        pending = item
                        break
                    batch.append(item)
                self._deliver(batch)
        finally:
            self._shut()

    def _deliver(self, batch: list[TelemetryRecord]) -> None:
        try:
            num_refused = self._send([record_json(record) for record in batch])
        except Exception as exc:  # the thread must outlive any failure of its destination
            if not self._failing:
                log.warning(
                    "telemetry sink %s failing (%r); dropping records until it recovers", self.name, exc
                )
            self._failing = True
            self._dropped(len(batch))
            return
        if num_refused:
            self._dropped(num_refused)
        if self._failing:
            log.info(
                "telemetry sink %s delivering again (%d records dropped so far)", self.name, self.num_dropped
            )
        self._failing = False
