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
    " started_at, finished_at, attempt, idempotency_key"
)

# The write's rule, shared by both dialects: a row, once written, never changes. Every attempt has its own
# request id, so a second write of one (tenant, request id) is the same record replayed (a lost done line
# in the outbox, a restart): keeping the first makes every replay a no-op and no write can lower a bill.
KEEP_THE_FIRST = "ON CONFLICT (tenant_id, request_id) DO NOTHING"


def record_from_row(row: tuple[Any, ...], to_utc: Callable[[Any], datetime]) -> UsageRecord:
    """A ``USAGE_COLUMNS`` row as a record; ``to_utc`` turns the backend's timestamp into aware UTC."""
    t, r, m, v, p, o, s, started, finished, attempt, key = row
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
        idempotency_key=key,
    )


class LedgerUnavailable(Exception):
    """The ledger cannot answer a read now (its server or the network is down): retry later."""


class UsageLedger(ABC):
    @abstractmethod
    async def open(self) -> None:
        """Connect and apply pending schema migrations (idempotent)."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def record(self, rec: UsageRecord) -> bool:
        """Insert ``rec`` as the row of (tenant_id, request_id); True if it was inserted. A row, once
        written, never changes: the same (tenant_id, request_id) again is False and changes nothing, so
        replaying a record, twice or out of order, never changes the result (and never lowers a bill).
        Each attempt under an Idempotency-Key is its own request id, so each is its own row.

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
        idempotency_key: str | None = None,
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
    if rec.idempotency_key == "":
        raise ValueError("idempotency_key must be None or non-empty")
    _check_aware("started_at", rec.started_at)
    _check_aware("finished_at", rec.finished_at)


def check_query_args(since: datetime | None, until: datetime | None, limit: int) -> None:
    _check_aware("since", since)
    _check_aware("until", until)
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
