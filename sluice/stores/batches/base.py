"""The batch store's one interface: every backend (PostgreSQL, SQLite) passes one contract suite
(tests/core/test_batch_store.py).

A batch's lines run in the gateway (``gateway.batches``). The store holds what must survive a restart:
the batch (status, timestamps, counts, result files) and its *parts*. A part is a set of lines that
ended (completed or failed) whose results were written to the file store before the part was
committed; a committed part is never run again, so the counts (the sum over committed parts) are exact,
and a line in no committed part runs again after a restart (its usage row is keyed by batch and
``custom_id``, so the ledger keeps one row whatever happens).

One runner at a time holds a batch, by a lease (``claim``/``renew``) that another runner may take once
it expires; every write a runner makes names its ``owner`` and fails with ``LeaseLost`` if it no longer
holds the lease, so a runner that stalled past its lease cannot overwrite the new holder's work. A runner
*holds* the lease while the batch names it as the lease's owner: until another runner claims it after it
ended, or it is released (an ended lease nobody claimed yet is still its owner's, and ``renew`` extends it).

Timestamps given to the store must be timezone-aware (a naive one is a ``ValueError``).
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class BatchStatus(StrEnum):
    """OpenAI's batch statuses."""

    VALIDATING = "validating"
    FAILED = "failed"  # validation failed: nothing ran
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"  # every line ended; the output and error files are being written
    COMPLETED = "completed"
    EXPIRED = "expired"  # the completion window passed first; lines not run are in the error file
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset({BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED,
                               BatchStatus.CANCELLED})  # fmt: skip
# What a runner claims: a batch with work left (a CANCELLING batch still has its results to write).
ACTIVE_STATUSES = frozenset({BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING,
                             BatchStatus.CANCELLING})  # fmt: skip
# The status column's timestamp each status sets when the batch enters it (OpenAI's ``<status>_at``).
STATUS_TIMESTAMPS = {
    BatchStatus.IN_PROGRESS: "in_progress_at",
    BatchStatus.FINALIZING: "finalizing_at",
    BatchStatus.COMPLETED: "completed_at",
    BatchStatus.FAILED: "failed_at",
    BatchStatus.EXPIRED: "expired_at",
    BatchStatus.CANCELLING: "cancelling_at",
    BatchStatus.CANCELLED: "cancelled_at",
}


class UnknownBatchError(LookupError):
    """No such batch for this tenant (another tenant's batch is unknown too)."""


class LeaseLost(RuntimeError):
    """The runner no longer holds the batch's lease (it expired and another runner claimed it): stop
    working on it, write nothing more."""


class BatchStoreUnavailable(ConnectionError):
    """The store cannot answer now (server down, file locked): nothing was written; retry later."""


@dataclass(frozen=True)
class RequestCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True)
class BatchError:
    """A validation error of the whole batch (OpenAI's ``errors.data``)."""

    code: str
    message: str
    line: int | None = None  # 1-based line of the input file
    param: str | None = None


@dataclass(frozen=True)
class Batch:
    batch_id: str  # "batch_<hex>"
    tenant_id: str
    endpoint: str  # "/v1/chat/completions" or "/v1/completions"
    input_file_id: str
    completion_window: str  # "24h"
    status: BatchStatus
    created_at: datetime  # timezone-aware UTC, as every timestamp here
    expires_at: datetime
    request_counts: RequestCounts = RequestCounts()
    metadata: dict[str, str] = field(default_factory=dict)
    in_progress_at: datetime | None = None
    finalizing_at: datetime | None = None
    completed_at: datetime | None = None
    failed_at: datetime | None = None
    expired_at: datetime | None = None
    cancelling_at: datetime | None = None
    cancelled_at: datetime | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: tuple[BatchError, ...] = ()
    # The result files expire this long after they are written (OpenAI's ``output_expires_after``); None:
    # never.
    output_expires_after_s: int | None = None
    # The batch's own copy of its input file in the object store, read instead of ``input_file_id`` so
    # that deleting (or expiring) that file leaves the batch alone. None: a batch created before batches
    # kept a copy, which reads ``input_file_id``.
    input_key: str | None = None


@dataclass(frozen=True)
class BatchPart:
    """Lines that ended, with their results already in the file store under ``output_key`` and
    ``error_key`` (None: the part has no line of that kind). ``line_indices``: 0-based lines of the
    input file, each in at most one committed part of its batch."""

    seq: int  # 0, 1, ... in commit order
    owner: str  # the runner that wrote it (its objects' keys name it)
    line_indices: tuple[int, ...]
    num_completed: int
    num_failed: int
    output_key: str | None
    error_key: str | None


