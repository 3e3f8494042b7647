"""Idempotency records in this process's memory: the single-gateway set-up (no Redis).

NOTE: no verb awaits, so on the event loop each runs to completion alone: that is the atomicity the Redis
store gets from its Lua scripts.

Bounded: at most ``max_entries`` records. Expired records go first (an expiry heap, so the purge costs
O(log n) per record); past the bound the least recently used record is evicted, so a flood of new keys
cannot exhaust memory. NOTE: an evicted record is forgotten early: a retry of its key is NEW (at worst
one duplicate generation), the price of the bound.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sluice.idempotency.base import (
    AttemptState,
    Begin,
    BeginKind,
    IdempotencyStore,
    check_begin_args,
    check_complete_args,
    check_release_args,
    key_digest,
    record_ttl_s,
)

DEFAULT_MAX_ENTRIES = 100_000


@dataclass(slots=True)
class _Record:
    fingerprint: str
    attempt: int
    state: AttemptState
    running_deadline_s: float
    output_tokens: int  # the released attempt's
    result: bytes | None  # completed only
    expires_at_s: float


class InProcessIdempotencyStore(IdempotencyStore):
    def __init__(
        self, max_entries: int = DEFAULT_MAX_ENTRIES, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._max_entries = max_entries
        self._clock = clock
        # (tenant_id, sha256 of the key) -> record, least recently used first.
        self._records: OrderedDict[tuple[str, str], _Record] = OrderedDict()
        # (expires_at_s, record key); an entry is stale once its record's expires_at_s moved on.
        self._expiry_heap: list[tuple[float, tuple[str, str]]] = []

    @property
    def num_entries(self) -> int:
        return len(self._records)

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def begin(self, tenant_id: str, key: str, fingerprint: str, running_ttl_s: float) -> Begin:
        check_begin_args(running_ttl_s)
        now_s = self._clock()
        self._purge_expired(now_s)
        rkey = (tenant_id, key_digest(key))
        record = self._records.get(rkey)
        attempt, superseded_tokens = 0, 0
        if record is not None:
            self._records.move_to_end(rkey)
            attempt = record.attempt
            if record.fingerprint != fingerprint:
                return Begin(BeginKind.MISMATCH, attempt)
            if record.state is AttemptState.COMPLETED:
                return Begin(BeginKind.COMPLETED, attempt, result=record.result)
            if record.state is AttemptState.RUNNING and now_s < record.running_deadline_s:
                return Begin(BeginKind.IN_PROGRESS, attempt)
            if record.state is AttemptState.RELEASED:
                superseded_tokens = record.output_tokens
        elif len(self._records) >= self._max_entries:
            self._records.popitem(last=False)  # full of live records: the least recently used goes
        attempt += 1
        self._put(
            rkey,
            _Record(
                fingerprint=fingerprint,
                attempt=attempt,
                state=AttemptState.RUNNING,
                running_deadline_s=now_s + running_ttl_s,
                output_tokens=0,
                result=None,
                expires_at_s=now_s + record_ttl_s(running_ttl_s),
            ),
        )
        return Begin(BeginKind.NEW, attempt, superseded_output_tokens=superseded_tokens)

    async def complete(self, tenant_id: str, key: str, attempt: int, result: bytes, ttl_s: float) -> bool:
        check_complete_args(attempt, ttl_s)
        now_s = self._clock()
        rkey = (tenant_id, key_digest(key))
        record = self._live(rkey, now_s)
        if record is None or record.attempt != attempt:
            return False
        if record.state is AttemptState.COMPLETED:
            return True  # completed twice: the first result stays
        if record.state is not AttemptState.RUNNING:
            return False  # released: a retry may be starting over already
        record.state = AttemptState.COMPLETED
        record.result = bytes(result)
        self._set_expiry(rkey, record, now_s + ttl_s)
        return True

    async def release(self, tenant_id: str, key: str, attempt: int, output_tokens: int) -> None:
        check_release_args(attempt, output_tokens)
        now_s = self._clock()
        rkey = (tenant_id, key_digest(key))
        record = self._live(rkey, now_s)
        if record is None or record.attempt != attempt or record.state is not AttemptState.RUNNING:
            return
        record.state = AttemptState.RELEASED
        record.output_tokens = output_tokens
        self._set_expiry(rkey, record, now_s + record_ttl_s(0.0))

    def _live(self, rkey: tuple[str, str], now_s: float) -> _Record | None:
        """The unexpired record (marked recently used), else None (an expired one is dropped)."""
        record = self._records.get(rkey)
        if record is None:
            return None
        if record.expires_at_s <= now_s:
            del self._records[rkey]
            return None
        self._records.move_to_end(rkey)
        return record

    def _put(self, rkey: tuple[str, str], record: _Record) -> None:
        self._records[rkey] = record
        self._records.move_to_end(rkey)
        self._push_expiry(rkey, record.expires_at_s)

    def _set_expiry(self, rkey: tuple[str, str], record: _Record, expires_at_s: float) -> None:
        record.expires_at_s = expires_at_s
        self._push_expiry(rkey, expires_at_s)

    def _push_expiry(self, rkey: tuple[str, str], expires_at_s: float) -> None:
        heapq.heappush(self._expiry_heap, (expires_at_s, rkey))
        # Stale entries (records re-timed or evicted) would grow the heap without bound: rebuild it from the
        # live records once they are the majority (amortised O(1) per push).
        if len(self._expiry_heap) > 2 * len(self._records) + 64:
            self._expiry_heap = [(r.expires_at_s, k) for k, r in self._records.items()]
            heapq.heapify(self._expiry_heap)

    def _purge_expired(self, now_s: float) -> None:
        while self._expiry_heap and self._expiry_heap[0][0] <= now_s:
            expires_at_s, rkey = heapq.heappop(self._expiry_heap)
            record = self._records.get(rkey)
            if record is not None and record.expires_at_s == expires_at_s:
                del self._records[rkey]
