"""A tenant's quota at admission: reserve prompt + max_tokens and a concurrency lease, or refuse with the
limit that was hit (each with its own error code, so a client can tell its own budget from a full
service)."""

from __future__ import annotations

import math
import time
from typing import Any

from gateway.errors import OpenAIError, refused
from gateway.metrics import GatewayMetrics
from sluice.domain import Tenant
from sluice.stores.quota.base import QuotaDenied, QuotaGrant, QuotaLimit, QuotaStore
from sluice.stores.quota.bucket import rate_tokens_per_s, seconds_until_full

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
    raise quota_error(result, metrics, model, tenant)


def quota_error(denied: QuotaDenied, metrics: GatewayMetrics, model: str, tenant: Tenant) -> OpenAIError:
    status_code, code, error_type = _REFUSALS[denied.limit]
    metrics.count_refused(model, code)
    retry_after_s = None if denied.limit is QuotaLimit.REQUEST_TOO_LARGE else denied.retry_after_s
    message = denied.message[:1].upper() + denied.message[1:]
    if retry_after_s is not None:
        message += f". Retry after {retry_after_s:.1f} s."
    else:
        message += ": lower max_tokens or shorten the prompt."
    headers = rate_limit_headers(tenant, denied.remaining_tokens)
    if not headers:
        return refused(status_code, code, message, retry_after_s, error_type)
    return _TokensRefused(
        headers, status_code, message, type=error_type, code=code, retry_after_s=retry_after_s
    )


def rate_limit_headers(tenant: Tenant, remaining_tokens: int | None) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*-tokens`` headers for a tenant's token bucket holding ``remaining_tokens``;
    none for a tenant without a token budget (or a figure the quota decision did not read). Sluice has no
    requests-per-minute limit, so there are no ``x-ratelimit-*-requests`` headers."""
    capacity_tokens = tenant.tokens_per_minute
    if capacity_tokens is None or remaining_tokens is None:
        return {}
    reset_s = seconds_until_full(remaining_tokens, capacity_tokens, rate_tokens_per_s(capacity_tokens))
    return {
        "x-ratelimit-limit-tokens": str(capacity_tokens),
        "x-ratelimit-remaining-tokens": str(remaining_tokens),
        "x-ratelimit-reset-tokens": openai_duration(reset_s),
    }


def openai_duration(seconds: float) -> str:
    """A duration as OpenAI's headers write it (Go's ``time.Duration``): "0s", "250ms", "1.5s", "6m0s",
    "1h0m0s". Rounded UP to the millisecond, so a client that waits that long finds what it was told."""
    # NOTE: rounded to the nanosecond first, so 1.2 s (1200.0000000000002 ms) does not become 1.201s.
    total_ms = max(0, math.ceil(round(seconds * 1000, 6)))
    if total_ms < 1000:
        return f"{total_ms}ms" if total_ms else "0s"
    hours, rest_ms = divmod(total_ms, 3_600_000)
    minutes, rest_ms = divmod(rest_ms, 60_000)
    whole_s, frac_ms = divmod(rest_ms, 1000)
    text = f"{whole_s}.{frac_ms:03d}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    if minutes:
        return f"{minutes}m{text}"
    return text


class _TokensRefused(OpenAIError):
    """A token-budget refusal that also says what the bucket held (``rate_limit_headers``)."""

    def __init__(
        self, rate_limit_headers: dict[str, str], status_code: int, message: str, **kwargs: Any
    ) -> None:
        super().__init__(status_code, message, **kwargs)
        self.rate_limit_headers = rate_limit_headers

    def headers(self) -> dict[str, str]:
        return {**super().headers(), **self.rate_limit_headers}
