"""The ledger's one interface; every backend passes the same contract tests (tests/core/test_ledger.py)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sluice.domain import Outcome, RequestClass, UsageGroup, UsageRecord, UsageReport, UsageTotals

# The usage table's columns, in the order every backend writes and reads them.
USAGE_COLUMNS = (
    "tenant_id, request_id, model, model_version, prompt_tokens, output_tokens, status,"
    " started_at, finished_at, attempt, idempotency_key, ttft_ms, itl_p95_ms, request_class"
)

# The write's rule, shared by both dialects: a row, once written, never changes. Every attempt has its own
# request id, so a second write of one (tenant, request id) is the same record replayed (a lost done line
# in the outbox, a restart): keeping the first makes every replay a no-op and no write can lower a bill.
KEEP_THE_FIRST = "ON CONFLICT (tenant_id, request_id) DO NOTHING"


def record_from_row(row: tuple[Any, ...], to_utc: Callable[[Any], datetime]) -> UsageRecord:
    """A ``USAGE_COLUMNS`` row as a record; ``to_utc`` turns the backend's timestamp into aware UTC."""
    t, r, m, v, p, o, s, started, finished, attempt, key, ttft_ms, itl_p95_ms, request_class = row
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
        ttft_ms=ttft_ms,
        itl_p95_ms=itl_p95_ms,
        request_class=RequestClass(request_class),
    )


def usage_groups_sql(cond: str) -> str:
    """The report's totals, per (model, request class), over the rows matching ``cond``."""
    return (
        "SELECT model, request_class, count(*), sum(prompt_tokens), sum(output_tokens)"
        f" FROM usage WHERE {cond} GROUP BY model, request_class"
    )


def totals_from(groups: Iterable[tuple[Any, ...]]) -> UsageTotals:
    """The totals from ``usage_groups_sql``'s rows, the same for every backend: the groups sorted by model
    and class (in Python, so no database collation decides the order), and their sums."""
    parsed = sorted(
        (UsageGroup(m, RequestClass(c), int(n), int(p), int(o)) for m, c, n, p, o in groups),
        key=lambda g: (g.model, g.request_class.value),
    )
    return UsageTotals(
        num_requests=sum(g.num_requests for g in parsed),
        prompt_tokens=sum(g.prompt_tokens for g in parsed),
        output_tokens=sum(g.output_tokens for g in parsed),
        groups=tuple(parsed),
    )


class LedgerUnavailable(Exception):
    """The ledger cannot answer a read now (its server or the network is down): retry later."""


# ---- per-version traffic, for comparing the versions of a model during a rollout ----

# The outcomes that are the service failing the request, counted as errors. FAILED (the replica or engine
# failed) and GATEWAY_LOST (the gateway died mid-request) plainly are. DEADLINE is too: the deadline is the
# service's own time budget (settings, not the client's choice), and a version that stalls before its
# first token shows nowhere else (such a request has no TTFT to raise the p95). Not errors: CANCELLED (the
# client went away), FILTERED (the tenant's safety policy judged the output: content, not service health).
# REFUSED, REPLAYED and INTERRUPTED requests write no row (``ROWLESS_OUTCOMES``).
ERROR_OUTCOMES: frozenset[Outcome] = frozenset({Outcome.FAILED, Outcome.GATEWAY_LOST, Outcome.DEADLINE})

ROWLESS_OUTCOMES: frozenset[Outcome] = frozenset({Outcome.REFUSED, Outcome.REPLAYED, Outcome.INTERRUPTED})

# The latency percentiles read at most this many rows per version (the newest in the window that have a
# latency), so a long window over busy traffic stays a bounded read; the counts and token sums always
# cover every row of the window.
MAX_LATENCY_ROWS_PER_VERSION = 50_000


@dataclass(frozen=True)
class VersionTraffic:
    """One version's traffic over a window (rows finished at or after its start)."""

    model_version: str
    num_requests: int
    num_errors: int  # rows whose status is in ERROR_OUTCOMES
    prompt_tokens: int
    output_tokens: int
    ttft_p95_ms: float | None  # over the rows that have a TTFT; None when none has
    itl_p95_ms: float | None  # the p95 of the rows' own inter-token p95s; None when none has one

    @property
    def error_rate(self) -> float:
        return self.num_errors / self.num_requests if self.num_requests else 0.0