class BatchStore(ABC):
    @abstractmethod
    async def open(self) -> None:
        """Connect and apply pending schema migrations (idempotent)."""

    @abstractmethod
    async def close(self) -> None: ...

    # ----- the API's side (tenant-scoped) -----
    @abstractmethod
    async def create(self, batch: Batch) -> None:
        """Insert a new batch (status VALIDATING or IN_PROGRESS, no lease). ValueError if its id exists."""

    @abstractmethod
    async def get(self, tenant_id: str, batch_id: str) -> Batch:
        """The tenant's batch; ``UnknownBatchError`` if it has none with this id."""

    @abstractmethod
    async def list(self, tenant_id: str, *, after: str | None = None, limit: int = 20) -> list[Batch]:
        """The tenant's batches, newest first (``created_at``, then ``batch_id``, descending); ``after``:
        only those after that batch in this order (a cursor; ``UnknownBatchError`` if it is not the
        tenant's). At most ``limit`` (ValueError outside 1..1000)."""

    @abstractmethod
    async def num_active(self, tenant_id: str) -> int:
        """How many of the tenant's batches are in ``ACTIVE_STATUSES`` (queued or running): what the API
        holds against ``SLUICE_BATCH_MAX_ACTIVE_PER_TENANT`` before it creates another."""

    @abstractmethod
    async def request_cancel(self, tenant_id: str, batch_id: str, now: datetime) -> Batch:
        """VALIDATING or IN_PROGRESS → CANCELLING (``cancelling_at`` = now); any other status is left as
        it is (cancelling twice, or a batch already ended, changes nothing). Returns the batch after."""

    # ----- the runner's side -----
    @abstractmethod
    async def claim(self, owner: str, lease_s: float, now: datetime) -> Batch | None:
        """Take the lease of a batch in ``ACTIVE_STATUSES`` that no runner holds (never leased, released,
        or its lease ended at or before ``now``): it is held by ``owner`` until ``now + lease_s``
        (``lease_s`` in (0, 86400], else ValueError). None when there is none. Two runners never hold one
        batch at once.

        Which one: the oldest of those whose tenant holds the fewest batches now (by any runner). So a
        tenant with many batches queued keeps no other tenant's batch waiting: each gets one running
        before anyone gets a second, a second before anyone a third, and so on (then their lines share
        the models' fair queues); the oldest-first order applies only among tenants holding as many."""

    @abstractmethod
    async def renew(self, batch_id: str, owner: str, lease_s: float, now: datetime) -> Batch:
        """Extend ``owner``'s lease to ``now + lease_s``; returns the batch as it is now (a runner sees a
        cancel request this way). ``LeaseLost`` if ``owner`` does not hold it."""

    @abstractmethod
    async def release(self, batch_id: str, owner: str) -> None:
        """Give the lease up (a runner stopping cleanly), so another may claim the batch at once. Does
        nothing if ``owner`` does not hold it."""

    @abstractmethod
    async def commit_part(self, batch_id: str, owner: str, part: BatchPart) -> RequestCounts:
        """Record ``part`` and add its lines to the counts, in one transaction; returns the new counts.
        ``LeaseLost`` if ``owner`` does not hold the lease (nothing recorded). ValueError if ``part.seq``
        is not the batch's next or a line is already in a committed part, and for a part inconsistent in
        itself: written by another owner, no line, a line twice or negative, or ``num_completed +
        num_failed`` not its number of lines."""

    @abstractmethod
    async def parts(self, batch_id: str) -> builtins.list[BatchPart]:
        """The batch's committed parts in ``seq`` order (none for an unknown batch)."""

    @abstractmethod
    async def advance(
        self,
        batch_id: str,
        owner: str,
        status: BatchStatus,
        now: datetime,
        *,
        total: int | None = None,
        output_file_id: str | None = None,
        error_file_id: str | None = None,
        errors: tuple[BatchError, ...] = (),
    ) -> Batch:
        """Move the batch to ``status`` (setting its ``STATUS_TIMESTAMPS`` column to ``now`` the first time
        it enters it), and set what is given: the line count (``total``, when validation counted it), the
        result files, the validation errors. A terminal status also releases the lease. ``LeaseLost`` if
        ``owner`` does not hold it.

        A cancel request wins a race with the runner: a batch in CANCELLING moves only to CANCELLED or
        FAILED; asked for another status it stays CANCELLING (the rest is still set), and the returned
        batch tells the runner so."""
