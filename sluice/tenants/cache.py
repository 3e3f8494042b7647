"""A resolver in front of a ``TenantStore``: auth on every request without a query on every request.

Staleness is bounded: a result, found or not, is served for at most ``ttl_s`` after it was read, so a
revoked key stops resolving, and a new one starts, within ``ttl_s``. The cache is keyed by the key's hash
(raw keys are not kept in memory) and holds at most ``max_entries`` (least recently used evicted first),
so a flood of random keys cannot grow it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from sluice.domain import Tenant
from sluice.tenants.base import TenantStore, hash_key


class CachedTenantResolver:
    def __init__(
        self,
        store: TenantStore,
        ttl_s: float,
        *,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s < 0 or max_entries < 1:
            raise ValueError(f"need ttl_s >= 0 and max_entries >= 1, got {ttl_s}, {max_entries}")
        self._store = store
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._clock = clock
        # key hash -> (expires at, tenant or None)
        self._entries: OrderedDict[str, tuple[float, Tenant | None]] = OrderedDict()

    async def resolve(self, api_key: str) -> Tenant | None:
        """The tenant for this key, as the store said at most ``ttl_s`` ago; None if unknown or revoked."""
        if self._ttl_s == 0:
            return await self._store.resolve(api_key)
        digest = hash_key(api_key)
        now = self._clock()
        hit = self._entries.get(digest)
        if hit is not None and hit[0] > now:
            self._entries.move_to_end(digest)
            return hit[1]
        tenant = await self._store.resolve(api_key)
        # NOTE: stamped with the time before the lookup, so an entry never outlives ttl_s from its read.
        self._entries[digest] = (now + self._ttl_s, tenant)
        self._entries.move_to_end(digest)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)
        return tenant

    def invalidate(self, api_key: str | None = None) -> None:
        """Forget one key (after revoking it in this process), or everything."""
        if api_key is None:
            self._entries.clear()
        else:
            self._entries.pop(hash_key(api_key), None)

    @property
    def num_entries(self) -> int:
        return len(self._entries)