def p95(values: Iterable[float]) -> float | None:
    """The nearest-rank 95th percentile (a value that occurred, no interpolation); None for no values.
    The one definition of p95 the ledger and the gateway's usage rows both use."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = (95 * len(ordered) + 99) // 100  # ceil(0.95 n) in integers: no float rounding at the edges
    return ordered[rank - 1]


def version_traffic_sql() -> tuple[str, str]:
    """The two reads of ``version_traffic``: per-version totals (params: ``error_statuses()``, model,
    since), and one version's newest latencies (params: model, version, since, limit)."""
    p = "?"
    errors = ", ".join([p] * len(ERROR_OUTCOMES))
    totals = (
        f"SELECT model_version, count(*), sum(CASE WHEN status IN ({errors}) THEN 1 ELSE 0 END),"
        " sum(prompt_tokens), sum(output_tokens)"
        f" FROM usage WHERE model = {p} AND finished_at >= {p} GROUP BY model_version"
    )
    latencies = (
        "SELECT ttft_ms, itl_p95_ms FROM usage"
        f" WHERE model = {p} AND model_version = {p} AND finished_at >= {p}"
        " AND (ttft_ms IS NOT NULL OR itl_p95_ms IS NOT NULL)"
        f" ORDER BY finished_at DESC, tenant_id DESC, request_id DESC LIMIT {p}"
    )
    return totals, latencies


def error_statuses() -> list[str]:
    """The ``ERROR_OUTCOMES`` as the status column holds them, in a fixed order (the SQL's params)."""
    return sorted(o.value for o in ERROR_OUTCOMES)


def version_traffic_from(
    totals: Sequence[tuple[Any, ...]], latencies: Mapping[str, Sequence[tuple[Any, ...]]]
) -> list[VersionTraffic]:
    """The result from the two reads' rows, the same for every backend: one entry per version, sorted by
    version (in Python, so no database collation decides the order)."""
    traffic = []
    for version, n, num_errors, prompt_tokens, output_tokens in totals:
        rows = latencies.get(version, ())
        traffic.append(
            VersionTraffic(
                model_version=version,
                num_requests=int(n),
                num_errors=int(num_errors),
                prompt_tokens=int(prompt_tokens),
                output_tokens=int(output_tokens),
                ttft_p95_ms=p95(float(t) for t, _ in rows if t is not None),
                itl_p95_ms=p95(float(i) for _, i in rows if i is not None),
            )
        )
    return sorted(traffic, key=lambda t: t.model_version)


# ---- usage per tenant, for the operator's usage and cost report (every tenant, or one) ----


@dataclass(frozen=True)
class TenantUsage:
    """One tenant's rows of one (model, request class) over a window, summed: a line of the operator's
    report, and what a price applies to (``group``)."""

    tenant_id: str
    model: str
    request_class: RequestClass
    num_requests: int
    num_errors: int  # rows whose status is in ERROR_OUTCOMES
    prompt_tokens: int
    output_tokens: int

    @property
    def group(self) -> UsageGroup:
        """The line as ``sluice.pricing`` prices it (the tenant does not change the price)."""
        return UsageGroup(
            self.model, self.request_class, self.num_requests, self.prompt_tokens, self.output_tokens
        )


def usage_by_tenant_sql(
    *,
    since: object,
    until: object | None,
    tenant_id: str | None,
    model: str | None,
    request_class: RequestClass | None,
) -> tuple[str, list[object]]:
    """``usage_by_tenant``'s one read and its params, the times already as the backend stores them.
    Totals per (tenant, model, request class) over
    ``since <= finished_at < until``, each optional filter an equality."""
    p = "?"
    errors = ", ".join([p] * len(ERROR_OUTCOMES))
    where, params = [f"finished_at >= {p}"], [*error_statuses(), since]
    for column, value in (
        ("finished_at <", until),
        ("tenant_id =", tenant_id),
        ("model =", model),
        ("request_class =", None if request_class is None else request_class.value),
    ):
        if value is not None:
            where.append(f"{column} {p}")
            params.append(value)
    sql = (
        "SELECT tenant_id, model, request_class, count(*),"
        f" sum(CASE WHEN status IN ({errors}) THEN 1 ELSE 0 END), sum(prompt_tokens), sum(output_tokens)"
        f" FROM usage WHERE {' AND '.join(where)} GROUP BY tenant_id, model, request_class"
    )
    return sql, params


