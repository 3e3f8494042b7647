"""Where each prefix key was last sent: the state behind ``placement``'s prefix affinity.

Bounded (least recently used entries go past ``max_entries``) and forgetful (an entry not refreshed for
``ttl_s`` is gone: by then the replica's prefix cache has most likely evicted those blocks). The policy
reads it through ``view(now_s)``, a read-only mapping; only its owner (one per scheduler: the gateway's
``ModelScheduler``, or a simulated fleet) records dispatches. No clock, no I/O: ``now_s`` comes in with
every call. Not thread-safe: one owner.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from types import MappingProxyType


class AffinityMemory:
    def __init__(self, ttl_s: float, max_entries: int = 10_000) -> None:
        if not ttl_s > 0 or max_entries < 1:
            raise ValueError("ttl_s must be > 0 and max_entries >= 1")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        # Both kept in order of last use (oldest first), so expiry and eviction pop from the front.
        self._replica_by_key: OrderedDict[int, str] = OrderedDict()
        self._used_s: OrderedDict[int, float] = OrderedDict()

    def record(self, prefix_key: int, replica_id: str, now_s: float) -> None:
        """A request with ``prefix_key`` was dispatched to ``replica_id`` at ``now_s``."""
        self._replica_by_key[prefix_key] = replica_id
        self._used_s[prefix_key] = now_s
        self._replica_by_key.move_to_end(prefix_key)
        self._used_s.move_to_end(prefix_key)
        while len(self._used_s) > self.max_entries:
            self._pop_oldest()

    def view(self, now_s: float) -> Mapping[int, str]:
        """Prefix key -> the replica it was last sent to, for entries used within ``ttl_s`` of ``now_s``.
        Read only; it follows later ``record`` calls (take a new view after time moves on)."""
        # Entries are in order of last use: the expired ones are all at the front.
        while self._used_s and now_s - next(iter(self._used_s.values())) >= self.ttl_s:
            self._pop_oldest()
        return MappingProxyType(self._replica_by_key)

    def __len__(self) -> int:
        return len(self._used_s)

    def _pop_oldest(self) -> None:
        key, _ = self._used_s.popitem(last=False)
        del self._replica_by_key[key]
