"""Idempotency records in this process's memory: the single-gateway set-up (no Redis).

NOTE: no verb awaits, so on the event loop each runs to completion alone: that is the atomicity the Redis
store gets from its Lua scripts.

Bounded per tenant: at most ``max_records_per_tenant`` records each (one LRU per tenant, ordered by the
last write), so a flood of new keys from one tenant evicts only its own records. Expired records go first
(one expiry heap for all, so the purge costs O(log n) per record).
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sluice.stores.idempotency.base import (
    DEFAULT_MAX_RECORDS_PER_TENANT,
    AttemptState,
    Begin,
    BeginKind,
    IdempotencyStore,
    check_begin_args,
    check_complete_args,
    check_max_records,
    check_release_args,
    key_digest,
    record_ttl_s,
)


@dataclass(slots=True)
class _Record:
    fingerprint: str
    attempt: int
    state: AttemptState
    running_deadline_s: float
    output_tokens: int  # the released attempt's
    result: bytes | None  # completed only
    expires_at_s: float


_RecordKey = tuple[str, str]  # (tenant_id, sha256 of the key)


class InProcessIdempotencyStore(IdempotencyStore):
    def __init__(
        self,
        max_records_per_tenant: int = DEFAULT_MAX_RECORDS_PER_TENANT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_max_records(max_records_per_tenant)
        self._max_records_per_tenant = max_records_per_tenant
        self._clock = clock
        # tenant_id -> (sha256 of the key -> record), least recently written first.
        self._tenants: dict[str, OrderedDict[str, _Record]] = {}
        # (expires_at_s, record key); an entry is stale once its record's expires_at_s moved on.
        self._expiry_heap: list[tuple[float, _RecordKey]] = []
        self._num_records = 0

    @property
    def num_entries(self) -> int:
        return self._num_records

    def num_entries_of(self, tenant_id: str) -> int:
        return len(self._tenants.get(tenant_id, ()))

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def peek(self, tenant_id: str, key: str, fingerprint: str) -> Begin | None:
        now_s = self._clock()
        record = self._get((tenant_id, key_digest(key)), now_s)
        if record is None:
            return None
        return _existing(record, fingerprint, now_s)

    async def begin(self, tenant_id: str, key: str, fingerprint: str, running_ttl_s: float) -> Begin:
        check_begin_args(running_ttl_s)
        now_s = self._clock()
        self._purge_expired(now_s)
        rkey = (tenant_id, key_digest(key))
        record = self._get(rkey, now_s)
        attempt, superseded_tokens = 0, 0
        if record is not None:
            existing = _existing(record, fingerprint, now_s)
            if existing is not None:
                return existing
            attempt = record.attempt
            if record.state is AttemptState.RELEASED:
                superseded_tokens = record.output_tokens
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
        record = self._get(rkey, now_s)
        if record is None or record.attempt != attempt:
            return False
        if record.state is AttemptState.COMPLETED:
            return True  # completed twice: the first result stays
        if record.state is not AttemptState.RUNNING:
            return False  # released: a retry may be starting over already
        record.state = AttemptState.COMPLETED
        record.result = bytes(result)
        self._written(rkey, record, now_s + ttl_s)
        return True

    async def release(self, tenant_id: str, key: str, attempt: int, output_tokens: int) -> None:
        check_release_args(attempt, output_tokens)
        now_s = self._clock()
        rkey = (tenant_id, key_digest(key))
        record = self._get(rkey, now_s)
        if record is None or record.attempt != attempt or record.state is not AttemptState.RUNNING:
            return
        record.state = AttemptState.RELEASED
        record.output_tokens = output_tokens
        self._written(rkey, record, now_s + record_ttl_s(0.0))

    def _get(self, rkey: _RecordKey, now_s: float) -> _Record | None:
        """The unexpired record, else None (an expired one is dropped). Does not change its recency."""
        records = self._tenants.get(rkey[0])
        record = None if records is None else records.get(rkey[1])
        if record is not None and record.expires_at_s <= now_s:
            self._drop(rkey)
            return None
        return record

    def _put(self, rkey: _RecordKey, record: _Record) -> None:
        """Store ``record`` as the tenant's most recently written; past the tenant's bound its least
        recently written record goes (never another tenant's)."""
        records = self._tenants.setdefault(rkey[0], OrderedDict())
        if rkey[1] not in records:
            self._num_records += 1
        records[rkey[1]] = record
        records.move_to_end(rkey[1])
        while len(records) > self._max_records_per_tenant:
            records.popitem(last=False)
            self._num_records -= 1
        self._push_expiry(rkey, record.expires_at_s)

    def _written(self, rkey: _RecordKey, record: _Record, expires_at_s: float) -> None:
        record.expires_at_s = expires_at_s
        self._tenants[rkey[0]].move_to_end(rkey[1])
        self._push_expiry(rkey, expires_at_s)

    def _drop(self, rkey: _RecordKey) -> None:
        records = self._tenants[rkey[0]]
        del records[rkey[1]]
        self._num_records -= 1
        if not records:
            del self._tenants[rkey[0]]

    def _push_expiry(self, rkey: _RecordKey, expires_at_s: float) -> None:
        heapq.heappush(self._expiry_heap, (expires_at_s, rkey))
        # Stale entries (records re-timed or evicted) would grow the heap without bound: rebuild it from the
        # live records once they are the majority (amortised O(1) per push).
        if len(self._expiry_heap) > 2 * self._num_records + 64:
            self._expiry_heap = [
                (r.expires_at_s, (tenant_id, digest))
                for tenant_id, records in self._tenants.items()
                for digest, r in records.items()
            ]
            heapq.heapify(self._expiry_heap)

    def _purge_expired(self, now_s: float) -> None:
        while self._expiry_heap and self._expiry_heap[0][0] <= now_s:
            expires_at_s, rkey = heapq.heappop(self._expiry_heap)
            records = self._tenants.get(rkey[0])
            record = None if records is None else records.get(rkey[1])
            if record is not None and record.expires_at_s == expires_at_s:
                self._drop(rkey)


def _existing(record: _Record, fingerprint: str, now_s: float) -> Begin | None:
    """What ``begin`` answers for an unexpired record without starting an attempt; None if it would."""
    if record.fingerprint != fingerprint:
        return Begin(BeginKind.MISMATCH, record.attempt)
    if record.state is AttemptState.COMPLETED:
        return Begin(BeginKind.COMPLETED, record.attempt, result=record.result)
    if record.state is AttemptState.RUNNING and now_s < record.running_deadline_s:
        return Begin(BeginKind.IN_PROGRESS, record.attempt)
    return None
