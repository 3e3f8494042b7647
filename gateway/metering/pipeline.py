"""``UsageMeter``: the one way a usage record reaches the ledger, through the outbox.

``record(rec)``: append to the outbox (durable), then write to the ledger (bounded by
``write_timeout_s``), then mark it done. If the ledger fails or does not answer in time the record stays
pending and ``record`` returns normally: a request never fails because the ledger is down. A background
task writes pending records with backoff (``retry_initial_s`` doubling to ``retry_max_s``) and, at
``open()``, whatever a previous process left pending. While the ledger is known to be down, ``record``
only appends (one group-committed fsync) and leaves the write to that task, so an outage adds no
timeouts to requests after the first ones that find it.

Exactly once: the outbox makes every record durable before any ledger write, and the ledger keeps the
first row of a (tenant_id, request_id), so each write after the first is a no-op.

A gateway crash loses no usage a client received: ``begin(rec)`` at dispatch records the request as
open in the outbox (durable before its first output leaves: ``opened``; the replica starts meanwhile, so
a crash within that write loses only work nobody received), ``checkpoint`` records its output tokens as
they stream (every ``checkpoint_every_s`` or ``checkpoint_every_tokens``, whichever comes first; queued
with the outbox's group commit, never one fsync per token), and ``record(rec, usage)`` closes it.
``open()`` bills a request a dead process left open with its last checkpoint and status
``gateway_lost`` (see ``outbox.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.metering.outbox import Outbox
from sluice.domain import UsageRecord
from sluice.outages import OutageLog
from sluice.stores.ledger.base import UsageLedger, check_record

log = logging.getLogger(__name__)


def _no_op() -> None:
    return None


@dataclass
class OpenUsage:
    """A request between its dispatch (``begin``) and its final record: its seq in the outbox and what was
    checkpointed last. ``seq`` None: the outbox could not take the open line (logged); a crash then loses
    this request's usage, but its final record is still written."""

    seq: int | None
    checkpointed_tokens: int = 0
    checkpointed_at_s: float = 0.0  # the meter's clock
    opening: asyncio.Future[None] | None = None  # the open line's write, until ``opened`` has seen it end


