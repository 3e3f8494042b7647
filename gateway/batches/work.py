"""One batch, worked by the runner that holds its lease: validate its input file, run its lines (those
in no committed part), commit their results in parts, and finish it: output and error files, then a
terminal status. ``BatchWork.run`` returns when the batch is finished, or its lease is lost, or the
runner stops (another runner, or this one after a restart, takes it from where its parts say).

Progress is exact: a line counts once its result is in a committed part (``BatchStore.commit_part``), and
a committed part is never run again. A line that ended but whose part was not committed yet (the process
died) runs again; its usage row is keyed by (batch, custom_id), so it is billed once.

A line is billed for the run whose result the batch reports. A run cut because the line runs again (this
runner stops and its drain ran out, or the lease was lost) bills nothing (``Outcome.INTERRUPTED``), and a
run its gateway died in bills nothing either (batch lines are not opened in the usage outbox): otherwise
the ledger, which keeps a row's first write, would bill the cut run's tokens for the rerun's output.

Cancel (``CANCELLING``, seen on a lease renewal or told by this gateway's API at once): the lines running
are cancelled (each billed for what it generated, as a client that went away is) and reported in the
error file as ``batch_cancelled``; lines that never started are in neither file; the output file holds
the lines that finished. The completion window passing works the same way, and every line not run is
reported as ``batch_expired``.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from gateway.batches.line_call import RetryLater, run_line
from gateway.batches.lines import BatchLine, ParsedFile, parse_input
from gateway.batches.results import LineResult, not_run, result_file_id
from gateway.state import GatewayState
from sluice.domain import Tenant
from sluice.stores.batches.base import (
    TERMINAL_STATUSES,
    Batch,
    BatchError,
    BatchPart,
    BatchStatus,
    BatchStore,
    BatchStoreUnavailable,
    LeaseLost,
)
from sluice.stores.files.base import ObjectNotFound, ObjectStore, ObjectStoreUnavailable
from sluice.stores.files.catalog import FileCatalog, UnknownFileError

log = logging.getLogger(__name__)

MAX_RETRY_WAIT_S = 5.0  # the longest wait between tries to commit a part while a store is down


@dataclass(frozen=True)
class WorkLimits:
    lease_s: float
    max_lines: int  # per input file
    line_concurrency: int  # lines of one batch running at once
    part_max_lines: int  # a part is committed once this many lines ended ...
    flush_interval_s: float  # ... or this long after the previous one


@dataclass(frozen=True)
class Stores:
    batches: BatchStore
    files: FileCatalog  # input and result files
    objects: ObjectStore  # the parts' results


def _now() -> datetime:
    return datetime.now(UTC)


class BatchWork:
    """The batch ``batch`` as its lease holder ``owner`` works it (one object per claim)."""

    def __init__(
        self, batch: Batch, owner: str, gw: GatewayState, stores: Stores, limits: WorkLimits
    ) -> None:
        self.batch = batch
        self._owner = owner
        self._gw = gw
        self._stores = stores
        self._limits = limits
        self._stop = asyncio.Event()  # cancel requested, the window passed, or the lease lost
        self._lost: LeaseLost | None = None
        self._draining = asyncio.Event()  # the runner is stopping: start no more lines, let running ones end
        self._ended: list[LineResult] = []  # lines that ended since the last committed part
        self._part_full = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._next_seq = 0

    def cancel_requested(self) -> None:
        """This gateway's API set the batch CANCELLING: stop now rather than at the next renewal."""
        self._cancelling()

    def drain(self) -> None:
        """The runner is stopping: start no more lines; those running end and are committed, and the
        batch is left as it is (in progress) for a runner to resume. Those the runner then cuts (its
        drain ran out) run again there, and their cut runs bill nothing."""
        self._draining.set()

    async def run(self, tenant: Tenant) -> None:
        """Work the batch until it is finished. Raises ``LeaseLost`` (another runner has it) and the
        stores' ``...Unavailable`` errors (this runner lets it go; it is claimed again later)."""
        renewal = asyncio.create_task(self._keep_lease())
        try:
            await self._drive(tenant)
        finally:
            renewal.cancel()
            with suppress(asyncio.CancelledError):
                await renewal

    # ----- the batch's course -----
    async def _drive(self, tenant: Tenant) -> None:
        batch, stores = self.batch, self._stores
        data = await self._read_input()
        if data is None:
            error = BatchError("invalid_file", f"The input file {batch.input_file_id} no longer exists.")
            await self._advance(BatchStatus.FAILED, errors=(error,))
            return
        max_line_bytes = self._gw.settings.max_body_bytes  # a line is held to an interactive call's limit
        parsed = parse_input(data, batch.endpoint, self._limits.max_lines, max_line_bytes)
        if batch.status is BatchStatus.VALIDATING:
            if parsed.errors:
                await self._advance(BatchStatus.FAILED, errors=parsed.errors, total=parsed.total)
                return
            await self._advance(BatchStatus.IN_PROGRESS, total=parsed.total)
        parts = await stores.batches.parts(batch.batch_id)
        self._next_seq = len(parts)
        done = {index for part in parts for index in part.line_indices}
        if self.batch.status is BatchStatus.IN_PROGRESS:
            await self._run_lines(parsed, done, tenant)
        if self._draining.is_set() and self.batch.status is BatchStatus.IN_PROGRESS:
            return  # stopped with lines left: resumed by the next runner to claim it
        await self._finish(parsed)

    async def _read_input(self) -> bytes | None:
        """The batch's own copy of its input file (``input_key``, made when it was created: the file may
        be deleted or expire since). A batch created before batches kept a copy has none, and reads
        ``input_file_id`` itself. None: there is nothing to read."""
        batch, stores = self.batch, self._stores
        try:
            if batch.input_key is None:
                return await stores.files.content(batch.tenant_id, batch.input_file_id)
            return await stores.objects.get(batch.input_key)
        except (UnknownFileError, ObjectNotFound):
            return None

    async def _run_lines(self, parsed: ParsedFile, done: set[int], tenant: Tenant) -> None:
        """Run every line not done until all ended or the batch must stop, committing what ended."""
        for problem in parsed.problems:
            if problem.index not in done:
                self._ended.append(not_run(problem.index, problem.custom_id, problem.code, problem.message))
        window_s = max(0.0, (self.batch.expires_at - _now()).total_seconds())
        expiry = asyncio.get_running_loop().call_later(window_s, self._stop.set)
        flusher = asyncio.create_task(self._flush_in_background())
        try:
            await self._run_pending([line for line in parsed.lines if line.index not in done], tenant)
        finally:
            expiry.cancel()
            flusher.cancel()
            with suppress(asyncio.CancelledError):
                await flusher
        if self._lost is not None:
            raise self._lost
        await self._flush_until_committed()

    async def _run_pending(self, pending: list[BatchLine], tenant: Tenant) -> None:
        """Run ``pending``, at most ``line_concurrency`` at once. Once the batch must stop, start no more
        and cancel those running (each reports itself); once the runner drains, start no more and let
        those running end. Returns when every started line has ended."""
        slots = asyncio.Semaphore(self._limits.line_concurrency)
        running: set[asyncio.Task[None]] = set()
        stop = asyncio.create_task(self._stop.wait())
        draining = asyncio.create_task(self._draining.wait())
        try:
            for line in pending:
                acquired = asyncio.create_task(slots.acquire())
                await asyncio.wait({acquired, stop, draining}, return_when=asyncio.FIRST_COMPLETED)
                if stop.done() or draining.done():
                    if acquired.done():
                        slots.release()
                    acquired.cancel()
                    break
                task = asyncio.create_task(self._one_line(line, tenant, slots))
                running.add(task)
                task.add_done_callback(running.discard)
            while running and not stop.done():
                await asyncio.wait({*running, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # NOTE: here, so that a runner cutting this batch (its drain ran out) cuts its lines too.
            stop.cancel()
            draining.cancel()
            for task in list(running):
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _one_line(self, line: BatchLine, tenant: Tenant, slots: asyncio.Semaphore) -> None:
        try:
            while True:
                try:
                    result = await run_line(
                        line, self.batch.batch_id, self.batch.endpoint, tenant, self._gw, self._runs_again
                    )
                    break
                except RetryLater as retry:
                    self._gw.metrics.batch_line_retries.labels(retry.reason).inc()
                    log.debug(
                        "batch %s line %d waits %.1f s: %s",
                        self.batch.batch_id,
                        line.index,
                        retry.after_s,
                        retry.reason,
                    )
                    await asyncio.sleep(retry.after_s)
        except asyncio.CancelledError:
            if not self._runs_again():
                code, message = self._stop_reason()
                self._ended.append(not_run(line.index, line.custom_id, code, message))
            raise
        finally:
            slots.release()
        self._ended.append(result)
        if len(self._ended) >= self._limits.part_max_lines:
            self._part_full.set()

    def _runs_again(self) -> bool:
        """Whether a line cut now runs again: the batch goes on (not cancelled, its window open) and this
        runner lets it go (draining, or the lease lost), so another runner (or this one restarted) runs
        the line from the start."""
        goes_on = self.batch.status is BatchStatus.IN_PROGRESS and _now() < self.batch.expires_at
        return goes_on and (self._draining.is_set() or self._lost is not None)

    def _stop_reason(self) -> tuple[str, str]:
        if self.batch.status is BatchStatus.CANCELLING:
            return "batch_cancelled", "The batch was cancelled before this line finished."
        return "batch_expired", "The batch's completion window ended before this line finished."

    # ----- parts -----
    async def _flush_in_background(self) -> None:
        """Commit a part every ``flush_interval_s``, or sooner when ``part_max_lines`` ended. A store that
        cannot be reached is tried again at the next turn; a lost lease stops the batch."""
        while True:
            with suppress(TimeoutError):
                async with asyncio.timeout(self._limits.flush_interval_s):
                    await self._part_full.wait()
            self._part_full.clear()
            try:
                await self._flush()
            except (BatchStoreUnavailable, ObjectStoreUnavailable) as exc:
                _log_retry(exc, "batch %s: results not committed yet (%s); retrying", self.batch.batch_id)
            except LeaseLost as exc:
                self._lease_lost(exc)
                return

    async def _flush(self) -> None:
        """Commit the lines that ended as the next part: their results into the object store first, then
        the part (what makes them count). On failure they stay for the next flush."""
        async with self._flush_lock:
            results, self._ended = self._ended, []
            if not results:
                return
            try:
                await self._commit(results)
            except BaseException:
                self._ended = results + self._ended
                raise

    async def _flush_until_committed(self) -> None:
        """``_flush``, tried again while a store cannot be reached (backing off to ``MAX_RETRY_WAIT_S``) for
        as long as this runner holds the lease (its renewal goes on meanwhile; ``LeaseLost`` ends it).
        Giving up instead would drop the lines that ended: they would run again where the batch resumes,
        billed for the run they had here (the ledger keeps a row's first write) but reported with the
        rerun's output, and their tokens spent twice. A runner that stops meanwhile cuts this wait, as it
        cuts running lines."""
        wait_s = self._limits.flush_interval_s
        while True:
            try:
                await self._flush()
                return
            except (BatchStoreUnavailable, ObjectStoreUnavailable) as exc:
                _log_retry(exc, "batch %s: results not committed yet (%s); retrying", self.batch.batch_id)
            if self._lost is not None:
                raise self._lost
            await asyncio.sleep(wait_s)
            wait_s = min(wait_s * 2, MAX_RETRY_WAIT_S)

    async def _commit(self, results: list[LineResult]) -> None:
        batch, seq = self.batch, self._next_seq
        ok = [r for r in results if r.ok]
        failed = [r for r in results if not r.ok]
        prefix = f"batches/{batch.tenant_id}/{batch.batch_id}/part-{seq:06d}-{self._owner}"
        output_key = f"{prefix}.output.jsonl" if ok else None
        error_key = f"{prefix}.errors.jsonl" if failed else None
        for key, lines in ((output_key, ok), (error_key, failed)):
            if key is not None:
                await self._stores.objects.put(key, b"".join(r.encode(batch.batch_id) for r in lines))
        indices = tuple(sorted(r.index for r in results))
        part = BatchPart(seq, self._owner, indices, len(ok), len(failed), output_key, error_key)
        counts = await self._stores.batches.commit_part(batch.batch_id, self._owner, part)
        self._next_seq += 1
        for result in results:
            self._gw.metrics.batch_lines.labels(result.outcome).inc()
        self.batch = replace(self.batch, request_counts=counts)

    # ----- the end -----
    async def _finish(self, parsed: ParsedFile) -> None:
        """The result files, then the terminal status."""
        if self.batch.status is BatchStatus.IN_PROGRESS and _now() >= self.batch.expires_at:
            message = "The batch's completion window ended before this line ran."
            await self._report_not_run(parsed, "batch_expired", message)
            final = BatchStatus.EXPIRED
        elif self.batch.status is BatchStatus.CANCELLING:
            final = BatchStatus.CANCELLED
        else:
            if self.batch.status is not BatchStatus.FINALIZING:
                await self._advance(BatchStatus.FINALIZING)  # stays CANCELLING if a cancel came first
            cancelled = self.batch.status is BatchStatus.CANCELLING
            final = BatchStatus.CANCELLED if cancelled else BatchStatus.COMPLETED
        parts = await self._stores.batches.parts(self.batch.batch_id)  # every line's result is in one
        output_file_id, error_file_id = await self._write_result_files(parts)
        await self._advance(final, output_file_id=output_file_id, error_file_id=error_file_id)
        await self._delete_parts(parts)

    async def _report_not_run(self, parsed: ParsedFile, code: str, message: str) -> None:
        parts = await self._stores.batches.parts(self.batch.batch_id)
        done = {index for part in parts for index in part.line_indices}
        done.update(result.index for result in self._ended)
        for line in parsed.lines:
            if line.index not in done:
                self._ended.append(not_run(line.index, line.custom_id, code, message))
        await self._flush()

    async def _write_result_files(self, parts: list[BatchPart]) -> tuple[str | None, str | None]:
        """The output file (the lines answered) and the error file (the others), from ``parts`` in commit
        order; None for a file that would be empty."""
        batch, stores = self.batch, self._stores
        file_ids: list[str | None] = []
        for kind, keys in (
            ("output", [p.output_key for p in parts]),
            ("error", [p.error_key for p in parts]),
        ):
            chunks = [await stores.objects.get(key) for key in keys if key is not None]
            if not chunks:
                file_ids.append(None)
                continue
            name = f"{batch.batch_id}_{kind}.jsonl"
            data = b"".join(chunks)
            file_id = result_file_id(batch.batch_id, kind)  # a finish redone after a crash rewrites it
            stored = await stores.files.create(
                batch.tenant_id,
                name,
                "batch_output",
                data,
                file_id=file_id,
                expires_after_s=batch.output_expires_after_s,  # the batch's output_expires_after
            )
            file_ids.append(stored.file_id)
        return file_ids[0], file_ids[1]

    async def _delete_parts(self, parts: list[BatchPart]) -> None:
        """The parts' objects, once the result files hold them (best effort: a leftover costs only space)."""
        for part in parts:
            for key in (part.output_key, part.error_key):
                if key is not None:
                    with suppress(Exception):
                        await self._stores.objects.delete(key)

    async def _delete_input_copy(self) -> None:
        """The batch's copy of its input file, once the batch ended (best effort, as ``_delete_parts``)."""
        if self.batch.input_key is not None:
            with suppress(Exception):
                await self._stores.objects.delete(self.batch.input_key)

    # ----- the lease and the status -----
    async def _keep_lease(self) -> None:
        """Renew the lease every third of it (at most every 2 s, so a cancel from another gateway is seen
        soon). A store that cannot be reached is tried again; a lost lease stops the batch."""
        interval_s = min(2.0, self._limits.lease_s / 3)
        batches = self._stores.batches
        while True:
            await asyncio.sleep(interval_s)
            try:
                batch = await batches.renew(self.batch.batch_id, self._owner, self._limits.lease_s, _now())
            except BatchStoreUnavailable as exc:
                _log_retry(exc, "batch %s: lease not renewed (%s); retrying", self.batch.batch_id)
                continue
            except LeaseLost as exc:
                self._lease_lost(exc)
                return
            if batch.status is BatchStatus.CANCELLING:
                self._cancelling()

    def _cancelling(self) -> None:
        if self.batch.status is not BatchStatus.CANCELLING:
            self.batch = replace(self.batch, status=BatchStatus.CANCELLING)
        self._stop.set()

    def _lease_lost(self, exc: LeaseLost) -> None:
        log.warning("batch %s: lease lost to another runner; stopping here", self.batch.batch_id)
        self._lost = exc
        self._stop.set()

    async def _advance(
        self,
        status: BatchStatus,
        *,
        total: int | None = None,
        output_file_id: str | None = None,
        error_file_id: str | None = None,
        errors: tuple[BatchError, ...] = (),
    ) -> None:
        self.batch = await self._stores.batches.advance(
            self.batch.batch_id,
            self._owner,
            status,
            _now(),
            total=total,
            output_file_id=output_file_id,
            error_file_id=error_file_id,
            errors=errors,
        )
        if self.batch.status is BatchStatus.CANCELLING:
            self._stop.set()
        if self.batch.status in TERMINAL_STATUSES:
            await self._delete_input_copy()  # nothing reads it again
            counts = self.batch.request_counts
            log.info(
                "batch %s %s: %d of %d lines completed, %d failed",
                self.batch.batch_id,
                self.batch.status,
                counts.completed,
                counts.total,
                counts.failed,
            )


def _log_retry(exc: Exception, message: str, batch_id: str) -> None:
    """A retry after a store failed: a debug line when it is the batch store's outage, which the store
    reports once each way itself (``sluice.outages``); a warning for the object store, which does not."""
    level = logging.DEBUG if isinstance(exc, BatchStoreUnavailable) else logging.WARNING
    log.log(level, message, batch_id, exc)
