"""``GET /admin/v1/usage`` (viewer): every tenant's usage and cost over a window, for operators; a tenant
reads only its own through the gateway's ``GET /v1/usage``.

One line per (tenant, model, request class) that has rows finished in ``since <= finished_at < until``:
requests, errors (``sluice.stores.ledger.base.ERROR_OUTCOMES``), prompt and output tokens, and the cost in USD
at the configured prices (``SLUICE_PRICES``, batch-class tokens at ``SLUICE_BATCH_DISCOUNT`` off;
sluice/pricing.py), null where the model has no price. ``since`` / ``until`` take an ISO 8601 time, unix
seconds or a duration ago (``24h``, ``7d``; sluice/stores/ledger/window.py); the default is the last 24 h.
``tenant``, ``model`` and ``request_class`` keep only the matching rows. A value that does not parse, an
empty window or an unknown class is a 400 naming the parameter; the ledger down is a 503 with
``Retry-After``.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import Controller, Request, get
from litestar.params import FromQuery

from control_plane.service.auth import SECURITY_SCHEME, needs, require_admin
from control_plane.service.errors import AdminError, error_responses
from control_plane.service.state import state_of
from sluice.domain import RequestClass
from sluice.pricing import Prices, total_cost_usd
from sluice.stores.admin_tokens.roles import Role
from sluice.stores.ledger.base import LedgerUnavailable, TenantUsage
from sluice.stores.ledger.window import WindowError, report_window

log = logging.getLogger("sluice.control_plane")

LEDGER_RETRY_AFTER_S = 5.0  # as the gateway's /v1/usage: the ledger's pool retries in the background


class TenantUsageOut(msgspec.Struct):
    """One tenant's rows of one model at one request class, summed."""

    tenant_id: str
    model: str
    request_class: str
    num_requests: int
    num_errors: int
    prompt_tokens: int
    output_tokens: int
    total_tokens: int
    cost_usd: float | None  # null: the model has no price


class UsageReportTotals(msgspec.Struct):
    num_requests: int
    num_errors: int
    prompt_tokens: int
    output_tokens: int
    total_tokens: int
    # Null when nothing is priced or one of the lines' models has no price (a total that left some rows
    # out would read as the whole bill).
    cost_usd: float | None


class UsageReportOut(msgspec.Struct):
    since: datetime  # the window, resolved: since <= finished_at < until
    until: datetime
    tenant: str | None  # the filters as given (null: every one)
    model: str | None
    request_class: str | None
    totals: UsageReportTotals
    data: list[TenantUsageOut]  # sorted by tenant, model, class
    object: str = "usage_report"


def line_out(u: TenantUsage, prices: Prices) -> TenantUsageOut:
    return TenantUsageOut(
        tenant_id=u.tenant_id,
        model=u.model,
        request_class=u.request_class.value,
        num_requests=u.num_requests,
        num_errors=u.num_errors,
        prompt_tokens=u.prompt_tokens,
        output_tokens=u.output_tokens,
        total_tokens=u.prompt_tokens + u.output_tokens,
        cost_usd=prices.cost_usd(u.model, u.request_class, u.prompt_tokens, u.output_tokens),
    )


def totals_out(lines: list[TenantUsage], prices: Prices) -> UsageReportTotals:
    prompt_tokens = sum(u.prompt_tokens for u in lines)
    output_tokens = sum(u.output_tokens for u in lines)
    return UsageReportTotals(
        num_requests=sum(u.num_requests for u in lines),
        num_errors=sum(u.num_errors for u in lines),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        total_tokens=prompt_tokens + output_tokens,
        cost_usd=total_cost_usd(prices, (u.group for u in lines)),
    )


def _request_class(value: str | None) -> RequestClass | None:
    if not value:
        return None
    try:
        return RequestClass(value)
    except ValueError:
        known = ", ".join(repr(c.value) for c in RequestClass)
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise AdminError(
            400, f"request_class must be one of {known}, got {shown!r}.", param="request_class"
        ) from None


class UsageReportController(Controller):
    path = "/admin/v1/usage"
    tags = ["Usage"]  # noqa: RUF012 (Litestar reads these class attributes)
    guards = [require_admin]  # noqa: RUF012
    security = [{SECURITY_SCHEME: []}]  # noqa: RUF012

    @get("/", opt=needs(Role.VIEWER), responses=error_responses(400, 401, 403, 503))
    async def report(
        self,
        request: Request[Any, Any, Any],
        since: FromQuery[str | None] = None,
        until: FromQuery[str | None] = None,
        tenant: FromQuery[str | None] = None,
        model: FromQuery[str | None] = None,
        request_class: FromQuery[str | None] = None,
    ) -> UsageReportOut:
        """Every tenant's requests, errors, tokens and cost per model and request class over a window
        (default: the last 24 h)."""
        try:
            start, end = report_window(since, until, now=datetime.now(UTC))
        except WindowError as exc:
            raise AdminError(400, f"{exc}.", param=exc.param) from None
        class_filter = _request_class(request_class)
        cp = state_of(request)
        try:
            lines = await cp.rollouts.ledger.usage_by_tenant(
                since=start,
                until=end,
                tenant_id=tenant or None,
                model=model or None,
                request_class=class_filter,
            )
        except LedgerUnavailable as exc:
            log.warning("GET /admin/v1/usage: %s", exc)
            raise AdminError(
                503,
                "Usage cannot be read now: the usage ledger is unavailable. Retry later.",
                type="server_error",
                code="usage_ledger_unavailable",
                retry_after_s=LEDGER_RETRY_AFTER_S,
            ) from None
        prices = cp.settings.pricing
        return UsageReportOut(
            since=start,
            until=end,
            tenant=tenant or None,
            model=model or None,
            request_class=None if class_filter is None else class_filter.value,
            totals=totals_out(lines, prices),
            data=[line_out(u, prices) for u in lines],
        )