class UsageMeter:
    """Counters (read them, e.g. from a metrics exporter): ``num_pending`` records not yet in the ledger,
    ``num_written`` records the ledger accepted, ``num_failed_attempts`` ledger writes that failed or timed
    out, ``num_outages`` times the ledger was found down. ``on_written`` / ``on_ledger_failure`` are called
    as the last two grow."""

    def __init__(
        self,
        ledger: UsageLedger,
        outbox: Outbox,
        *,
        write_timeout_s: float = 2.0,
        retry_initial_s: float = 0.5,
        # NOTE: while the ledger is down one record probes it this often at most: the outage is seen to end
        # within a second of the database's return (one small write a second is nothing to a server).
        retry_max_s: float = 1.0,
        max_concurrent_writes: int = 8,
        checkpoint_every_s: float = 1.0,
        checkpoint_every_tokens: int = 64,
        on_written: Callable[[], None] = _no_op,
        on_ledger_failure: Callable[[], None] = _no_op,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ledger = ledger
        self._outbox = outbox
        self._write_timeout_s = write_timeout_s
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._max_concurrent_writes = max_concurrent_writes
        self._checkpoint_every_s = checkpoint_every_s
        self._checkpoint_every_tokens = checkpoint_every_tokens
        self._clock = clock
        self._on_written = on_written
        self._on_ledger_failure = on_ledger_failure
        self._pending: dict[int, UsageRecord] = {}  # outbox seq -> record, not yet in the ledger
        self._inline: set[int] = set()  # seqs a record() call is writing itself
        self._writes: set[asyncio.Task[bool]] = set()  # ledger writes in flight
        self._outage = OutageLog(log, "usage ledger", clock=clock)
        self._wake = asyncio.Event()
        self._retrier: asyncio.Task[None] | None = None
        self.num_written = 0
        self.num_failed_attempts = 0
        self.num_outages = 0

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def ledger_down(self) -> bool:
        return self._outage.is_down

    async def open(self) -> None:
        """Open the outbox and start writing what a previous process left pending."""
        left = await self._outbox.open()
        self._pending.update(left)
        if left:
            log.info(
                "usage outbox: %d records left pending by a previous run (%d of them requests it left"
                " running, billed as gateway_lost), writing them",
                len(left),
                self._outbox.num_lost,
            )
        self._retrier = asyncio.create_task(self._retry_loop(), name="usage-meter-retry")
        self._wake.set()

    async def close(self) -> None:
        """Stop retrying, give writes in flight ``write_timeout_s`` to land, close the outbox. Records
        still pending stay in the outbox for the next ``open()``."""
        if self._retrier is not None:
            self._retrier.cancel()
            await asyncio.gather(self._retrier, return_exceptions=True)
            self._retrier = None
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=self._write_timeout_s)
        await self._outbox.close()
        if self._pending:
            log.warning("usage outbox: %d records still pending at close, kept on disk", len(self._pending))

    def begin(self, rec: UsageRecord) -> OpenUsage:
        """Record a request as running: ``rec`` is what it costs if the process dies before ``record`` (its
        prompt; output tokens come from the checkpoints). Returns at once, its open line being written:
        ``opened`` waits until it is on disk, which the caller does before the first output reaches its
        client, so the replica starts meanwhile instead of after a write and two thread hand-offs."""
        check_record(rec)
        seq, written = self._outbox.open_nowait(rec)
        return OpenUsage(seq, checkpointed_at_s=self._clock(), opening=written)

    async def opened(self, usage: OpenUsage) -> None:
        """Wait until ``usage``'s open line is on disk (no wait once it has been seen to be). Never raises
        for the outbox: if the disk failed, the request runs without crash protection (``seq`` None;
        logged by the outbox)."""
        written, usage.opening = usage.opening, None
        if written is None:
            return
        try:
            await asyncio.shield(written)
        except OSError:
            usage.seq = None

    def checkpoint(self, usage: OpenUsage | None, output_tokens: int) -> None:
        """The request has produced ``output_tokens`` so far: queue a checkpoint if the last one is
        ``checkpoint_every_tokens`` behind or ``checkpoint_every_s`` old. Cheap; never raises."""
        if usage is None or usage.seq is None or output_tokens <= usage.checkpointed_tokens:
            return
        now_s = self._clock()
        if (
            output_tokens - usage.checkpointed_tokens < self._checkpoint_every_tokens
            and now_s - usage.checkpointed_at_s < self._checkpoint_every_s
        ):
            return
        usage.checkpointed_tokens, usage.checkpointed_at_s = output_tokens, now_s
        with suppress(RuntimeError):  # the outbox closed under a request still running: billed as lost
            self._outbox.checkpoint(usage.seq, output_tokens, datetime.now(UTC))

    def restart(self, usage: OpenUsage | None) -> None:
        """The request's output starts again from nothing (re-dispatched: the lost replica's tokens never
        reached the client and are not billed): queue a checkpoint of 0 tokens, so a crash from here bills
        the new replica's output, not the old one's. Cheap; never raises."""
        if usage is None or usage.seq is None or usage.checkpointed_tokens == 0:
            return
        usage.checkpointed_tokens, usage.checkpointed_at_s = 0, self._clock()
        with suppress(RuntimeError):  # the outbox closed under a request still running: billed as lost
            self._outbox.checkpoint(usage.seq, 0, datetime.now(UTC))

    def discard(self, usage: OpenUsage) -> None:
        """The request ended with nothing to bill (it never ran on a replica): close it unbilled."""
        if usage.seq is not None:
            with suppress(RuntimeError):
                self._outbox.mark_done(usage.seq)

    async def record(self, rec: UsageRecord, usage: OpenUsage | None = None) -> None:
        """Make ``rec`` durable (closing ``usage``, the request's ``begin``, if given), then try the ledger
        once. Raises only for an invalid record (``ValueError``), or when neither the outbox nor the ledger
        could take it."""
        check_record(rec)
        try:
            seq = await self._outbox.append(rec, None if usage is None else usage.seq)
        except OSError:
            # The disk failed us: the ledger is the only place left (the outbox already logged why). An
            # open line stays open: billed as lost at the next start, a no-op once this row is written.
            async with asyncio.timeout(self._write_timeout_s):
                await self._ledger.record(rec)
            self._count_written()
            return
        self._pending[seq] = rec
        if self._outage.is_down:
            return  # the retry task writes it once the ledger is back
        self._inline.add(seq)
        try:
            await self._write(seq, rec)
        finally:
            self._inline.discard(seq)
            if seq in self._pending:
                self._wake.set()

    # ------------------------------------------------------------------------------------ internals

    async def _write(self, seq: int, rec: UsageRecord) -> bool:
        """One bounded ledger write; True if the record left the pending set."""
        task = asyncio.ensure_future(self._ledger.record(rec))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        done, _ = await asyncio.wait({task}, timeout=self._write_timeout_s)
        if not done:
            # NOTE: the write goes on (ledgers finish a write once started); if it lands late, it counts.
            task.add_done_callback(lambda t: self._landed_late(seq, t))
            self._failed(TimeoutError(f"no answer in {self._write_timeout_s} s"))
            return False
        cancelled = task.cancelled()
        exc = asyncio.CancelledError("ledger write cancelled") if cancelled else task.exception()
        if exc is None:
            self._done(seq)
            self._recovered()
            return True
        if isinstance(exc, ValueError):  # the ledger refuses this record: retrying cannot help
            log.error("usage record %s refused by the ledger, dropped: %s", rec.request_id, exc)
            self._pending.pop(seq, None)
            self._outbox.mark_done(seq)
            return True
        self._failed(exc)
        return False

    def _landed_late(self, seq: int, task: asyncio.Task[bool]) -> None:
        if not task.cancelled() and task.exception() is None and seq in self._pending:
            self._done(seq)

    def _done(self, seq: int) -> None:
        if self._pending.pop(seq, None) is None:
            return  # written twice (a late write and a retry): counted once
        # The outbox may be closed already (a late write): the record is replayed next run, a no-op.
        with suppress(RuntimeError):
            self._outbox.mark_done(seq)
        self._count_written()

    def _count_written(self) -> None:
        self.num_written += 1
        self._on_written()

    def _failed(self, exc: BaseException) -> None:
        self.num_failed_attempts += 1
        self._on_ledger_failure()
        meanwhile = f"records are kept in the outbox {self._outbox.path} and retried"
        if self._outage.down(f"{type(exc).__name__}: {exc}", meanwhile):
            self.num_outages += 1
        self._wake.set()

    def _recovered(self) -> None:
        if self._outage.up(f"{len(self._pending)} records pending, being written") is not None:
            self._wake.set()

    async def _retry_loop(self) -> None:
        delay_s = self._retry_initial_s
        while True:
            await self._wake.wait()
            self._wake.clear()
            while todo := [(s, r) for s, r in self._pending.items() if s not in self._inline]:
                try:
                    ok = await self._write_all(todo)
                except Exception:  # a bug must not end the retries: the records would wait for a restart
                    log.exception("usage meter: retry pass failed")
                    ok = False
                if ok:
                    delay_s = self._retry_initial_s
                    continue
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, self._retry_max_s)

    async def _write_all(self, todo: list[tuple[int, UsageRecord]]) -> bool:
        """Write ``todo`` a few at a time; False at the first failure. While the ledger is down, one
        record goes first as a probe, so a dead ledger sees one attempt per backoff step, not many."""
        if self._outage.is_down:
            (seq, rec), todo = todo[0], todo[1:]
            if not await self._write(seq, rec):
                return False
        for i in range(0, len(todo), self._max_concurrent_writes):
            chunk = todo[i : i + self._max_concurrent_writes]
            results = await asyncio.gather(*(self._write(s, r) for s, r in chunk if s in self._pending))
            if not all(results):
                return False
        return True
