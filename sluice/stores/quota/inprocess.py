"""Quotas in this process's memory: the single-gateway set-up, the fallback while Redis is unreachable, and
the fleet simulator's store (it calls ``acquire_now`` / ``settle_now`` with simulated time).

NOTE: ``acquire_now`` and ``settle_now`` never await, so on the event loop each runs to completion alone:
that is the atomicity the Redis store gets from its Lua scripts.
"""

from __future__ import annotations

import heapq
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sluice.domain import Tenant
from sluice.stores.quota.base import (
    GRANT_GRACE_S,
    MAX_CONCURRENCY_RETRY_S,
    QuotaDenied,
    QuotaGrant,
    QuotaStore,
    check_acquire_args,
    check_used_tokens,
    concurrency_denied,
    tokens_denied,
    too_large,
    whole_tokens,
)
from sluice.stores.quota.bucket import BucketState, full, give_back, rate_tokens_per_s, try_take

SOURCE = "inprocess"


@dataclass(frozen=True)
class _GrantRecord:
    """What settle needs; the tenant's budget as it was at acquire."""

    tenant_id: str
    reserved_tokens: int
    has_lease: bool
    capacity_tokens: int | None  # None: no token budget
    remaining_tokens: int | None  # what the grant reported: a repeat acquire reports it again
    forget_at_s: float  # lease expiry + GRANT_GRACE_S, as the Redis grant key's TTL


class InProcessQuotaStore(QuotaStore):
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, BucketState] = {}  # by tenant_id; absent = full
        self._leases: dict[str, dict[str, float]] = {}  # tenant_id -> request_id -> expires_at_s
        self._grants: dict[tuple[str, str], _GrantRecord] = {}  # unsettled, by (tenant_id, request_id)
        # (forget_at_s, (tenant_id, request_id)): bounds _grants
        self._forget_heap: list[tuple[float, tuple[str, str]]] = []

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def acquire(
        self, tenant: Tenant, tokens: int, lease_ttl_s: float, *, request_id: str
    ) -> QuotaGrant | QuotaDenied:
        return self.acquire_now(tenant, tokens, lease_ttl_s, self._clock(), request_id=request_id)

    async def settle(self, grant: QuotaGrant, used_tokens: int) -> None:
        self.settle_now(grant, used_tokens, self._clock())

    def acquire_now(
        self, tenant: Tenant, tokens: int, lease_ttl_s: float, now_s: float, *, request_id: str | None = None
    ) -> QuotaGrant | QuotaDenied:
        """``acquire`` at ``now_s`` (the store's clock is not read). ``request_id`` None: a new one (the
        fleet simulator's requests are never retried)."""
        request_id = uuid.uuid4().hex if request_id is None else request_id
        check_acquire_args(tokens, lease_ttl_s, request_id)
        self._forget_old_grants(now_s)
        if (denied := too_large(tenant, tokens)) is not None:
            return denied
        tenant_id = tenant.tenant_id
        held = self._grants.get((tenant_id, request_id))
        if held is not None:  # a repeat: the grant it already holds, nothing more taken
            return QuotaGrant(
                tenant_id, request_id, held.reserved_tokens, held.has_lease, SOURCE, held.remaining_tokens
            )
        cap = tenant.max_concurrent_requests
        leases = self._live_leases(tenant_id, now_s)
        if cap is not None and len(leases) >= cap:
            soonest_s = min(leases.values(), default=now_s + MAX_CONCURRENCY_RETRY_S)
            return concurrency_denied(tenant, len(leases), soonest_s - now_s)
        capacity = tenant.tokens_per_minute
        remaining_tokens = None
        if capacity is not None:
            state = self._buckets.get(tenant_id) or full(capacity, now_s)
            rate = rate_tokens_per_s(capacity)
            take = try_take(state.level_tokens, state.last_s, now_s, capacity, rate, tokens)
            if not take.granted:
                return tokens_denied(tenant, tokens, take.state.level_tokens, take.retry_after_s)
            self._buckets[tenant_id] = take.state
            remaining_tokens = whole_tokens(take.state.level_tokens)
        grant = QuotaGrant(
            tenant_id=tenant_id,
            request_id=request_id,
            reserved_tokens=tokens if capacity is not None else 0,
            has_lease=cap is not None,
            source=SOURCE,
            remaining_tokens=remaining_tokens,
        )
        if grant.has_lease:
            leases[request_id] = now_s + lease_ttl_s
            self._leases[tenant_id] = leases
        if not grant.holds_nothing:
            forget_at_s = now_s + lease_ttl_s + GRANT_GRACE_S
            record = _GrantRecord(
                tenant_id, grant.reserved_tokens, grant.has_lease, capacity, remaining_tokens, forget_at_s
            )
            self._grants[(tenant_id, request_id)] = record
            heapq.heappush(self._forget_heap, (forget_at_s, (tenant_id, request_id)))
        return grant

    def settle_now(self, grant: QuotaGrant, used_tokens: int, now_s: float) -> None:
        """``settle`` at ``now_s`` (the store's clock is not read)."""
        check_used_tokens(used_tokens)
        self._forget_old_grants(now_s)
        record = self._grants.pop((grant.tenant_id, grant.request_id), None)
        if record is None:
            return  # settled already, forgotten, or an unlimited tenant's grant
        leases = self._leases.get(record.tenant_id)
        if leases is not None:
            leases.pop(grant.request_id, None)
            if not leases:
                del self._leases[record.tenant_id]
        capacity = record.capacity_tokens
        if capacity is not None:
            state = self._buckets.get(record.tenant_id) or full(capacity, now_s)
            rate = rate_tokens_per_s(capacity)
            refund_tokens = record.reserved_tokens - used_tokens
            self._buckets[record.tenant_id] = give_back(
                state.level_tokens, state.last_s, now_s, capacity, rate, refund_tokens
            )

    def _live_leases(self, tenant_id: str, now_s: float) -> dict[str, float]:
        """The tenant's unexpired leases (expired ones dropped): request_id -> expires_at_s."""
        leases = self._leases.get(tenant_id)
        if leases is None:
            return {}
        live = {request_id: at_s for request_id, at_s in leases.items() if at_s > now_s}
        if not live:
            del self._leases[tenant_id]
        elif len(live) != len(leases):
            self._leases[tenant_id] = live
        return live

    def _forget_old_grants(self, now_s: float) -> None:
        """Drop grants never settled (their caller died) once the Redis store's grant key would expire."""
        while self._forget_heap and self._forget_heap[0][0] <= now_s:
            forget_at_s, key = heapq.heappop(self._forget_heap)
            record = self._grants.get(key)
            # NOTE: the id may have been settled and acquired again since: forget only this acquire's record.
            if record is not None and record.forget_at_s == forget_at_s:
                del self._grants[key]
