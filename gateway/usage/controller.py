"""GET /v1/usage: totals and per-request rows for the caller's tenant only, filtered by ``since`` /
``until`` (unix seconds or ISO 8601), ``model``, ``idempotency_key`` and ``request_class``. A request sent
with an Idempotency-Key has one row per attempt that reached a replica, each carrying the key and its
attempt.

Costs are in USD at the configured prices (``SLUICE_PRICES``, batch-class tokens at
``SLUICE_BATCH_DISCOUNT`` off; sluice/pricing.py), as they are now: null where a model has no price. The
totals break down by (model, request class) over every row of the filter, not only the rows returned."""

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
from sluice.domain import RequestClass, UsageGroup, UsageRecord, UsageTotals
from sluice.pricing import Prices, total_cost_usd
from sluice.stores.ledger.base import LedgerUnavailable

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
    request_class: str = RequestClass.INTERACTIVE.value  # "batch": batch lines and service_tier "flex"
    cost_usd: float | None = None  # at the configured prices; null: the model has no price


class UsageGroupOut(msgspec.Struct):
    """The filter's rows of one model at one request class, summed."""

    model: str
    request_class: str
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    total_tokens: int
    cost_usd: float | None  # null: the model has no price


class UsageTotalsOut(msgspec.Struct):
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    total_tokens: int
    # Null when nothing is priced or one of the groups' models has no price (see by_model_and_class).
    cost_usd: float | None = None
    by_model_and_class: list[UsageGroupOut] = msgspec.field(default_factory=list)


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


def parse_request_class(value: str | None) -> RequestClass | None:
    if value is None or value == "":
        return None
    try:
        return RequestClass(value)
    except ValueError:
        known = ", ".join(repr(c.value) for c in RequestClass)
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise invalid_request(
            f"request_class must be one of {known}, got {shown!r}.", param="request_class"
        ) from None


def row_out(r: UsageRecord, prices: Prices) -> UsageRow:
    return UsageRow(
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
        r.request_class.value,
        prices.cost_usd(r.model, r.request_class, r.prompt_tokens, r.output_tokens),
    )


def totals_out(totals: UsageTotals, prices: Prices) -> UsageTotalsOut:
    return UsageTotalsOut(
        totals.num_requests,
        totals.prompt_tokens,
        totals.output_tokens,
        totals.prompt_tokens + totals.output_tokens,
        cost_usd=total_cost_usd(prices, totals.groups),
        by_model_and_class=[group_out(g, prices) for g in totals.groups],
    )


def group_out(g: UsageGroup, prices: Prices) -> UsageGroupOut:
    return UsageGroupOut(
        g.model,
        g.request_class.value,
        g.num_requests,
        g.prompt_tokens,
        g.output_tokens,
        g.prompt_tokens + g.output_tokens,
        prices.cost_usd(g.model, g.request_class, g.prompt_tokens, g.output_tokens),
    )


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
        request_class: FromQuery[str | None] = None,
        limit: FromQuery[int] = 100,
    ) -> UsageResponse:
        if not 1 <= limit <= 1000:
            raise invalid_request("limit must be in [1, 1000].", param="limit")
        request_class_filter = parse_request_class(request_class)
        gw: GatewayState = request.app.state.gw
        tenant = tenant_of(request)
        if gw.meter.ledger_down:  # known down (the meter probes it every second): refused at once
            raise _ledger_unavailable(retry_after_s=1.0)
        try:
            report = await gw.ledger.query(
                tenant.tenant_id,
                since=parse_time(since, "since"),
                until=parse_time(until, "until"),
                model=model,
                idempotency_key=idempotency_key,
                request_class=request_class_filter,
                limit=limit,
            )
        except LedgerUnavailable as exc:
            log.debug("GET /v1/usage: %s", exc)  # the outage itself is logged once, by the meter
            raise _ledger_unavailable(retry_after_s=5.0) from None
        prices = gw.settings.pricing
        return UsageResponse(
            tenant_id=tenant.tenant_id,
            totals=totals_out(report.totals, prices),
            data=[row_out(r, prices) for r in report.rows],
        )


def _ledger_unavailable(retry_after_s: float) -> OpenAIError:
    return OpenAIError(
        503,
        "Usage cannot be read now: the usage ledger is unavailable. Retry later.",
        type="server_error",
        code="usage_ledger_unavailable",
        retry_after_s=retry_after_s,
    )
