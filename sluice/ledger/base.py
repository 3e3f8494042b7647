"""The ledger's one interface; every backend passes the same contract tests (tests/core/test_ledger.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sluice.domain import Outcome, UsageRecord, UsageReport

# The usage table's columns, in the order every backend writes and reads them.
USAGE_COLUMNS = (
    "tenant_id, request_id, model, model_version, prompt_tokens, output_tokens, status,"
    " started_at, finished_at, attempt"
)

# The upsert's rule, shared by both dialects (``excluded`` is the row being written): a later attempt
# replaces every column of an earlier one's row; the same or an older attempt changes nothing.
UPSERT_CLAUSE = (
    "ON CONFLICT (tenant_id, request_id) DO UPDATE SET model = excluded.model,"
    " model_version = excluded.model_version, prompt_tokens = excluded.prompt_tokens,"
    " output_tokens = excluded.output_tokens, status = excluded.status, started_at = excluded.started_at,"
    " finished_at = excluded.finished_at, attempt = excluded.attempt"
    " WHERE usage.attempt < excluded.attempt"
)


def record_from_row(row: tuple[Any, ...], to_utc: Callable[[Any], datetime]) -> UsageRecord:
    """A ``USAGE_COLUMNS`` row as a record; ``to_utc`` turns the backend's timestamp into aware UTC."""
    t, r, m, v, p, o, s, started, finished, attempt = row
    return UsageRecord(
        tenant_id=t,
        request_id=r,
        model=m,
        model_version=v,
        prompt_tokens=p,
        output_tokens=o,
        status=Outcome(s),
        started_at=to_utc(started),
        finished_at=to_utc(finished),
        attempt=attempt,
    )


class UsageLedger(ABC):
    @abstractmethod
    async def open(self) -> None:
        """Connect and apply pending schema migrations (idempotent)."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def record(self, rec: UsageRecord) -> bool:
        """Upsert ``rec``: per (tenant_id, request_id) the ledger keeps the row of the highest ``attempt``.

        A later attempt replaces an earlier one's row whole (tokens, status, timestamps: never a sum); the
        same or an older attempt written again changes nothing, so replaying a record, twice or out of
        order, never changes the result. True if the stored row changed (inserted or replaced), else False.

        Once called, the write completes even if the caller is cancelled while awaiting it (the await
        raises, the row still lands; ``close()`` waits for it).
        """

    @abstractmethod
    async def query(
        self,
        tenant_id: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        model: str | None = None,
        limit: int = 100,
    ) -> UsageReport:
        """Totals over the filter and the newest ``limit`` rows, for ``tenant_id`` only.

        The time range is on ``finished_at``: ``since <= finished_at < until``. Rows come newest first
        (``finished_at``, then ``request_id``, descending), with timezone-aware UTC timestamps.
        """


def _check_aware(name: str, ts: datetime | None) -> None:
    if ts is not None and ts.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got naive {ts.isoformat()}")


def check_record(rec: UsageRecord) -> None:
    """What every backend refuses before touching storage."""
    if not rec.tenant_id or not rec.request_id:
        raise ValueError("tenant_id and request_id must be non-empty")
    if rec.prompt_tokens < 0 or rec.output_tokens < 0:
        raise ValueError(f"token counts must be >= 0, got {rec.prompt_tokens}, {rec.output_tokens}")
    if rec.attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {rec.attempt}")
    _check_aware("started_at", rec.started_at)
    _check_aware("finished_at", rec.finished_at)


def check_query_args(since: datetime | None, until: datetime | None, limit: int) -> None:
    _check_aware("since", since)
    _check_aware("until", until)
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
