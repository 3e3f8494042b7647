"""The quota store's one interface; every backend passes the same contract tests (tests/core/test_quota.py).

A request asks for a grant before any engine work: one concurrency lease (if the tenant has a cap) and a
reservation of its worst-case tokens (prompt + max output) from the tenant's per-minute token bucket. Its
one ``finally`` settles the grant with the tokens it really used, which refunds the rest and frees the lease.

Both verbs are keyed by the request's id, so neither is ever applied twice for one request: an acquire
repeated while its grant is unsettled (a client library's retry after a lost reply, a re-sent script)
returns that grant again and takes nothing more (its ``remaining_tokens`` as at the first acquire: the
record of that decision, not a fresh read); a settle repeated does nothing. After its settle, the
same id acquires anew (a later attempt of a request with an Idempotency-Key is billed, so it is also counted).

A store that cannot answer now (unreachable, too slow, out of memory, a read-only replica, failing over)
raises ``QuotaStoreUnavailable``; every other error is a bug.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import StrEnum

from sluice.domain import Tenant

# A request's tokens can never exceed its tenant's per-minute budget; come back in a minute is the honest
# answer to a client that retries anyway.
REQUEST_TOO_LARGE_RETRY_S = 60.0
# NOTE: a full tenant waits for the soonest lease to expire at the latest, but leases are normally released
# by settle long before they expire (the TTL only covers a gateway that died), so advise at most 1 s.
MAX_CONCURRENCY_RETRY_S = 1.0
MIN_RETRY_S = 0.001  # retry_after_s is always > 0
# How long past its lease's expiry a grant can still be settled (and refunded).
GRANT_GRACE_S = 60.0


MAX_REQUEST_ID_CHARS = 200


class QuotaStoreUnavailable(Exception):
    """The store cannot answer now; the request may or may not have been applied (a reply lost after the
    store ran it), which the request id makes harmless: a later settle with it releases what was taken."""


class QuotaLimit(StrEnum):
    """Which limit refused a request."""

    TOKENS_PER_MINUTE = "tokens_per_minute"  # the tenant's token budget is spent for now
    CONCURRENT_REQUESTS = "concurrent_requests"  # the tenant has max_concurrent_requests in flight
    REQUEST_TOO_LARGE = "request_too_large"  # tokens > tokens_per_minute: can never fit
    STORE_UNAVAILABLE = "store_unavailable"  # Redis down past the fail-open window


@dataclass(frozen=True)
class QuotaGrant:
    tenant_id: str
    request_id: str  # the request it was acquired for; identifies the lease and the reservation
    reserved_tokens: int  # taken from the bucket; 0 when the tenant has no token budget
    has_lease: bool  # False when the tenant has no concurrency cap
    source: str  # "redis" | "inprocess" | "local-fallback"
    # What the tenant's bucket held right after this reservation, in whole tokens (>= 0); None when the
    # tenant has no token budget. Read in the acquire itself, so reporting it costs no store round trip.
    remaining_tokens: int | None

    @property
    def holds_nothing(self) -> bool:
        """An unlimited tenant's grant: settling it has nothing to return or release."""
        return self.reserved_tokens == 0 and not self.has_lease


@dataclass(frozen=True)
class QuotaDenied:
    limit: QuotaLimit
    retry_after_s: float  # > 0
    message: str  # which limit, with the numbers
    # TOKENS_PER_MINUTE only: what the bucket held when it refused, in whole tokens (>= 0); else None.
    remaining_tokens: int | None = None


class QuotaStore(ABC):
    @abstractmethod
    async def open(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def acquire(
        self, tenant: Tenant, tokens: int, lease_ttl_s: float, *, request_id: str
    ) -> QuotaGrant | QuotaDenied:
        """Atomically: check the concurrency cap and the token bucket, and only if BOTH allow, take a lease
        (expiring after ``lease_ttl_s``, so a dead gateway's leases free themselves) and reserve ``tokens``.
        A denial changes nothing. Checked in this order: too large, concurrency, tokens.

        At most once per ``request_id``: while the tenant holds an unsettled grant for it, the same grant is
        returned and nothing more is taken.

        ``tokens`` >= 1 (a request has at least one prompt token), else ``ValueError``.
        """

    @abstractmethod
    async def settle(self, grant: QuotaGrant, used_tokens: int) -> None:
        """Return ``reserved - used`` tokens to the bucket (never above capacity; ``used > reserved`` takes
        the extra from the bucket, which may go negative = debt) and release the lease.

        Idempotent: a second call for the same request does nothing (the caller's ``finally`` may run
        twice on retries). A grant settled after its record expired (lease TTL + ``GRANT_GRACE_S``) also
        does nothing: its lease expired already, and its refund is lost (the safe direction).
        """


def check_acquire_args(tokens: int, lease_ttl_s: float, request_id: str) -> None:
    if not request_id or len(request_id) > MAX_REQUEST_ID_CHARS or not request_id.isprintable():
        raise ValueError(
            f"request_id must be 1-{MAX_REQUEST_ID_CHARS} printable characters, got {request_id!r}"
        )
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    if not lease_ttl_s > 0:
        raise ValueError(f"lease_ttl_s must be > 0, got {lease_ttl_s}")


def check_used_tokens(used_tokens: int) -> None:
    if used_tokens < 0:
        raise ValueError(f"used_tokens must be >= 0, got {used_tokens}")


def too_large(tenant: Tenant, tokens: int) -> QuotaDenied | None:
    """The denial for a request that can never fit its tenant's budget, else None."""
    capacity = tenant.tokens_per_minute
    if capacity is None or tokens <= capacity:
        return None
    return QuotaDenied(
        QuotaLimit.REQUEST_TOO_LARGE,
        REQUEST_TOO_LARGE_RETRY_S,
        f"request too large for tenant {tenant.tenant_id!r}: {tokens:,} tokens requested, more than its "
        f"whole budget of {capacity:,} tokens per minute",
    )


def concurrency_denied(tenant: Tenant, num_in_flight: int, soonest_expiry_in_s: float) -> QuotaDenied:
    retry_after_s = min(MAX_CONCURRENCY_RETRY_S, max(MIN_RETRY_S, soonest_expiry_in_s))
    return QuotaDenied(
        QuotaLimit.CONCURRENT_REQUESTS,
        retry_after_s,
        f"concurrency limit for tenant {tenant.tenant_id!r}: {num_in_flight:,} requests in flight, "
        f"at most {tenant.max_concurrent_requests:,} allowed",
    )


def whole_tokens(level_tokens: float) -> int:
    """A bucket's level as a client is told it: whole tokens, and 0 for a bucket in debt."""
    return max(0, math.floor(level_tokens))


def tokens_denied(tenant: Tenant, tokens: int, level_tokens: float, retry_after_s: float) -> QuotaDenied:
    available = whole_tokens(level_tokens)
    return QuotaDenied(
        QuotaLimit.TOKENS_PER_MINUTE,
        max(MIN_RETRY_S, retry_after_s),
        f"token budget for tenant {tenant.tenant_id!r} spent for now: {tokens:,} tokens requested, "
        f"{available:,} available of {tenant.tokens_per_minute or 0:,} per minute",
        remaining_tokens=available,
    )