def tenant_usage_from(rows: Iterable[tuple[Any, ...]]) -> list[TenantUsage]:
    """``usage_by_tenant_sql``'s rows, the same for every backend: sorted by tenant, model and class (in
    Python, so no database collation decides the order)."""
    parsed = (
        TenantUsage(t, m, RequestClass(c), int(n), int(e), int(p), int(o)) for t, m, c, n, e, p, o in rows
    )
    return sorted(parsed, key=lambda u: (u.tenant_id, u.model, u.request_class.value))


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
        request_class: RequestClass | None = None,
        limit: int = 100,
    ) -> UsageReport:
        """Totals over the filter (and per model and request class) and the newest ``limit`` rows, for
        ``tenant_id`` only.

        The time range is on ``finished_at``: ``since <= finished_at < until``. Rows come newest first
        (``finished_at``, then ``request_id``, descending), with timezone-aware UTC timestamps.
        """

    @abstractmethod
    async def version_traffic(self, model: str, since: datetime) -> list[VersionTraffic]:
        """Each version of ``model`` that has rows finished at or after ``since`` (every tenant), sorted by
        version: its requests, errors (``ERROR_OUTCOMES``), tokens, and the p95 of TTFT and of the rows'
        inter-token p95 over the newest ``MAX_LATENCY_ROWS_PER_VERSION`` rows that have them (None when
        none has). All of it from one snapshot. ``since`` must be timezone-aware.

        Raises ``LedgerUnavailable`` when the ledger's server cannot be reached.
        """

    @abstractmethod
    async def usage_by_tenant(
        self,
        *,
        since: datetime,
        until: datetime | None = None,
        tenant_id: str | None = None,
        model: str | None = None,
        request_class: RequestClass | None = None,
    ) -> list[TenantUsage]:
        """Every tenant's usage over ``since <= finished_at < until`` (no ``until``: up to now and on), one
        entry per (tenant, model, request class) that has rows: requests, errors (``ERROR_OUTCOMES``) and
        tokens. Sorted by tenant, model, then class. ``tenant_id``, ``model`` and ``request_class`` keep
        only the rows that match; other tenants' rows never count in a tenant's entries. For operators
        (the control plane's usage report): a tenant's own reads go through ``query``.

        ``since`` (required) and ``until`` must be timezone-aware, ``until`` after ``since``; a filter,
        when given, non-empty. Raises ``LedgerUnavailable`` when the ledger's server cannot be reached.
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
    if rec.status in ROWLESS_OUTCOMES:
        raise ValueError(f"a {rec.status} request writes no usage row")
    if rec.idempotency_key == "":
        raise ValueError("idempotency_key must be None or non-empty")
    _check_aware("started_at", rec.started_at)
    _check_aware("finished_at", rec.finished_at)
    for name, ms in (("ttft_ms", rec.ttft_ms), ("itl_p95_ms", rec.itl_p95_ms)):
        if ms is not None and not (math.isfinite(ms) and ms >= 0):
            raise ValueError(f"{name} must be None or a finite number >= 0, got {ms}")


def check_version_traffic_args(model: str, since: datetime) -> None:
    if not model:
        raise ValueError("model must be non-empty")
    if since is None:
        raise ValueError("since must be a timezone-aware datetime, got None")
    _check_aware("since", since)


def check_query_args(since: datetime | None, until: datetime | None, limit: int) -> None:
    _check_aware("since", since)
    _check_aware("until", until)
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")


def check_usage_by_tenant_args(
    since: datetime, until: datetime | None, tenant_id: str | None, model: str | None
) -> None:
    if since is None:
        raise ValueError("since must be a timezone-aware datetime, got None")
    check_query_args(since, until, limit=0)
    if until is not None and until <= since:
        raise ValueError(f"until must be after since, got {since.isoformat()} .. {until.isoformat()}")
    if tenant_id == "" or model == "":
        raise ValueError("tenant_id and model must be None (every one) or non-empty")
