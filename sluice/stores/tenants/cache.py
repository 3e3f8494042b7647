"""A resolver in front of a ``TenantStore``: auth on every request without a query on every request, and
without a full outage when the store is down.

While the store answers, staleness is bounded: a result, found or not, is served for at most ``ttl_s``
after it was read (a "not found" for at most ``min(unknown_ttl_s, ttl_s)``), so a revoked key stops
resolving, and a new one starts, within ``ttl_s``.

When the store fails (``TenantStoreUnavailable``: down, unreachable, or slower than ``lookup_timeout_s``):
  - a key it resolved to a tenant at most ``stale_max_s`` ago keeps resolving to that tenant (the last good
    view; each such answer is counted by ``on_stale``);
  - any other key raises ``TenantStoreUnavailable`` with ``retry_after_s``: the store cannot say whether
    it is valid (the gateway answers 503, never 401, so a valid new key is not told it is wrong);
  - the store is asked at most once per ``probe_interval_s`` (a probe) instead of once per key, so a flood
    of keys during an outage costs nothing; the first success ends the outage. The outage is logged once
    when it starts and once when it ends, and reported through ``on_store_down(True/False)``.

Lookups are single-flight (concurrent requests with the same key share one store query) and at most
``max_concurrent_lookups`` run at once, so a flood of random keys queues here instead of exhausting the
store's connection pool. Known keys and unknown keys are kept in two LRU maps keyed by the key's hash (raw
keys are not kept in memory), so random keys can never evict a known tenant's last good view.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sluice.domain import Tenant
from sluice.outages import OutageLog
from sluice.stores.tenants.base import TenantStore, TenantStoreUnavailable, hash_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolverLimits:
    """How the resolver bounds staleness and load; the gateway fills it from settings."""

    ttl_s: float = 5.0  # a result is fresh this long after its read; 0: every request asks the store
    unknown_ttl_s: float = 1.0  # a "no such key" is fresh this long (never longer than ttl_s)
    stale_max_s: float = 600.0  # store down: a known key is served at most this long after its read
    probe_interval_s: float = 2.0  # store down: at most one store query per interval
    lookup_timeout_s: float = 2.0  # a store query slower than this counts as the store being down
    max_concurrent_lookups: int = 4  # store queries in flight at once
    max_entries: int = 10_000  # known keys kept (least recently used evicted first)
    max_unknown_entries: int = 10_000  # unknown keys kept

    def __post_init__(self) -> None:
        if min(self.ttl_s, self.unknown_ttl_s, self.stale_max_s) < 0:
            raise ValueError(f"ttl_s, unknown_ttl_s and stale_max_s must be >= 0: {self}")
        if self.probe_interval_s <= 0 or self.lookup_timeout_s <= 0:
            raise ValueError(f"probe_interval_s and lookup_timeout_s must be > 0: {self}")
        if min(self.max_concurrent_lookups, self.max_entries, self.max_unknown_entries) < 1:
            raise ValueError(f"max_concurrent_lookups and the entry bounds must be >= 1: {self}")


@dataclass(frozen=True)
class _Known:
    tenant: Tenant
    read_at_s: float  # stamped before the query: an entry never outlives its bounds from its read


# What a shared lookup task returns: the store's answer, or why there is none (a store failure is returned,
# not raised, so a task nobody awaits any more does not log "exception never retrieved").
_Answer = Tenant | None | TenantStoreUnavailable


class CachedTenantResolver:
    def __init__(
        self,
        store: TenantStore,
        limits: ResolverLimits,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_stale: Callable[[], None] | None = None,
        on_store_down: Callable[[bool], None] | None = None,
        on_lookup: Callable[[], None] | None = None,
    ) -> None:
        """``on_stale``: a known key served past ``ttl_s`` because the store failed; ``on_store_down``: the
        outage started (True) or ended (False); ``on_lookup``: one query sent to the store."""
        self._store = store
        self._limits = limits
        self._clock = clock
        self._on_stale = on_stale or (lambda: None)
        self._on_store_down = on_store_down or (lambda _down: None)
        self._on_lookup = on_lookup or (lambda: None)
        self._known: OrderedDict[str, _Known] = OrderedDict()  # key hash -> last good view
        self._unknown: OrderedDict[str, float] = OrderedDict()  # key hash -> read_at_s of "not found"
        self._in_flight: dict[str, asyncio.Task[_Answer]] = {}  # key hash -> its one store query
        self._lookups = asyncio.Semaphore(limits.max_concurrent_lookups)
        self._outage = OutageLog(log, "tenant store", clock=clock)
        self._next_probe_s = 0.0
        self._num_stale = 0  # during the current outage, for its recovery log line

    async def resolve(self, api_key: str) -> Tenant | None:
        """The tenant for this key; None if the store says it is unknown or revoked. Raises
        ``TenantStoreUnavailable`` (with ``retry_after_s``) if the store cannot answer and this key has no
        last good view within ``stale_max_s``."""
        digest = hash_key(api_key)
        now_s = self._clock()
        known = self._known.get(digest)
        if known is not None and now_s - known.read_at_s < self._limits.ttl_s:
            self._known.move_to_end(digest)
            return known.tenant
        unknown_at_s = self._unknown.get(digest)
        if unknown_at_s is not None and now_s - unknown_at_s < self._unknown_ttl_s:
            return None
        task = self._in_flight.get(digest)
        if task is None and (not self._outage.is_down or self._take_probe(now_s)):
            task = self._start_lookup(api_key, digest)
        # NOTE: during an outage a known key is answered now, even while a probe runs: only keys without a
        # last good view wait for one.
        if self._outage.is_down and (stale := self._stale_view(digest)) is not None:
            return stale
        if task is None:
            raise self._unavailable()
        # NOTE: shielded: a caller that goes away must not cancel the query others are waiting for.
        answer = await asyncio.shield(task)
        if isinstance(answer, TenantStoreUnavailable):
            if (stale := self._stale_view(digest)) is not None:
                return stale
            raise self._unavailable()
        return answer

    def invalidate(self, api_key: str | None = None) -> None:
        """Forget one key (after revoking it in this process), or everything."""
        if api_key is None:
            self._known.clear()
            self._unknown.clear()
        else:
            self._known.pop(hash_key(api_key), None)
            self._unknown.pop(hash_key(api_key), None)

    @property
    def num_entries(self) -> int:
        """Known and unknown keys held."""
        return len(self._known) + len(self._unknown)

    @property
    def store_down(self) -> bool:
        return self._outage.is_down

    @property
    def _unknown_ttl_s(self) -> float:
        return min(self._limits.unknown_ttl_s, self._limits.ttl_s)

    def _start_lookup(self, api_key: str, digest: str) -> asyncio.Task[_Answer]:
        task = asyncio.create_task(self._lookup(api_key, digest, probe=self._outage.is_down))
        self._in_flight[digest] = task
        task.add_done_callback(lambda _task: self._in_flight.pop(digest, None))
        return task

    async def _lookup(self, api_key: str, digest: str, *, probe: bool) -> _Answer:
        """One store query for this key (the shared task's body); records what it learns."""
        async with self._lookups:
            if self._outage.is_down and not probe:
                # The outage began while this lookup waited for a slot: only probes go to the store.
                return TenantStoreUnavailable("the tenant store is down")
            read_at_s = self._clock()
            try:
                self._on_lookup()
                async with asyncio.timeout(self._limits.lookup_timeout_s):
                    tenant = await self._store.resolve(api_key)
            except TimeoutError:
                failure = TenantStoreUnavailable(f"no answer within {self._limits.lookup_timeout_s:g} s")
                self._note_down(failure)
                return failure
            except TenantStoreUnavailable as exc:
                self._note_down(exc)
                return exc
        self._note_up()
        self._remember(digest, tenant, read_at_s)
        return tenant

    def _remember(self, digest: str, tenant: Tenant | None, read_at_s: float) -> None:
        if tenant is None:
            self._known.pop(digest, None)
            self._unknown[digest] = read_at_s
            self._unknown.move_to_end(digest)
            while len(self._unknown) > self._limits.max_unknown_entries:
                self._unknown.popitem(last=False)
            return
        self._unknown.pop(digest, None)
        self._known[digest] = _Known(tenant, read_at_s)
        self._known.move_to_end(digest)
        while len(self._known) > self._limits.max_entries:
            self._known.popitem(last=False)

    def _stale_view(self, digest: str) -> Tenant | None:
        """The last good view of a known key if it is at most ``stale_max_s`` old (counted), else None."""
        known = self._known.get(digest)
        if known is None or self._clock() - known.read_at_s > self._limits.stale_max_s:
            return None
        self._known.move_to_end(digest)
        self._num_stale += 1
        self._on_stale()
        return known.tenant

    def _unavailable(self) -> TenantStoreUnavailable:
        return TenantStoreUnavailable(
            "the tenant store is unavailable and this API key was not seen recently enough to be "
            "trusted without it",
            retry_after_s=max(1.0, self._next_probe_s - self._clock()),
        )

    def _take_probe(self, now_s: float) -> bool:
        """During an outage: True (and the next one an interval later) if a probe is due."""
        if now_s < self._next_probe_s:
            return False
        self._next_probe_s = now_s + self._limits.probe_interval_s
        return True

    def _note_down(self, exc: BaseException) -> None:
        self._next_probe_s = self._clock() + self._limits.probe_interval_s
        meanwhile = (
            f"serving keys seen in the last {self._limits.stale_max_s:g} s from the cache, refusing others "
            f"with 503; probing every {self._limits.probe_interval_s:g} s"
        )
        if self._outage.down(exc, meanwhile):
            self._num_stale = 0
            self._on_store_down(True)

    def _note_up(self) -> None:
        if self._outage.up(f"{self._num_stale} requests served from stale entries") is not None:
            self._on_store_down(False)
