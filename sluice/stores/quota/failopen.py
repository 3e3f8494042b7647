"""Quotas that survive a short Redis outage: for ``window_s`` after Redis stops answering, each gateway
enforces the limits alone from memory (a tenant may get up to one budget per gateway); after that, it refuses
requests (fail closed) until Redis answers again.

While Redis answers, every acquire goes to it. During an outage it is probed at most once per
``probe_interval_s`` (a Redis that hangs instead of refusing would otherwise add its timeout to every
request); the first success ends the outage and the next grants come from Redis again.

An outage is whatever the primary raises as ``QuotaStoreUnavailable``: unreachable, timed out, out of
memory, a read-only replica, loading or failing over. Any other error is a bug and propagates.

A primary acquire that failed may still have run (its reply was lost). The fallback then charges the
request, and its settle also settles the primary's grant for the same request id with 0 tokens used, so
the request is not counted twice once Redis answers (until then, the primary's lease expires by its TTL).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from sluice.domain import Tenant
from sluice.stores.quota.base import QuotaDenied, QuotaGrant, QuotaLimit, QuotaStore, QuotaStoreUnavailable
from sluice.stores.quota.inprocess import InProcessQuotaStore

log = logging.getLogger(__name__)

FALLBACK_SOURCE = "local-fallback"
# Requests whose primary acquire may have run unseen, kept until their settle; a request that never
# settles is forgotten oldest first (its primary lease expires by its TTL anyway).
MAX_UNSURE_REQUESTS = 10_000
# Every acquire probes the primary, so a refused client may come back as soon as Redis does.
STORE_UNAVAILABLE_RETRY_S = 1.0


class FailOpenQuotaStore(QuotaStore):
    def __init__(
        self,
        primary: QuotaStore,
        fallback: InProcessQuotaStore,
        window_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_fail_open: Callable[[], None] | None = None,
        probe_interval_s: float = 1.0,
    ) -> None:
        """``on_fail_open`` is called for each acquire the fallback answers (a metric's counter)."""
        self._primary = primary
        self._fallback = fallback
        self._window_s = window_s
        self._clock = clock
        self._on_fail_open = on_fail_open
        self._probe_interval_s = probe_interval_s
        self._last_probe_s = float("-inf")
        self._outage_since_s: float | None = None  # None: the primary is answering
        self._failed_closed = False  # logged once per outage
        # (tenant_id, request_id) of fallback grants whose primary acquire failed after it was sent.
        self._unsure: OrderedDict[tuple[str, str], bool] = OrderedDict()

    async def open(self) -> None:
        """Opens both; an unreachable primary starts an outage here instead of failing the start."""
        await self._fallback.open()
        try:
            await self._primary.open()
        except QuotaStoreUnavailable as exc:
            self._note_failure(exc)

    async def close(self) -> None:
        try:
            await self._primary.close()
        finally:
            await self._fallback.close()

    async def acquire(
        self, tenant: Tenant, tokens: int, lease_ttl_s: float, *, request_id: str
    ) -> QuotaGrant | QuotaDenied:
        if self._should_try_primary():
            try:
                decision = await self._primary.acquire(tenant, tokens, lease_ttl_s, request_id=request_id)
            except QuotaStoreUnavailable as exc:
                down_for_s = self._note_failure(exc)
                self._unsure[(tenant.tenant_id, request_id)] = True
                while len(self._unsure) > MAX_UNSURE_REQUESTS:
                    self._unsure.popitem(last=False)
            else:
                self._end_outage()
                return decision
        else:
            assert self._outage_since_s is not None
            down_for_s = self._clock() - self._outage_since_s
        if down_for_s >= self._window_s:
            return self._fail_closed(down_for_s)
        if self._on_fail_open is not None:
            self._on_fail_open()
        decision = await self._fallback.acquire(tenant, tokens, lease_ttl_s, request_id=request_id)
        if isinstance(decision, QuotaGrant):
            return dataclasses.replace(decision, source=FALLBACK_SOURCE)
        self._unsure.pop((tenant.tenant_id, request_id), None)  # the failed acquire's record expires alone
        return decision

    async def settle(self, grant: QuotaGrant, used_tokens: int) -> None:
        """Settles with the store that issued ``grant``. Never raises for an unreachable primary: the grant's
        lease then expires by its TTL, and its unused tokens come back by refill."""
        if grant.source != FALLBACK_SOURCE:
            await self._settle_primary(grant, used_tokens)
            return
        await self._fallback.settle(grant, used_tokens)
        if self._unsure.pop((grant.tenant_id, grant.request_id), False):
            # The fallback charged this request: release whatever the primary may hold for it.
            await self._settle_primary(grant, 0)

    async def _settle_primary(self, grant: QuotaGrant, used_tokens: int) -> None:
        if not self._should_try_primary():
            log.warning(
                "quota: grant of request %s not settled during the outage; its lease expires by its TTL",
                grant.request_id,
            )
            return
        try:
            await self._primary.settle(grant, used_tokens)
        except QuotaStoreUnavailable as exc:
            self._note_failure(exc)
            log.warning(
                "quota: could not settle the grant of request %s of tenant %r (%s); its lease expires by "
                "its TTL",
                grant.request_id,
                grant.tenant_id,
                exc,
            )
        else:
            self._end_outage()

    def _should_try_primary(self) -> bool:
        """Always while the primary answers; during an outage, once per probe interval."""
        if self._outage_since_s is None:
            return True
        now_s = self._clock()
        if now_s - self._last_probe_s >= self._probe_interval_s:
            self._last_probe_s = now_s
            return True
        return False

    def _note_failure(self, exc: BaseException) -> float:
        """Start the outage if this is its first failure; how long it has lasted."""
        now_s = self._clock()
        if self._outage_since_s is None:
            self._outage_since_s = self._last_probe_s = now_s
            log.warning(
                "quota store unavailable (%s): enforcing quotas per gateway for up to %g s",
                exc,
                self._window_s,
            )
        return now_s - self._outage_since_s

    def _fail_closed(self, down_for_s: float) -> QuotaDenied:
        if not self._failed_closed:
            self._failed_closed = True
            log.error("quota store unreachable for %.0f s: refusing requests until it is back", down_for_s)
        return QuotaDenied(
            QuotaLimit.STORE_UNAVAILABLE,
            STORE_UNAVAILABLE_RETRY_S,
            f"quota store unavailable for {down_for_s:,.0f} s, longer than the {self._window_s:g} s "
            "requests may be admitted without it",
        )

    def _end_outage(self) -> None:
        if self._outage_since_s is not None:
            log.warning("quota store reachable again after %.1f s", self._clock() - self._outage_since_s)
            self._outage_since_s = None
            self._failed_closed = False
