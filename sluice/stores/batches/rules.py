"""What both batch store backends decide the same way, before or inside their transactions: which input
is refused (``ValueError``), where a lease ends, and which status ``advance`` really moves to. Pure: no
I/O."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from sluice.stores.batches.base import TERMINAL_STATUSES, Batch, BatchPart, BatchStatus

# What ``create`` accepts: a batch that has not started running (the API validates first or not).
NEW_STATUSES = frozenset({BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS})
# Where ``request_cancel`` moves a batch from (any other status is left as it is).
CANCELLABLE_STATUSES = frozenset({BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS})
# Where a CANCELLING batch may still go: the cancel request wins any other move.
AFTER_CANCELLING = frozenset({BatchStatus.CANCELLING, BatchStatus.CANCELLED, BatchStatus.FAILED})
MAX_LIST_LIMIT = 1000


def utc(ts: datetime) -> datetime:
    """``ts`` in UTC; a naive timestamp is refused (it would be read as the machine's local time)."""
    if ts.tzinfo is None or ts.utcoffset() is None:
        raise ValueError(f"timestamp {ts.isoformat()} has no timezone (the batch store takes UTC)")
    return ts.astimezone(UTC)


def lease_end(now: datetime, lease_s: float) -> datetime:
    if not 0 < lease_s <= 86_400:
        raise ValueError(f"lease_s must be in (0, 86400] seconds, got {lease_s}")
    return utc(now) + timedelta(seconds=lease_s)


def check_new_batch(batch: Batch) -> None:
    if batch.status not in NEW_STATUSES:
        raise ValueError(f"a new batch is validating or in_progress, not {batch.status}")
    counts = batch.request_counts
    if min(counts.total, counts.completed, counts.failed) < 0:
        raise ValueError(f"request counts cannot be negative: {counts}")
    if batch.output_expires_after_s is not None and batch.output_expires_after_s <= 0:
        raise ValueError(f"output_expires_after_s must be > 0, got {batch.output_expires_after_s}")
    utc(batch.created_at), utc(batch.expires_at)


def check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise ValueError(f"limit must be in 1..{MAX_LIST_LIMIT}, got {limit}")


def check_part(owner: str, part: BatchPart) -> None:
    """A part that is consistent on its own: written by ``owner``, distinct non-negative lines, one
    outcome per line."""
    if part.owner != owner:
        raise ValueError(f"part written by {part.owner!r} committed by {owner!r}")
    if part.seq < 0 or part.num_completed < 0 or part.num_failed < 0:
        raise ValueError(f"part {part.seq}: seq and counts cannot be negative")
    if not part.line_indices:
        raise ValueError(f"part {part.seq} has no line")
    if min(part.line_indices) < 0 or len(set(part.line_indices)) != len(part.line_indices):
        raise ValueError(f"part {part.seq}: line indices must be distinct and >= 0")
    if part.num_completed + part.num_failed != len(part.line_indices):
        raise ValueError(
            f"part {part.seq}: {part.num_completed} completed + {part.num_failed} failed lines"
            f" but {len(part.line_indices)} line indices"
        )


def check_next_part(part: BatchPart, num_parts: int, committed_lines: Iterable[Iterable[int]]) -> None:
    """``part`` follows the ``num_parts`` committed ones and shares no line with them."""
    if part.seq != num_parts:
        raise ValueError(f"part seq {part.seq} is not the batch's next ({num_parts})")
    lines = set(part.line_indices)
    again = sorted(i for committed in committed_lines for i in committed if i in lines)
    if again:
        raise ValueError(f"lines already in a committed part: {again[:10]}")


def advanced_status(current: BatchStatus, asked: BatchStatus) -> BatchStatus:
    """The status ``advance(asked)`` leaves a batch in: a cancel request wins the race with the runner."""
    if current is BatchStatus.CANCELLING and asked not in AFTER_CANCELLING:
        return BatchStatus.CANCELLING
    return asked


def releases_lease(status: BatchStatus) -> bool:
    return status in TERMINAL_STATUSES
