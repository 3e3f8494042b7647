"""A tenant's quota at admission: reserve prompt + max_tokens and a concurrency lease, or refuse with the
limit that was hit (each with its own error code, so a client can tell its own budget from a full
service)."""

from __future__ import annotations

import time

from gateway.errors import OpenAIError, refused
from gateway.metrics import GatewayMetrics
from sluice.domain import Tenant
from sluice.quota.base import QuotaDenied, QuotaGrant, QuotaLimit, QuotaStore

# How long past its deadline a lease outlives a request whose gateway died without releasing it.
LEASE_GRACE_S = 5.0

_REFUSALS: dict[QuotaLimit, tuple[int, str, str]] = {
    QuotaLimit.TOKENS_PER_MINUTE: (429, "tokens_per_minute_exceeded", "tokens"),
    QuotaLimit.CONCURRENT_REQUESTS: (429, "concurrent_requests_exceeded", "requests"),
    # Retrying cannot help: the request is bigger than the tenant's whole budget.
    QuotaLimit.REQUEST_TOO_LARGE: (400, "request_exceeds_token_budget", "invalid_request_error"),
    QuotaLimit.STORE_UNAVAILABLE: (503, "quota_store_unavailable", "server_error"),
}


async def acquire_quota(
    quota: QuotaStore,
    metrics: GatewayMetrics,
    model: str,
    tenant: Tenant,
    num_tokens: int,
    deadline_s: float,
    *,
    request_id: str,
) -> QuotaGrant:
    """The request's grant (at most one per ``request_id``: a repeat takes nothing more), or the refusal
    raised as its OpenAI error."""
    lease_ttl_s = max(1.0, deadline_s - time.monotonic()) + LEASE_GRACE_S
    result = await quota.acquire(tenant, num_tokens, lease_ttl_s, request_id=request_id)
    if isinstance(result, QuotaGrant):
        return result
    raise quota_error(result, metrics, model)


def quota_error(denied: QuotaDenied, metrics: GatewayMetrics, model: str) -> OpenAIError:
    status_code, code, error_type = _REFUSALS[denied.limit]
    metrics.count_refused(model, code)
    retry_after_s = None if denied.limit is QuotaLimit.REQUEST_TOO_LARGE else denied.retry_after_s
    message = denied.message[:1].upper() + denied.message[1:]
    if retry_after_s is not None:
        message += f". Retry after {retry_after_s:.1f} s."
    else:
        message += ": lower max_tokens or shorten the prompt."
    return refused(status_code, code, message, retry_after_s, error_type)
