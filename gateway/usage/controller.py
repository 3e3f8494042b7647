"""GET /v1/usage: totals and per-request rows for the caller's tenant only, filtered by ``since`` /
``until`` (unix seconds or ISO 8601), ``model`` and ``idempotency_key``. A request sent with an
Idempotency-Key has one row per attempt that reached a replica, each carrying the key and its attempt."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import Controller, Request, get
from litestar.params import FromQuery

from gateway.auth import require_tenant, tenant_of
from gateway.errors import OpenAIError, error_responses, invalid_request
from gateway.state import GatewayState
from sluice.ledger.base import LedgerUnavailable

log = logging.getLogger(__name__)


class UsageRow(msgspec.Struct):
    request_id: str
    model: str
    model_version: str
    prompt_tokens: int
    output_tokens: int
    status: str
    started_at: int  # unix seconds
    finished_at: int
    idempotency_key: str | None = None  # the Idempotency-Key the request was sent with
    attempt: int = 1  # which attempt under that key (each is billed on its own row)


class UsageTotalsOut(msgspec.Struct):
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    total_tokens: int


class UsageResponse(msgspec.Struct):
    tenant_id: str
    totals: UsageTotalsOut
    data: list[UsageRow]
    object: str = "usage"


def parse_time(value: str | None, param: str) -> datetime | None:
    """Unix seconds ("1717171717", "1717171717.5") or ISO 8601 (naive means UTC), as an aware UTC time.

    400 for anything else, and for a time no timestamp can hold: NaN, infinities, or before year 1 / after
    year 9999 once in UTC (``1e20``, ``9999-12-31T23:59:59-05:00``)."""
    if value is None or value == "":
        return None
    shown = value if len(value) <= 40 else value[:40] + "..."
    try:
        seconds: float | None = float(value)
    except ValueError:
        seconds = None
    try:
        if seconds is not None:
            return datetime.fromtimestamp(seconds, UTC)
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, OverflowError, OSError):  # NaN, inf, out of range; or not ISO 8601 at all
        raise invalid_request(
            f"{param} must be unix seconds or an ISO 8601 time between years 1 and 9999, got {shown!r}.",
            param=param,
        ) from None
    try:
        return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except OverflowError:  # a valid local time whose UTC instant is outside years 1-9999
        raise invalid_request(
            f"{param} is out of range once in UTC (years 1 to 9999), got {shown!r}.", param=param
        ) from None


class UsageController(Controller):
    path = "/v1/usage"
    guards = [require_tenant]  # noqa: RUF012
    tags = ["Usage"]  # noqa: RUF012

    @get("/", responses=error_responses(400, 401, 503))
    async def usage(
        self,
        request: Request[Any, Any, Any],
        since: FromQuery[str | None] = None,
        until: FromQuery[str | None] = None,
        model: FromQuery[str | None] = None,
        idempotency_key: FromQuery[str | None] = None,
        limit: FromQuery[int] = 100,
    ) -> UsageResponse:
        if not 1 <= limit <= 1000:
            raise invalid_request("limit must be in [1, 1000].", param="limit")
        gw: GatewayState = request.app.state.gw
        tenant = tenant_of(request)
        try:
            report = await gw.ledger.query(
                tenant.tenant_id,
                since=parse_time(since, "since"),
                until=parse_time(until, "until"),
                model=model,
                idempotency_key=idempotency_key,
                limit=limit,
            )
        except LedgerUnavailable as exc:
            log.warning("GET /v1/usage: %s", exc)
            raise OpenAIError(
                503,
                "Usage cannot be read now: the usage ledger is unavailable. Retry later.",
                type="server_error",
                code="usage_ledger_unavailable",
                retry_after_s=5.0,
            ) from None
        totals = report.totals
        return UsageResponse(
            tenant_id=tenant.tenant_id,
            totals=UsageTotalsOut(
                totals.num_requests,
                totals.prompt_tokens,
                totals.output_tokens,
                totals.prompt_tokens + totals.output_tokens,
            ),
            data=[
                UsageRow(
                    r.request_id,
                    r.model,
                    r.model_version,
                    r.prompt_tokens,
                    r.output_tokens,
                    str(r.status),
                    int(r.started_at.timestamp()),
                    int(r.finished_at.timestamp()),
                    r.idempotency_key,
                    r.attempt,
                )
                for r in report.rows
            ],
        )
